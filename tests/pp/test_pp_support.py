"""Shared pieces of the swpipeline.pp tests: a model, its stages, the one-process reference, rank functions.

No tests here. The rank functions run inside ``dist_harness.run_on_ranks`` (one process per
gloo rank) and return plain values, so the test modules assert in the parent.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

WIDTH = 16
BLOCKS = 8
BATCH = 16


def make_model(blocks: int = BLOCKS, width: int = WIDTH, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)])


def stage_module(model: nn.Sequential, stage: int, num_stages: int) -> nn.Sequential:
    """A copy of the blocks of one stage: ``len(model) / num_stages`` consecutive blocks."""
    per = len(model) // num_stages
    return copy.deepcopy(nn.Sequential(*list(model)[stage * per:(stage + 1) * per]))


def make_batch(seed: int = 1, rows: int = BATCH, width: int = WIDTH) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, width, generator=gen), torch.randn(rows, width, generator=gen)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def reference_grads(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, n: int,
                    scale: bool = True) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """One process: each microbatch's loss backpropagated in order, gradients summed, then divided by n."""
    model = copy.deepcopy(model)
    losses = []
    for xm, ym in zip(torch.tensor_split(x, n), torch.tensor_split(y, n)):
        loss = loss_fn(model(xm), ym)
        loss.backward()
        losses.append(loss.detach())
    grads = [p.grad.clone() for p in model.parameters()]
    if scale and n != 1:
        grads = [g / n for g in grads]
    return grads, losses


def stage_param_slice(model: nn.Sequential, stage: int, num_stages: int) -> slice:
    """Which of the model's parameters belong to the stage."""
    per_block = len(list(model[0].parameters()))
    per = len(model) // num_stages
    return slice(stage * per * per_block, (stage + 1) * per * per_block)


def run_schedule(lib: Any, name: str, rank: int, world: int, n: int, local: int, model: nn.Sequential,
                 x: torch.Tensor, y: torch.Tensor, device: str = "cpu", **extra: Any) -> Dict[str, Any]:
    """One training step of schedule ``name`` from library ``lib`` (swpipeline.pp or torch's); this rank's
    stages' gradients (by stage), its losses and its output."""
    import torch.distributed as dist

    from swpipeline.pp.orders import placement_of
    from swpipeline.pp.placement import stages_of

    num_stages = world * local
    stages_idx = stages_of(rank, world, num_stages, placement_of(name))
    modules = {s: stage_module(model, s, num_stages) for s in stages_idx}
    stages = [lib.PipelineStage(modules[s], s, num_stages, torch.device(device)) for s in stages_idx]
    cls = getattr(lib, name)
    arg = stages[0] if name in ("ScheduleGPipe", "Schedule1F1B") else stages
    schedule = cls(arg, n, loss_fn=loss_fn, **extra)
    losses: List[torch.Tensor] = []
    args = (x,) if 0 in stages_idx else ()
    kwargs = {"target": y, "losses": losses} if num_stages - 1 in stages_idx else {}
    output = schedule.step(*args, **kwargs)
    dist.barrier()
    return {"grads": {s: [p.grad.clone() for p in modules[s].parameters()] for s in stages_idx},
            "losses": [loss.detach() for loss in losses], "output": output}


def exact_on_rank(rank: int, world: int, configs: Sequence[Tuple[str, int, int]],
                  compare_torch: bool = True, device: str = "cpu") -> List[Dict[str, Any]]:
    """For each (schedule, n_microbatches, stages per rank): whether this rank's gradients equal the one-process
    reference bit for bit, for swpipeline.pp and (where it accepts the configuration) for torch's. With ``device``
    "cuda", the model, the batch, the reference and the stages are on the GPU (messages still go through gloo)."""
    import torch.distributed.pipelining as torch_pp

    import swpipeline.pp as ours
    from swpipeline.pp.orders import placement_of
    from swpipeline.pp.placement import stages_of

    model = make_model().to(device)
    x, y = (t.to(device) for t in make_batch())
    out = []
    for name, n, local in configs:
        num_stages = world * local
        ref, ref_losses = reference_grads(model, x, y, n)
        mine = stages_of(rank, world, num_stages, placement_of(name))
        want = {s: ref[stage_param_slice(model, s, num_stages)] for s in mine}
        result: Dict[str, Any] = {"config": (name, n, local), "rank": rank}
        got = run_schedule(ours, name, rank, world, n, local, model, x, y, device)
        result["ours"] = _same(got["grads"], want)
        if num_stages - 1 in want:
            result["losses"] = [float(v) for v in got["losses"]] == [float(v) for v in ref_losses]
        result["torch"] = None
        # torch's needs microbatches of one size (and one that it refuses fails midway, leaving messages behind)
        if compare_torch and hasattr(torch_pp, name) and x.size(0) % n == 0:
            try:
                theirs = run_schedule(torch_pp, name, rank, world, n, local, model, x, y, device)
            except Exception as exc:  # a configuration torch refuses (e.g. fewer microbatches than stages)
                result["torch"] = f"refused: {type(exc).__name__}"
            else:
                result["torch"] = _same(theirs["grads"], want)
        out.append(result)
    return out


def _same(got: Dict[int, List[torch.Tensor]], want: Dict[int, List[torch.Tensor]]) -> bool:
    return all(len(got[s]) == len(want[s]) and all(torch.equal(a, b) for a, b in zip(got[s], want[s])) for s in want)


def build_on_rank(rank: int, world: int, make: Callable[..., Any]) -> Optional[str]:
    """Run ``make(stage)`` on this rank; the error's type and text if it raised."""
    import swpipeline.pp as ours

    model = make_model()
    stage = ours.PipelineStage(stage_module(model, rank, world), rank, world, torch.device("cpu"))
    try:
        make(stage)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
