"""swpipeline.pp under client code: an optimizer that updates in place after every step, a
``torch.compile``d stage, batches from a DataLoader with a worker process; several steps of
training equal, bit for bit, the same modules trained in one process on the same microbatches.

The one-process loop is what a user would write before splitting the model: every microbatch
through the stages in order, its loss backpropagated, the gradients divided by the number of
microbatches, ``Adam.step()``. Each rank runs the same optimizer over its own stages'
parameters (Adam updates each parameter on its own, so splitting it by rank changes no bit).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch
from torch import nn

from dist_harness import run_on_ranks
from test_pp_support import loss_fn, make_batch, make_model, stage_module

STEPS = 3
N_MICRO = 4


class Batches(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Step k's (input, target): the batches both the ranks and the one-process loop train on."""

    def __len__(self) -> int:
        return STEPS

    def __getitem__(self, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= k < STEPS:
            raise IndexError(k)
        return make_batch(seed=10 + k)


def _stages(num_stages: int, backend: Optional[str]) -> Dict[int, nn.Module]:
    model = make_model()
    modules = {s: stage_module(model, s, num_stages) for s in range(num_stages)}
    if backend is not None:
        modules = {s: torch.compile(m, backend=backend) for s, m in modules.items()}  # type: ignore[misc]
    return modules


def train_on_rank(rank: int, world: int, schedule: str, local: int, backend: Optional[str]) -> Dict[str, Any]:
    """``STEPS`` steps of ``schedule``, each followed by ``Adam.step()``; batches from a DataLoader with one
    worker on the rank holding the first stage. Returns this rank's parameters and losses."""
    import swpipeline.pp as pp

    num_stages = world * local
    mine = list(range(rank, num_stages, world))
    everything = _stages(num_stages, backend)
    modules = {s: everything[s] for s in mine}
    stages = [pp.PipelineStage(modules[s], s, num_stages, torch.device("cpu")) for s in mine]
    sched = getattr(pp, schedule)(stages[0] if local == 1 else stages, N_MICRO, loss_fn=loss_fn)
    params = [p for s in mine for p in modules[s].parameters()]
    opt = torch.optim.Adam(params, lr=1e-2)
    loader = torch.utils.data.DataLoader(Batches(), batch_size=None, num_workers=1 if 0 in mine else 0)
    losses: List[float] = []
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        step_losses: List[torch.Tensor] = []
        sched.step(*((x,) if 0 in mine else ()),
                   **({"target": y, "losses": step_losses} if num_stages - 1 in mine else {}))
        opt.step()
        losses += [float(v) for v in step_losses]
    return {"params": {s: [p.detach().clone() for p in modules[s].parameters()] for s in mine}, "losses": losses}


def train_in_one_process(num_stages: int, backend: Optional[str]) -> Dict[str, Any]:
    modules = _stages(num_stages, backend)
    params = [p for s in range(num_stages) for p in modules[s].parameters()]
    opt = torch.optim.Adam(params, lr=1e-2)
    losses: List[float] = []
    for x, y in (Batches()[k] for k in range(STEPS)):
        opt.zero_grad(set_to_none=True)
        for xm, ym in zip(torch.tensor_split(x, N_MICRO), torch.tensor_split(y, N_MICRO)):
            h = xm
            for s in range(num_stages):
                h = modules[s](h)
            loss = loss_fn(h, ym)
            loss.backward()
            losses.append(float(loss.detach()))
        for p in params:
            assert p.grad is not None
            p.grad.div_(N_MICRO)
        opt.step()
    return {"params": {s: [p.detach().clone() for p in modules[s].parameters()] for s in range(num_stages)},
            "losses": losses}


@pytest.mark.parametrize("schedule,local,backend", [
    ("Schedule1F1B", 1, None),
    ("ScheduleInterleaved1F1B", 2, "aot_eager"),  # a compiled stage: forward and backward graphs of its own
])
def test_training_steps_with_adam_equal_one_process_bit_for_bit(schedule: str, local: int,
                                                                backend: Optional[str]) -> None:
    world = 2
    results = run_on_ranks(train_on_rank, world, timeout=150, schedule=schedule, local=local, backend=backend)
    want = train_in_one_process(world * local, backend)
    got = {s: params for r in results for s, params in r["params"].items()}
    assert sorted(got) == list(range(world * local))
    assert all(torch.equal(a, b) for s in got for a, b in zip(got[s], want["params"][s], strict=True))
    assert results[-1]["losses"] == want["losses"] and len(want["losses"]) == STEPS * N_MICRO
    first = make_model()  # the steps moved the weights: the comparison is not of untouched ones
    assert not torch.equal(got[0][0], stage_module(first, 0, world * local)[0][0].weight)
