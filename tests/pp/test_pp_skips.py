"""Beyond torch.distributed.pipelining: skip connections between stages that are not neighbours.

A stage may send its output to any later stage, declared as ``skips=[(from, to)]``; the later
stage's forward then takes the previous stage's output and, after it, each skip source's, in
stage order. The messages, the proof and the gradients follow: the gradient of an output that
went to two stages is the sum of both, as autograd sums it in one process, so the result is
still bit for bit the one-process model's. On 2 gloo ranks with 4 stages: a skip to a stage on
the other rank (0 -> 3) and one to a stage on the same rank (0 -> 2, handed over in memory).
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Sequence, Tuple

import pytest
import torch
from torch import nn

from dist_harness import run_on_ranks
from swpipeline.pp import check, comms, orders, units
from test_pp_support import loss_fn, make_batch

WIDTH = 16


class Join(nn.Module):
    """A stage that adds what it receives (its predecessor's output, then each skip source's) and runs a block."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU())

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        total = inputs[0]
        for extra in inputs[1:]:
            total = total + extra
        return self.block(total)


def _stages(seed: int = 0) -> List[Join]:
    torch.manual_seed(seed)
    return [Join() for _ in range(4)]


def _reference(stages: Sequence[Join], skips: Sequence[Tuple[int, int]], x: torch.Tensor, y: torch.Tensor,
               n: int) -> List[List[torch.Tensor]]:
    """One process: each microbatch through the four stages with the skips, loss backpropagated, summed, / n."""
    stages = copy.deepcopy(list(stages))
    for xm, ym in zip(torch.tensor_split(x, n), torch.tensor_split(y, n)):
        outputs: List[torch.Tensor] = []
        for s, stage in enumerate(stages):
            inputs = [xm] if s == 0 else [outputs[s - 1]] + [outputs[a] for a, b in sorted(skips) if b == s]
            outputs.append(stage(*inputs))
        loss_fn(outputs[-1], ym).backward()
    return [[p.grad / n for p in stage.parameters()] for stage in stages]


def skips_on_rank(rank: int, world: int, configs: List[Tuple[str, List[Tuple[int, int]], int]]) -> List[bool]:
    import swpipeline.pp as pp

    x, y = make_batch(rows=16, width=WIDTH)
    exact = []
    for name, skips, n in configs:
        modules = _stages()
        want = _reference(modules, skips, x, y, n)
        mine = [s for s in range(4) if s % world == rank]
        stages = [pp.PipelineStage(modules[s], s, 4, torch.device("cpu")) for s in mine]
        schedule = getattr(pp, name)(stages, n, loss_fn=loss_fn, skips=skips)
        kwargs: Dict[str, Any] = {"target": y} if 3 in mine else {}
        schedule.step(*((x,) if 0 in mine else ()), **kwargs)
        exact.append(all(torch.equal(p.grad, g) for s in mine for p, g in zip(modules[s].parameters(), want[s])))
    return exact


def test_skip_connections_are_exact_on_two_ranks() -> None:
    configs = [("ScheduleInterleaved1F1B", [(0, 3)], 4), ("ScheduleInterleavedZeroBubble", [(0, 3)], 3),
               ("ScheduleInterleaved1F1B", [(0, 2), (1, 3)], 2), ("ScheduleInterleaved1F1B", [(0, 2), (0, 3)], 5)]
    results = run_on_ranks(skips_on_rank, 2, timeout=120, configs=configs)
    assert results == [[True] * len(configs)] * 2


def test_a_skip_is_a_message_of_its_own_in_the_proof() -> None:
    work = comms.derive(orders.interleaved(2, 2, 1), 2, 4, 1, True, skips=[(0, 3)])
    sent = [m.send_name for m in work.ranks[0].sends[1]]
    assert sent == ["0SEND_F0", "0SEND_F0@3", "2SEND_F0", "2SEND_B0"]
    # in the order rank 1 makes them: 1F0's output, then 3B0's two gradients (to stage 0 first), then 1B0's
    assert [m.recv_name for m in work.ranks[0].recvs[1]] == ["2RECV_F0", "0RECV_B0@3", "2RECV_B0", "0RECV_B0"]
    check.prove({r: units.units_of_rank(work, r) for r in range(2)})


def test_a_skip_that_is_not_a_skip_is_refused() -> None:
    from swpipeline.pp.schedules import _check_skips

    with pytest.raises(ValueError, match=r"skip \(1, 2\) must go from a stage to a later one at least two stages on"):
        _check_skips("ScheduleInterleaved1F1B", [(1, 2)], [])
