"""swpipeline.pp.clip_grad_norm_: the total norm and the clipped gradients of a pipeline equal one process's
torch.nn.utils.clip_grad_norm_ over the whole model, bit for bit, on 2 gloo ranks (one stage per rank, and two
stages per rank), for norms of order 2, 1 and infinity, and gradients of three dtypes grouped as one process
groups them; a non-finite norm is refused on every rank."""

from __future__ import annotations

import copy
import math
from typing import Any, Dict

import torch

from dist_harness import run_on_ranks
from test_pp_support import loss_fn, make_batch, make_model, reference_grads, stage_module

CASES = [("Schedule1F1B", 1, 2.0, 0.05), ("ScheduleInterleaved1F1B", 2, 2.0, 0.05),
         ("ScheduleInterleaved1F1B", 2, 1.0, 0.3), ("Schedule1F1B", 1, math.inf, 0.01), ("ScheduleGPipe", 1, 2.0, 1e3)]


def clip_on_rank(rank: int, world: int) -> Dict[str, Any]:
    import swpipeline.pp as pp

    got: Dict[str, Any] = {}
    x, y = make_batch(5)
    for name, local, norm_type, max_norm in CASES:
        num_stages = world * local
        model = make_model()
        mine = [s for s in range(num_stages) if s % world == rank]
        stages = [pp.PipelineStage(stage_module(model, s, num_stages), s, num_stages, torch.device("cpu"))
                  for s in mine]
        schedule = getattr(pp, name)(stages[0] if local == 1 else stages, 4, loss_fn=loss_fn)
        schedule.step(*([x] if rank == 0 else []), **(dict(target=y) if num_stages - 1 in mine else {}))
        total = pp.clip_grad_norm_(schedule, max_norm, norm_type=norm_type)
        got[f"{name} {norm_type} {max_norm}"] = {
            "total": total, "grads": {(s.stage_index, k): p.grad.clone() for s in stages
                                      for k, p in enumerate(s.submod.parameters())}}
    # a gradient that is infinite on one rank: refused on both
    stage = pp.PipelineStage(stage_module(make_model(), rank, world), rank, world, torch.device("cpu"))
    for p in stage.submod.parameters():
        p.grad = torch.full_like(p, math.inf if rank == 1 else 1.0)
    try:
        pp.clip_grad_norm_(stage, 1.0, error_if_nonfinite=True)
    except RuntimeError as exc:
        got["nonfinite"] = str(exc)
    return got


def one_process(norm_type: float, max_norm: float) -> Dict[str, Any]:
    model = make_model()
    x, y = make_batch(5)
    grads = reference_grads(model, x, y, 4)[0]
    model = copy.deepcopy(model)
    for p, g in zip(model.parameters(), grads):
        p.grad = g.clone()
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type=norm_type)
    return {"total": total, "grads": [p.grad for p in model.parameters()]}


def test_clipping_across_stages_equals_one_process_bit_for_bit() -> None:
    ranks = run_on_ranks(clip_on_rank, 2, timeout=120)
    per_block = 2  # a Linear's weight and bias
    for name, local, norm_type, max_norm in CASES:
        key = f"{name} {norm_type} {max_norm}"
        want = one_process(norm_type, max_norm)
        stages = 2 * local
        blocks_per_stage = 8 // stages
        for rank in (0, 1):
            got = ranks[rank][key]
            assert torch.equal(got["total"], want["total"]), (key, rank, got["total"], want["total"])
            for (s, k), grad in got["grads"].items():
                assert torch.equal(grad, want["grads"][s * blocks_per_stage * per_block + k]), (key, s, k)
        clipped = float(want["total"]) > max_norm
        assert clipped == (max_norm < 1), key  # the cases clip, but for the last
    for rank in (0, 1):
        assert ranks[rank]["nonfinite"] == (
            "clip_grad_norm_: the total norm of order 2.0 of the pipeline's gradients is inf, so it cannot be "
            "clipped; to scale them by it anyway, pass error_if_nonfinite=False")


def test_bad_arguments_are_refused() -> None:
    import pytest

    import swpipeline.pp as pp

    with pytest.raises(TypeError, match="give this rank's schedule, its PipelineStage, or a list of its stages"):
        pp.clip_grad_norm_([torch.nn.Linear(2, 2)], 1.0)
    with pytest.raises(TypeError, match="got \\[\\]"):
        pp.clip_grad_norm_([], 1.0)


def mixed_dtypes_on_rank(rank: int, world: int) -> Dict[str, Any]:
    """One rank, one stage whose gradients are of three dtypes, interleaved: grouped by dtype as one process groups
    them."""
    import swpipeline.pp as pp

    torch.manual_seed(3)
    module = torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.Linear(5, 5).double(), torch.nn.Linear(5, 3),
                                 torch.nn.Linear(3, 3).to(torch.bfloat16))
    for p in module.parameters():
        p.grad = torch.randn_like(p) * 3
    reference = copy.deepcopy(module)
    for p, r in zip(module.parameters(), reference.parameters()):
        r.grad = p.grad.clone()
    total = pp.clip_grad_norm_(pp.PipelineStage(module, 0, 1, torch.device("cpu")), 0.5)
    want = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
    return {"total": (total, want), "grads": [torch.equal(p.grad, r.grad) for p, r in
                                              zip(module.parameters(), reference.parameters())]}


def test_gradients_of_several_dtypes_are_grouped_as_one_process_groups_them() -> None:
    (got,) = run_on_ranks(mixed_dtypes_on_rank, 1, timeout=60)
    total, want = got["total"]
    assert total.dtype == want.dtype and torch.equal(total, want)
    assert got["grads"] == [True] * 8
