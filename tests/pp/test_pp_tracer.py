"""The tracer frontend: pipeline(), Pipe.build_stage(), build_stage(), pipe_split() and SplitPoint.

torch's tracer splits the model; each piece becomes a ``swpipeline.pp.PipelineStage``. A
model cut into 4 pieces whose later pieces also use earlier pieces' values (skips 0 -> 2 and
1 -> 3, found in the split graph) runs under ScheduleInterleaved1F1B and ScheduleLoopedBFS on
2 gloo ranks; a model cut into 2 by ``split_spec`` under Schedule1F1B. The gradients equal
the one-process model's, bit for bit.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest
import torch
from torch import nn

from dist_harness import run_on_ranks
from test_pp_support import loss_fn, make_batch

WIDTH, N = 8, 4


class Skipping(nn.Module):
    """Four linear layers; the third also takes the first's output, the fourth the second's."""

    def __init__(self, split: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c, self.d = (nn.Linear(WIDTH, WIDTH) for _ in range(4))
        self.split = split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from swpipeline.pp import pipe_split

        x0 = torch.relu(self.a(x))
        if self.split:
            pipe_split()
        x1 = torch.relu(self.b(x0))
        if self.split:
            pipe_split()
        x2 = torch.relu(self.c(x1)) + x0
        if self.split:
            pipe_split()
        return self.d(x2) + x1


def reference(model: nn.Module) -> Dict[str, torch.Tensor]:
    x, y = make_batch(1, width=WIDTH)
    for xm, ym in zip(torch.tensor_split(x, N), torch.tensor_split(y, N)):
        loss_fn(model(xm), ym).backward()
    return {name: p.grad / N for name, p in model.named_parameters()}


CONFIGS = [("ScheduleInterleaved1F1B", False), ("ScheduleLoopedBFS", False), ("Schedule1F1B", True)]


def traced_on_rank(rank: int, world: int) -> List[Dict[str, Any]]:
    """Each configuration of ``CONFIGS`` (schedule, cut by ``split_spec`` rather than ``pipe_split``) in turn."""
    import swpipeline.pp as pp

    out = []
    for schedule, spec in CONFIGS:
        model = Skipping(split=not spec)
        x, y = make_batch(1, width=WIDTH)
        split_spec = {"b": pp.SplitPoint.BEGINNING} if spec else None
        pipe = pp.pipeline(model, (torch.tensor_split(x, N)[0],), split_spec=split_spec)
        mine = list(range(rank, pipe.num_stages, world))
        if rank == 0:
            stages = [pipe.build_stage(s, torch.device("cpu")) for s in mine]
        else:  # the module-level builder, from the piece and the pipe's info
            stages = [pp.build_stage(pipe.get_stage_module(s), s, pipe.info(), torch.device("cpu")) for s in mine]
        sched = getattr(pp, schedule)(stages[0] if schedule == "Schedule1F1B" else stages, N, loss_fn=loss_fn)
        last = pipe.num_stages - 1 in mine
        sched.step(*((x,) if rank == 0 else ()), **({"target": y} if last else {}))
        out.append({"types": [type(s).__name__ for s in stages], "skips": sorted(stages[0].skips),
                    "grads": {name: p.grad.clone() for s in stages for name, p in s.submod.named_parameters()}})
    return out


@pytest.fixture(scope="module")
def traced() -> List[List[Dict[str, Any]]]:
    """Per configuration, per rank."""
    per_rank = run_on_ranks(traced_on_rank, 2, 180)
    return [[per_rank[r][k] for r in range(2)] for k in range(len(CONFIGS))]


@pytest.mark.parametrize("k", [0, 1], ids=[CONFIGS[0][0], CONFIGS[1][0]])
def test_a_traced_model_with_skips_trains_exactly(traced: List[List[Dict[str, Any]]], k: int) -> None:
    results, want = traced[k], reference(Skipping(split=False))
    assert [r["types"] for r in results] == [["PipelineStage", "PipelineStage"]] * 2
    assert [r["skips"] for r in results] == [[(0, 2), (1, 3)]] * 2
    got = {name: g for r in results for name, g in r["grads"].items()}
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[name], want[name]) for name in want), CONFIGS[k]


def test_a_model_split_by_split_spec_trains_exactly(traced: List[List[Dict[str, Any]]]) -> None:
    results, want = traced[2], reference(Skipping(split=False))
    assert [r["skips"] for r in results] == [[], []]
    got = {name: g for r in results for name, g in r["grads"].items()}
    assert sorted(got) == sorted(want) and all(torch.equal(got[name], want[name]) for name in want)


def test_an_output_from_an_earlier_piece_is_refused_naming_it() -> None:
    import swpipeline.pp as pp

    class Early(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

        def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
            h = self.a(x)
            pp.pipe_split()
            return self.b(h), h

    pipe = pp.pipeline(Early(), (torch.zeros(2, WIDTH),))
    with pytest.raises(ValueError, match="the model's output .* comes from piece 0 of 2, not from the last one"):
        pp.tracer.wiring(pipe.info().graph, 1)
