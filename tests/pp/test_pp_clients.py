"""swpipeline.pp under client code: an optimizer that updates in place after every step, a
``torch.compile``d stage, batches from a DataLoader with a worker process, stages wrapped in
DistributedDataParallel; several steps of training equal, bit for bit, the same modules trained
in one process on the same microbatches.

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


def ddp_on_rank(rank: int, world: int, schedule: str, local: int) -> Dict[str, Any]:
    """Two pipeline replicas on four ranks: pipeline groups {0, 1} and {2, 3}, data-parallel groups {0, 2} and
    {1, 3}; each of a rank's ``local`` stages a DistributedDataParallel module over its data-parallel group;
    replica d trains on its own batch. Two steps; this rank's stages' gradients after the second."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import swpipeline.pp as pp

    pipes = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes every group, in one order
    replicas = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    replica, pipe_rank = divmod(rank, 2)
    num_stages = 2 * local
    mine = list(range(pipe_rank, num_stages, 2))
    modules = {s: DistributedDataParallel(stage_module(make_model(), s, num_stages), process_group=replicas[pipe_rank])
               for s in mine}
    stages = [pp.PipelineStage(modules[s], s, num_stages, torch.device("cpu"), group=pipes[replica]) for s in mine]
    sched = getattr(pp, schedule)(stages[0] if local == 1 else stages, N_MICRO, loss_fn=loss_fn)
    x, y = make_batch(seed=20 + replica)
    for _ in range(2):  # twice: the second step's gradients start from None again
        for module in modules.values():
            module.zero_grad(set_to_none=True)
        sched.step(*((x,) if 0 in mine else ()), **({"target": y} if num_stages - 1 in mine else {}))
    return {s: [p.grad.clone() for p in modules[s].parameters()] for s in mine}


@pytest.mark.parametrize("schedule,local", [("ScheduleGPipe", 1), ("Schedule1F1B", 1),
                                            ("ScheduleInterleavedZeroBubble", 2)])  # its W writes the gradients
def test_stages_wrapped_in_ddp_reduce_once_per_step_and_equal_one_process(schedule: str, local: int) -> None:
    # Before, DDP all-reduced on every microbatch's backward: GPipe's gradients came out wrong, without an error.
    from test_pp_support import reference_grads, stage_param_slice

    results = run_on_ranks(ddp_on_rank, 4, timeout=150, schedule=schedule, local=local)
    model = make_model()
    per_replica = [reference_grads(model, *make_batch(seed=20 + d), N_MICRO)[0] for d in range(2)]
    mean = [(a + b) / 2 for a, b in zip(*per_replica)]  # what the data-parallel all-reduce averages to
    got = [(s, grads) for per_rank in results for s, grads in per_rank.items()]
    assert sorted(s for s, _ in got) == sorted(list(range(2 * local)) * 2)  # each stage on both replicas
    for s, grads in got:
        want = mean[stage_param_slice(model, s, 2 * local)]
        assert all(torch.equal(g, w) for g, w in zip(grads, want, strict=True))
    assert not torch.equal(per_replica[0][0], per_replica[1][0])  # the replicas' own gradients differ
