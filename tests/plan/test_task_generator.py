"""task_generator: a task's own random generator per iteration, seeded by a stable hash, whatever runs first.

The plans that use it against a shared generator, on both engines, are in
test_shared_state.py; here, the helper itself: the seed is a fixed function of
``(seed, name, iteration)`` in every process, each call starts the same numbers, and
arguments are checked.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from swpipeline import IterContext, task_generator


def numbers(ctx: IterContext, name: str, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 1 << 30, (4,), generator=task_generator(ctx, name, seed))


def test_the_seed_is_a_stable_hash_of_seed_name_and_iteration() -> None:
    # fixed values: a change here changes every user's numbers, so it must be deliberate
    assert task_generator(IterContext(None, 3), "get_batch", seed=7).initial_seed() == 2392645553278789030
    assert task_generator(IterContext(None, 0), "get_batch").initial_seed() == 1685646610516461205
    script = ("from swpipeline import IterContext, task_generator; "
              "print(task_generator(IterContext(None, 3), 'get_batch', seed=7).initial_seed())")
    for hash_seed in ("1", "2"):  # Python's own hash() differs between these two processes; the seed must not
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed})
        assert out.stdout.strip() == "2392645553278789030"


def test_each_call_starts_the_same_numbers_and_any_change_of_input_changes_them() -> None:
    ctx = IterContext(None, 5)
    assert torch.equal(numbers(ctx, "prep"), numbers(ctx, "prep"))
    assert torch.equal(numbers(ctx, "prep"), numbers(IterContext("another batch", 5), "prep"))
    for other in (numbers(IterContext(None, 6), "prep"), numbers(ctx, "other"), numbers(ctx, "prep", seed=1)):
        assert not torch.equal(other, numbers(ctx, "prep"))


def test_it_leaves_the_default_generator_alone() -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    numbers(IterContext(None, 0), "prep")
    assert torch.equal(torch.rand(3), expected)


def test_the_device_is_torchs_default_unless_given() -> None:
    ctx = IterContext(None, 0)
    assert task_generator(ctx, "prep").device == torch.get_default_device()
    assert task_generator(ctx, "prep", device="cpu").device == torch.device("cpu")


def test_arguments_are_checked() -> None:
    ctx = IterContext(None, 0)
    with pytest.raises(TypeError, match="task_generator: ctx must be the task's IterContext, got int"):
        task_generator(3, "prep")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="task_generator: name must be a string \\(the task's name\\), got int 1"):
        task_generator(ctx, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="task_generator: seed must be an int, got bool True"):
        task_generator(ctx, "prep", seed=True)
    with pytest.raises(ValueError, match="task_generator: device 'nowhere' is not a torch device; pass the device"):
        task_generator(ctx, "prep", device="nowhere")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA: there, no CUDA generator can be made")
def test_a_device_this_machine_lacks_is_a_value_error_that_names_it() -> None:
    ctx = IterContext(None, 0)
    with pytest.raises(ValueError) as info:
        task_generator(ctx, "prep", device="cuda")
    assert str(info.value) == ("task_generator: no random generator on device 'cuda': this machine has no CUDA device "
                               "(torch.cuda.is_available() is False); pass the device the task draws on, one this "
                               "machine has (e.g. 'cpu')")
    assert info.value.__cause__ is None and info.value.__suppress_context__  # not torch's linker text
    with pytest.raises(ValueError, match="^task_generator: no random generator on device 'meta': "):
        task_generator(ctx, "prep", device="meta")
