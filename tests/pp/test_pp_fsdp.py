"""Pipeline stages sharded with FSDP2, as torchtitan composes them: 4 gloo ranks, a mesh of 2 pipeline ranks × 2
data-parallel shards, every block and each stage module ``fully_shard``ed over the data-parallel mesh.

* GPipe, 1F1B and interleaved 1F1B: the gradients after two steps (``zero_grad`` between) and the weights after an
  SGD step equal torch.distributed.pipelining's with the same setup, bit for bit (before, every gradient differed
  by an ulp or two: FSDP reduce-scattered after every microbatch);
* a step all-gathers each parameter group once (torch's re-gathers for every microbatch's forward and backward);
* with only the blocks sharded (not the stage module), the same bits, and each block's gradient reduce-scattered
  once per step (torch's stage looks for FSDP on the stage module alone, and reduce-scatters every block after every
  microbatch's backward);
* ``clip_grad_norm_`` over the sharded stages equals one process's ``clip_grad_norm_`` over the whole gradients;
* the schedules that split a stage's backward into I and W (InterleavedZeroBubble, ZBVZeroBubble, DualPipeV) give
  every stage the gradients the interleaved 1F1B gives it, bit for bit, with one all-gather and one reduce-scatter
  per parameter group per step.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List

import pytest
import torch
from torch import nn

from dist_harness import run_on_ranks

W, BLOCKS, N, ROWS = 16, 4, 4, 16
SCHEDULES = [("ScheduleGPipe", 1), ("Schedule1F1B", 1), ("ScheduleInterleaved1F1B", 2)]
SPLIT = ("ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV")


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(W, W), nn.Tanh()) for _ in range(BLOCKS)])


def fsdp_on_rank(rank: int, world: int) -> Dict[str, Any]:
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as param_group
    import torch.distributed.pipelining as torch_pp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import swpipeline.pp as ours
    from swpipeline.pp.orders import placement_of
    from swpipeline.pp.placement import stages_of

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    gen = torch.Generator().manual_seed(10 + dp_rank)  # each data-parallel shard its own batch
    x, y = torch.randn(ROWS, W, generator=gen), torch.randn(ROWS, W, generator=gen)
    gathers, scatters = [0], [0]
    real, real_scatter = param_group.foreach_all_gather, param_group.foreach_reduce

    def counting(*args: Any, **kwargs: Any) -> Any:
        gathers[0] += 1
        return real(*args, **kwargs)

    def counting_scatter(*args: Any, **kwargs: Any) -> Any:
        scatters[0] += 1
        return real_scatter(*args, **kwargs)

    param_group.foreach_all_gather = counting  # type: ignore[assignment]
    param_group.foreach_reduce = counting_scatter  # type: ignore[assignment]
    got: Dict[str, Any] = {"pp": pp_rank}
    for name, local in SCHEDULES:
        num_stages = 2 * local
        for lib_name, lib in (("torch", torch_pp), ("ours", ours), ("ours, blocks only", ours),
                              ("torch, blocks only", torch_pp)):
            model, per = _model(), BLOCKS // num_stages
            subs = []
            for s in range(pp_rank, num_stages, 2):
                sub = copy.deepcopy(nn.Sequential(*list(model)[s * per:(s + 1) * per]))
                for block in sub:
                    fully_shard(block, mesh=mesh["dp"])
                if not lib_name.endswith("blocks only"):
                    fully_shard(sub, mesh=mesh["dp"])
                subs.append(sub)
            stages = [lib.PipelineStage(sub, s, num_stages, torch.device("cpu"), group=mesh["pp"].get_group())
                      for s, sub in zip(range(pp_rank, num_stages, 2), subs)]
            schedule = getattr(lib, name)(stages[0] if local == 1 else stages, N, loss_fn=nn.functional.mse_loss)
            gathers[0] = scatters[0] = 0
            for _ in range(2):
                for sub in subs:
                    sub.zero_grad(set_to_none=True)
                schedule.step(*([x] if pp_rank == 0 else []), **(dict(target=y) if pp_rank == 1 else {}))
            params = [p for sub in subs for p in sub.parameters()]
            grads = [p.grad.full_tensor() for p in params]
            torch.optim.SGD(params, lr=0.1).step()
            got[f"{name} {lib_name}"] = {"grads": grads, "weights": [p.full_tensor() for p in params],
                                         "gathers": gathers[0], "scatters": scatters[0]}
            if lib_name == "ours" and name == "Schedule1F1B":  # the step's gradients (SGD left them), clipped
                got["clip"] = {"before": grads, "total": ours.clip_grad_norm_(schedule, 0.05),
                               "after": [p.grad.full_tensor() for p in params]}
    split: Dict[str, Any] = {}  # two stages per rank (4 in all), placed as each schedule places them
    for name in SPLIT:
        placed = stages_of(pp_rank, 2, 4, placement_of(name))
        subs = [copy.deepcopy(nn.Sequential(*list(_model())[s:s + 1])) for s in placed]
        for sub in subs:
            fully_shard(sub[0], mesh=mesh["dp"])
            fully_shard(sub, mesh=mesh["dp"])
        stages = [ours.PipelineStage(sub, s, 4, torch.device("cpu"), group=mesh["pp"].get_group())
                  for s, sub in zip(placed, subs)]
        schedule = getattr(ours, name)(stages, N, loss_fn=nn.functional.mse_loss)
        gathers[0] = scatters[0] = 0
        for _ in range(2):
            for sub in subs:
                sub.zero_grad(set_to_none=True)
            schedule.step(*([x] if 0 in placed else []), **(dict(target=y) if 3 in placed else {}))
        split[name] = {"grads": {s: [p.grad.full_tensor() for p in sub.parameters()] for s, sub in zip(placed, subs)},
                       "gathers": gathers[0], "scatters": scatters[0]}
    got["split"] = split
    param_group.foreach_all_gather = real  # type: ignore[assignment]
    param_group.foreach_reduce = real_scatter  # type: ignore[assignment]
    return got


@pytest.fixture(scope="module")
def ranks() -> List[Dict[str, Any]]:
    return run_on_ranks(fsdp_on_rank, 4, timeout=240)


def test_fsdp2_stages_equal_torch_s_bit_for_bit_and_gather_once_per_step(ranks: List[Dict[str, Any]]) -> None:
    for rank, got in enumerate(ranks):
        for name, local in SCHEDULES:
            theirs, mine = got[f"{name} torch"], got[f"{name} ours"]
            assert all(torch.equal(a, b) for a, b in zip(theirs["grads"], mine["grads"])), (rank, name)
            assert all(torch.equal(a, b) for a, b in zip(theirs["weights"], mine["weights"])), (rank, name)
            groups = BLOCKS // 2  # parameter groups on this rank: one per block
            assert mine["gathers"] == 2 * groups, (rank, name)  # two steps, one all-gather per group each
            assert mine["scatters"] == 2 * groups, (rank, name)  # and one reduce-scatter
            assert theirs["gathers"] > 4 * mine["gathers"], (rank, name, theirs["gathers"])
            blocks_only = got[f"{name} ours, blocks only"]
            assert all(torch.equal(a, b) for a, b in zip(theirs["grads"], blocks_only["grads"])), (rank, name)
            assert all(torch.equal(a, b) for a, b in zip(theirs["weights"], blocks_only["weights"])), (rank, name)
            assert (blocks_only["gathers"], blocks_only["scatters"]) == (2 * groups, 2 * groups), (rank, name)
            assert got[f"{name} torch, blocks only"]["scatters"] == 2 * N * groups, (rank, name)  # every microbatch


def test_schedules_that_split_the_backward_give_sharded_stages_the_same_bits(ranks: List[Dict[str, Any]]) -> None:
    # each stage's gradients against the same stage's under interleaved 1F1B (a V places other stages on a rank)
    want = {s: g for got in ranks for s, g in got["split"]["ScheduleInterleaved1F1B"]["grads"].items()}
    assert sorted(want) == [0, 1, 2, 3]
    for rank, got in enumerate(ranks):
        for name, run in got["split"].items():
            for s, grads in run["grads"].items():
                assert all(torch.equal(a, b) for a, b in zip(grads, want[s])), (rank, name, s)
            groups = 2  # one sharded block in each of the rank's two stages; two steps
            assert (run["gathers"], run["scatters"]) == (2 * groups, 2 * groups), (rank, name)


def test_clipping_fsdp2_stages_equals_one_process_over_the_whole_gradients(ranks: List[Dict[str, Any]]) -> None:
    for dp in (0, 1):  # each data-parallel replica of the pipeline: its two pipeline ranks (mesh rows pp, dp)
        members = [got for rank, got in enumerate(ranks) if rank % 2 == dp]
        whole: List[torch.Tensor] = [g.clone() for got in sorted(members, key=lambda g: g["pp"])
                                     for g in got["clip"]["before"]]
        params = [nn.Parameter(torch.zeros_like(g)) for g in whole]
        for p, g in zip(params, whole):
            p.grad = g
        total = torch.nn.utils.clip_grad_norm_(params, 0.05)
        for got in members:
            assert torch.equal(got["clip"]["total"], total)
        after = [g for got in sorted(members, key=lambda g: g["pp"]) for g in got["clip"]["after"]]
        assert all(torch.equal(a, p.grad) for a, p in zip(after, params))
