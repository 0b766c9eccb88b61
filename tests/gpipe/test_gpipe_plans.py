"""swpipeline.gpipe as plans on the engine: the schedule (printed and as run), thread groups, and refusals.

GPipe's clock: partition k works on micro-batch m in clock cycle m + k. The forward
plan puts partition k at stage k, so the clock-driven engine runs Forward{k} on
micro-batch m in period m + k; the traced run must show exactly that, each
partition on its own thread group and streams. The backward plan runs the
micro-batches in reverse (iteration r is micro-batch chunks-1-r) with partition k at
stage n-1-k, and a checkpointed cell's recomputation one stage earlier.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Callable, List, Type

import pytest
import torch
from torch import Tensor, nn

import swpipeline.gpipe
from swpipeline.gpipe import GPipe

EXPECTED_SCHEDULE = """\
forward: Forward{k} works on micro-batch m in period m + k
#  Task              Thread     Stream       | P0    P1    P2    P3
-- ----------------- ---------- ------------ + ----- ----- ----- -----
0  Copy1             partition1 copy1        | --    m0    m1    m2
1  Forward1          partition1 compute1     | --    m0    m1    m2
2  Forward0          partition0 compute0     | m0    m1    m2    --

backward: Backward{k} works on micro-batch m in period (2 - m) + (1 - k)
#  Task              Thread     Stream       | P0    P1    P2    P3
-- ----------------- ---------- ------------ + ----- ----- ----- -----
0  CopyGrad0         partition0 copy0        | --    m2    m1    m0
1  Backward0         partition0 compute0     | --    m2    m1    m0
2  Recompute1        partition1 compute1     | m2    m1    m0    --
3  Backward1         partition1 compute1     | m2    m1    m0    --
4  Recompute0        partition0 compute0     | m2    m1    m0    --"""


def model(layers: int = 4) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(6, 6) for _ in range(layers)])


def test_print_schedule() -> None:
    gpipe = GPipe(model(2), [1, 1], devices=["cpu"] * 2, chunks=3)
    assert gpipe.format_schedule() == EXPECTED_SCHEDULE
    assert gpipe.format_schedule(1).splitlines()[3] == "0  Copy1             partition1 copy1        | --    m0"


def test_the_run_follows_gpipes_clock() -> None:
    chunks, n = 4, 3
    gpipe = GPipe(model(3), [1, 1, 1], devices=["cpu"] * n, chunks=chunks, checkpoint="always")
    forward, backward = gpipe.forward_pipeline, gpipe.backward_pipeline
    with forward.tracing(), backward.tracing():
        gpipe(torch.randn(8, 6)).sum().backward()
    assert forward.timeline is not None and backward.timeline is not None
    for k in range(n):
        cells = [(r.iteration, r.period, r.thread_group, r.stream) for r in forward.timeline.for_task(f"Forward{k}")]
        assert cells == [(m, m + k, f"partition{k}", f"compute{k}") for m in range(chunks)]
        if k > 0:
            copies = [(r.iteration, r.period, r.stream) for r in forward.timeline.for_task(f"Copy{k}")]
            assert copies == [(m, m + k, f"copy{k}") for m in range(chunks)]
        back = [(r.iteration, r.period, r.thread_group) for r in backward.timeline.for_task(f"Backward{k}")]
        assert back == [(i, i + n - 1 - k, f"partition{k}") for i in range(chunks)]
        again = [(r.iteration, r.period) for r in backward.timeline.for_task(f"Recompute{k}")]
        assert again == [(i, i + max(n - 2 - k, 0)) for i in range(chunks)]


def test_each_partition_computes_on_its_own_thread() -> None:
    seen: List[List[str]] = [[], []]

    class Where(nn.Module):
        def __init__(self, k: int) -> None:
            super().__init__()
            self.k = k

        def forward(self, x: Tensor) -> Tensor:
            seen[self.k].append(threading.current_thread().name)
            return x

    gpipe = GPipe(nn.Sequential(Where(0), nn.Linear(6, 6), Where(1)), [2, 1], devices=["cpu"] * 2, chunks=2)
    gpipe(torch.randn(4, 6))
    assert seen[0] == ["swp-partition0"] * 2
    assert len(set(seen[1])) == 1 and seen[1][0] != "swp-partition0"  # the last partition: the caller's thread


class Listy(nn.Module):
    def forward(self, x: Tensor) -> Any:
        return [x]


class Boom(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        raise ValueError("boom")


def test_a_partitions_error_names_its_task_and_micro_batch() -> None:
    gpipe = GPipe(nn.Sequential(nn.Linear(6, 6), Boom()), [1, 1], devices=["cpu"] * 2, chunks=2)
    with pytest.raises(ValueError, match="boom") as caught:
        gpipe(torch.randn(4, 6))
    assert (getattr(caught.value, "swp_task"), getattr(caught.value, "swp_iter")) == ("Forward1", 0)
    assert "swpipeline.gpipe: in partition 1, micro-batch 0" in caught.value.__notes__
    listy = GPipe(nn.Sequential(nn.Linear(6, 6), Listy(), nn.Linear(6, 6)), [2, 1], devices=["cpu"] * 2)
    with pytest.raises(TypeError, match=r"partition 0 \(micro-batch 0\) returned: expected a tensor or a tuple of "
                                        r"tensors, got list"):
        listy(torch.randn(4, 6))


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        raise ArithmeticError("no gradient today")


class FailsInBackward(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return _FailingBackward.apply(x)


def test_an_error_in_backward_names_the_partition_and_micro_batch() -> None:
    gpipe = GPipe(nn.Sequential(nn.Linear(6, 6), FailsInBackward(), nn.Linear(6, 6)), [2, 1], devices=["cpu"] * 2,
                  chunks=4)
    output = gpipe(torch.randn(8, 6))
    with pytest.raises(ArithmeticError, match="no gradient today") as caught:
        output.sum().backward()
    assert getattr(caught.value, "swp_task") == "Backward0"
    assert "swpipeline.gpipe: in partition 0, micro-batch 3" in caught.value.__notes__


def _tied() -> nn.Sequential:
    first, second = nn.Linear(6, 6), nn.Linear(6, 6)
    second.weight = first.weight
    return nn.Sequential(first, second)


def _twice() -> nn.Sequential:
    layer = nn.Linear(6, 6)
    return nn.Sequential(layer, layer)


class _Named:
    """An object whose str() is its name (str-like, as torchgpipe takes a checkpoint mode)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return self.name


REFUSED: List[Any] = [
    (lambda: GPipe(nn.Linear(6, 6), [1]), TypeError, "module must be an nn.Sequential"),
    (lambda: GPipe(_twice(), [1, 1]), ValueError, "a layer appears twice"),
    (lambda: GPipe(_tied(), [1, 1]), ValueError, "two layers share a parameter"),
    (lambda: GPipe(model(), None), ValueError, r"balance is required: .* e.g. balance=\[2, 2\]"),
    (lambda: GPipe(model(), "22"), TypeError, "balance must be a list of ints"),
    (lambda: GPipe(model(), [2, 1.5]), TypeError, r"balance must hold ints .*\[2, 1.5\]"),
    (lambda: GPipe(model(), [4, 0]), ValueError, r"balance=\[4, 0\]: every partition needs at least one layer"),
    (lambda: GPipe(model(), [2, 3]), ValueError, r"balance=\[2, 3\] sums to 5 but the module has 4 layers"),
    (lambda: GPipe(model(), [2, 2], chunks=0), ValueError, "chunks=0: .* use chunks >= 1"),
    (lambda: GPipe(model(), [2, 2], chunks="4"), TypeError, "chunks must be an int .* str '4'"),
    (lambda: GPipe(model(), [2, 2], checkpoint="sometimes"), ValueError, "checkpoint='sometimes' is not a checkpoint"),
    (lambda: GPipe(model(), [2, 2], checkpoint=True), TypeError, "checkpoint must be a str"),
    (lambda: GPipe(model(), [2, 2], checkpoint=_Named("sometimes")), ValueError,
     "checkpoint='sometimes' is not a checkpoint mode"),
    (lambda: GPipe(model(), [2, 2], devices=["cpu"]), ValueError, "holds 1 device.* for 2 partitions"),
    (lambda: GPipe(model(), [2, 2], devices="cpu"), TypeError, "devices must be a list of devices"),
    (lambda: GPipe(model(), [2, 2], devices=["cpu", 1.5]), TypeError, "each entry must be a torch.device"),
    (lambda: GPipe(model(), [2, 2], devices=["cpu", "nonsense"]), ValueError, "'nonsense' is not a device"),
]
if not torch.accelerator.is_available():
    REFUSED.append((lambda: GPipe(model(), [2, 2], devices=["cpu", "cuda:0"]), ValueError,
                    "'cuda:0' requested but this machine's accelerator is absent"))


@pytest.mark.parametrize("build, error, message", REFUSED)
def test_constructor_refusals(build: Callable[[], Any], error: Type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        build()


@pytest.mark.parametrize("checkpoint", [None, 1, True, b"always", ["always"], object()],
                         ids=["None", "int", "bool", "bytes", "list", "object"])
def test_a_checkpoint_that_is_not_a_string_is_a_type_error(checkpoint: object) -> None:
    with pytest.raises(TypeError) as refused:
        GPipe(model(), [2, 2], checkpoint=checkpoint)  # type: ignore[arg-type]
    assert str(refused.value) == (
        f"checkpoint must be a str (or an object whose str() is one), one of 'always', 'except_last', 'never'; "
        f"got {type(checkpoint).__name__} {checkpoint!r}")


@pytest.mark.parametrize("checkpoint", ["never", _Named("always")], ids=["str", "str-like"])
def test_a_checkpoint_is_kept_as_a_plain_str(checkpoint: object) -> None:
    gpipe = GPipe(model(), [2, 2], checkpoint=checkpoint)  # type: ignore[arg-type]
    assert gpipe.checkpoint == str(checkpoint) and type(gpipe.checkpoint) is str


def test_forward_refusals() -> None:
    gpipe = GPipe(model(2), [1, 1], devices=["cpu"] * 2, chunks=2)
    with pytest.raises(TypeError, match="GPipe input: expected a tensor or a tuple of tensors, got list"):
        gpipe([torch.randn(4, 6)])
    with pytest.raises(ValueError, match="input\\[0\\] is a 0-dim tensor"):
        gpipe(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"input tensors have different batch sizes \[4, 1\] \(dimension 0\)"):
        gpipe((torch.randn(4, 6), torch.randn(1, 6)))
    with pytest.raises(ValueError, match="chunks=0"):
        gpipe.format_schedule(0)


def test_exported_names() -> None:
    assert swpipeline.gpipe.__all__ == ["GPipe", "is_checkpointing", "is_recomputing"]
    for module in ("autograd", "cells", "checkpoint", "gpipe", "microbatch", "partition", "plans", "randomness",
                   "schedule_table", "streams"):
        assert importlib.import_module(f"swpipeline.gpipe.{module}").__all__ == []
