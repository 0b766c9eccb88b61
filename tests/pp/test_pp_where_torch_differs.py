"""Where torch.distributed.pipelining is wrong, swpipeline.pp is right: each case against a one-process model.

* Gradients accumulated over two ``step()``s (no ``zero_grad`` between) with ``scale_grads=True``:
  torch divides the whole accumulated gradient by ``n_microbatches`` at every step, so the
  first step's share is divided twice (an average that forgets, not a sum). Ours divides only
  this step's share: after two steps each gradient equals one process's two steps,
  ``g1 / n + g2 / n``, bit for bit.
* BatchNorm's running statistics: torch infers shapes with an extra forward, which moves them;
  ours equal the one-process model's.
* A batch that does not divide into the microbatches (30 rows, 4 microbatches): torch fails on
  the uneven sizes; ours runs, exactly.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List

import torch
from torch import nn

from dist_harness import run_on_ranks
from test_pp_support import loss_fn, make_batch, make_model, reference_grads, stage_module, stage_param_slice


def _stage(lib: Any, model: nn.Module, rank: int, world: int) -> Any:
    return lib.PipelineStage(stage_module(model, rank, world), rank, world, torch.device("cpu"))


def accumulate_on_rank(rank: int, world: int) -> Dict[str, Any]:
    """Two GPipe and two 1F1B steps without zero_grad in between, on each library: this rank's gradients."""
    import torch.distributed.pipelining as torch_pp

    import swpipeline.pp as ours

    model = make_model()
    batches = [make_batch(seed) for seed in (1, 2)]
    got: Dict[str, Any] = {}
    for lib_name, lib in (("ours", ours), ("torch", torch_pp)):
        for name in ("ScheduleGPipe", "Schedule1F1B"):
            stage = _stage(lib, model, rank, world)
            schedule = getattr(lib, name)(stage, 4, loss_fn=loss_fn)
            for x, y in batches:
                if rank == 0:
                    schedule.step(x)
                else:
                    schedule.step(target=y)
            got[f"{lib_name} {name}"] = [p.grad.clone() for p in stage.submod.parameters()]
    return got


def test_gradients_accumulated_over_steps_are_the_sum_of_each_step_s_share() -> None:
    results = run_on_ranks(accumulate_on_rank, 2, 120)
    model = make_model()
    steps = [reference_grads(model, x, y, 4)[0] for x, y in (make_batch(1), make_batch(2))]
    want = [a + b for a, b in zip(*steps)]  # one process: step 1's gradient, then step 2's added
    forgetful = [a / 4 + b for a, b in zip(*steps)]  # what dividing everything at every step gives
    for rank, got in enumerate(results):
        mine = stage_param_slice(model, rank, 2)
        for name in ("ScheduleGPipe", "Schedule1F1B"):
            assert all(torch.equal(g, w) for g, w in zip(got[f"ours {name}"], want[mine])), (rank, name)
            theirs = got[f"torch {name}"]
            assert not any(torch.equal(g, w) for g, w in zip(theirs, want[mine]))  # torch's: not the sum
            assert all(torch.allclose(g, f, rtol=1e-5, atol=1e-7) for g, f in zip(theirs, forgetful[mine]))


def batchnorm_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU()),
                         nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU()))


def batchnorm_on_rank(rank: int, world: int, lib_name: str) -> Dict[str, Any]:
    """Two 1F1B steps of a model with BatchNorm: this rank's running statistics."""
    import torch.distributed.pipelining as torch_pp

    import swpipeline.pp as ours

    lib = ours if lib_name == "ours" else torch_pp
    module = copy.deepcopy(batchnorm_model()[rank])
    stage = lib.PipelineStage(module, rank, world, torch.device("cpu"))
    schedule = lib.Schedule1F1B(stage, 4, loss_fn=loss_fn)
    for seed in (1, 2):
        x, y = make_batch(seed, width=8)
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
    bn = module[1]
    return {"mean": bn.running_mean.clone(), "var": bn.running_var.clone(), "batches": int(bn.num_batches_tracked)}


def batchnorm_reference() -> List[Dict[str, Any]]:
    """The one-process model's running statistics after the same two steps, on one thread as each rank runs (a
    batch norm's reductions are summed in another order on two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _batchnorm_steps()
    finally:
        torch.set_num_threads(threads)


def _batchnorm_steps() -> List[Dict[str, Any]]:
    model = batchnorm_model()
    for seed in (1, 2):
        x, y = make_batch(seed, width=8)
        for xm, ym in zip(torch.tensor_split(x, 4), torch.tensor_split(y, 4)):
            loss_fn(model(xm), ym).backward()
    return [{"mean": part[1].running_mean, "var": part[1].running_var, "batches": int(part[1].num_batches_tracked)}
            for part in model]


def test_batchnorm_running_statistics_equal_the_one_process_model_s() -> None:
    want = batchnorm_reference()
    ours = run_on_ranks(batchnorm_on_rank, 2, 120, lib_name="ours")
    for rank, got in enumerate(ours):
        assert got["batches"] == want[rank]["batches"] == 8
        assert torch.equal(got["mean"], want[rank]["mean"]) and torch.equal(got["var"], want[rank]["var"]), rank
    theirs = run_on_ranks(batchnorm_on_rank, 2, 120, lib_name="torch")
    assert theirs[0]["batches"] != want[0]["batches"]  # torch's shape inference ran the first stage once more


def uneven_on_rank(rank: int, world: int) -> Dict[str, Any]:
    """One 1F1B step of a 30-row batch in 4 microbatches (8, 8, 7, 7 rows) on each library."""
    import torch.distributed.pipelining as torch_pp

    import swpipeline.pp as ours

    model = make_model()
    x, y = make_batch(1, rows=30)
    got: Dict[str, Any] = {}
    stage = _stage(ours, model, rank, world)
    losses: List[torch.Tensor] = []
    ours.Schedule1F1B(stage, 4, loss_fn=loss_fn).step(*((x,) if rank == 0 else ()),
                                                      **({"target": y, "losses": losses} if rank else {}))
    got["ours"] = [p.grad.clone() for p in stage.submod.parameters()]
    got["losses"] = [float(v) for v in losses]
    try:
        theirs = _stage(torch_pp, model, rank, world)
        torch_pp.Schedule1F1B(theirs, 4, loss_fn=loss_fn).step(*((x,) if rank == 0 else ()),
                                                               **({"target": y} if rank else {}))
        got["torch"] = "ran"
    except Exception as exc:
        got["torch"] = type(exc).__name__
    return got


def test_a_batch_that_does_not_divide_into_the_microbatches_runs_exactly() -> None:
    model = make_model()
    x, y = make_batch(1, rows=30)
    want, want_losses = reference_grads(model, x, y, 4)
    results = run_on_ranks(uneven_on_rank, 2, 120)
    for rank, got in enumerate(results):
        assert all(torch.equal(g, w) for g, w in zip(got["ours"], want[stage_param_slice(model, rank, 2)]))
    assert results[1]["losses"] == [float(v) for v in want_losses]
    assert "ran" not in {r["torch"] for r in results}  # torch fails on the uneven microbatches
