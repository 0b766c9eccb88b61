"""Checkpointing in swpipeline.gpipe: which micro-batches are recomputed, and randomness that recomputes exactly.

Partitions run on several threads and torch's default generator is shared, so each
cell (partition k on micro-batch m) draws from its own generator, seeded from one
draw per forward pass and the cell's place. These tests pin the consequences: with
Dropout every checkpoint mode gives the un-checkpointed output and gradients bit
for bit, whatever the thread timing, and a forward pass draws from the default
generator once if any cell draws, and not at all otherwise.
"""

from __future__ import annotations

import copy
import random
import time
from typing import List, Tuple

import pytest
import torch
from torch import Tensor, nn

from swpipeline.gpipe import GPipe, is_checkpointing, is_recomputing

MODES = ["always", "except_last", "never"]


class Probe(nn.Module):
    """The identity, noting for every call whether it checkpoints or recomputes, and the first input value."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: List[Tuple[bool, bool, float]] = []

    def forward(self, x: Tensor) -> Tensor:
        self.calls.append((is_checkpointing(), is_recomputing(), float(x[0, 0])))
        return x


class Jitter(nn.Module):
    """The identity after a random pause of up to 2 ms (Python's generator, not torch's)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.pauses = random.Random(seed)

    def forward(self, x: Tensor) -> Tensor:
        time.sleep(self.pauses.random() * 0.002)
        return x


def dropout_model(jitter_seed: int = 0) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.5), nn.ReLU(), Jitter(jitter_seed),
                         nn.Linear(32, 32), nn.Dropout(0.3), nn.Linear(32, 4))


def train_step(model: nn.Module, x: Tensor, seed: int) -> Tuple[Tensor, List[Tensor]]:
    torch.manual_seed(seed)
    output = model(x)
    output.pow(2).sum().backward()
    return output.detach(), [p.grad for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("checkpoint", ["always", "except_last"])
def test_recomputation_reproduces_dropout_masks(checkpoint: str) -> None:
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    reference = train_step(GPipe(dropout_model(), [4, 3], devices=["cpu"] * 2, chunks=4, checkpoint="never"), x, 7)
    checkpointed = train_step(GPipe(dropout_model(1), [4, 3], devices=["cpu"] * 2, chunks=4,
                                    checkpoint=checkpoint), x, 7)
    assert torch.equal(checkpointed[0], reference[0])
    assert len(checkpointed[1]) == len(reference[1]) == 6
    for mine, expected in zip(checkpointed[1], reference[1]):
        assert torch.equal(mine, expected)


def test_masks_are_drawn_and_reproducible_whatever_the_thread_timing() -> None:
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(2))
    outputs = []
    for jitter_seed in (3, 4):  # different pauses, hence different thread interleavings
        model = GPipe(dropout_model(jitter_seed), [2, 2, 3], devices=["cpu"] * 3, chunks=8, checkpoint="always")
        torch.manual_seed(11)
        first, second = model(x).detach(), model(x).detach()
        assert not torch.equal(first, second)  # a second pass draws new masks
        model.eval()
        assert not torch.equal(first, model(x))  # dropout was applied in training mode
        outputs.append(first)
    assert torch.equal(outputs[0], outputs[1])


def test_a_pass_draws_once_from_the_default_generator_and_only_if_a_cell_draws() -> None:
    x = torch.randn(8, 8)
    drawing = GPipe(dropout_model(), [4, 3], devices=["cpu"] * 2, chunks=4)
    torch.manual_seed(5)
    drawing(x)
    after_pass = torch.rand(3)
    torch.manual_seed(5)
    torch.randint(0, 2**62, ())
    assert torch.equal(after_pass, torch.rand(3))

    deterministic = GPipe(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)), [2, 1], devices=["cpu"] * 2,
                          chunks=4)
    torch.manual_seed(5)
    deterministic(x)
    after_pass = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after_pass, torch.rand(3))


@pytest.mark.parametrize("checkpoint", MODES)
def test_which_micro_batches_are_checkpointed_and_recomputed(checkpoint: str) -> None:
    probe = Probe()
    model = GPipe(nn.Sequential(probe, nn.Linear(8, 8), nn.Linear(8, 2)), [2, 1], devices=["cpu"] * 2, chunks=4,
                  checkpoint=checkpoint)
    x = torch.arange(32.0).reshape(4, 8)  # micro-batch m starts with 8 * m
    model(x).sum().backward()
    stop = {"always": 4, "except_last": 3, "never": 0}[checkpoint]
    forward = [(m < stop, False, 8.0 * m) for m in range(4)]
    recompute = [(False, True, 8.0 * m) for m in reversed(range(stop))]  # the backward's order: last first
    assert probe.calls == forward + recompute


def test_nothing_is_checkpointed_in_eval_mode_or_without_grad() -> None:
    probe = Probe()
    model = GPipe(nn.Sequential(probe, nn.Linear(8, 2)), [1, 1], devices=["cpu"] * 2, chunks=2, checkpoint="always")
    x = torch.arange(32.0).reshape(4, 8)
    with torch.no_grad():
        model(x)
    model.eval()
    model(x).sum().backward()
    assert probe.calls == [(False, False, 0.0), (False, False, 16.0)] * 2


def test_an_in_place_first_layer_works_without_checkpointing() -> None:
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 4))
    model = GPipe(copy.deepcopy(plain), [1, 2], devices=["cpu"] * 2, chunks=2, checkpoint="never")
    x = torch.randn(4, 8)
    plain(x).sum().backward()
    model(x).sum().backward()
    for mine, expected in zip(model.parameters(), plain.parameters()):
        assert mine.grad is not None and expected.grad is not None
        torch.testing.assert_close(mine.grad, expected.grad)


def test_in_place_changes_to_a_checkpointed_input_are_refused() -> None:
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 4))
    in_place = GPipe(copy.deepcopy(plain), [1, 2], devices=["cpu"] * 2, chunks=2, checkpoint="always")
    x = torch.randn(4, 8)
    output = in_place(x)  # the forward runs (its output is right), as torchgpipe's does
    torch.testing.assert_close(output, plain(x))
    with pytest.raises(RuntimeError, match=r"a leaf Variable that requires grad is being used in an in-place "
                                           r"operation: input 0 of partition 1 \(micro-batch 1\) was modified in "
                                           r"place during its checkpointed forward") as caught:
        output.sum().backward()
    assert getattr(caught.value, "swp_task") == "Recompute1"

    model = GPipe(nn.Sequential(nn.Linear(8, 16), nn.ReLU()), [1, 1], devices=["cpu"] * 2, chunks=2,
                  checkpoint="always")
    x = torch.randn(4, 8, requires_grad=True)
    output = model(x)
    with torch.no_grad():
        x.mul_(2)
    with pytest.raises(RuntimeError, match="modified in place between its forward and its backward"):
        output.sum().backward()
