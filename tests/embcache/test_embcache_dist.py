"""swpipeline.embcache with a process group: data-parallel training on two gloo ranks.

Every rank keeps whole tables; the InputDist stage all-gathers the ids, so both
ranks swap the same rows in, and the sparse update averages the rows' gradients
over the ranks. The replicas must stay bitwise identical, and equal (within float
rounding: the average is summed in another order) one process training on both
ranks' batches with the gradients averaged.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
import torch.distributed as dist

from dist_harness import run_on_ranks
from test_embcache import LR_DENSE, N, Reference, cached_model, ids_of, make_batches
from swpipeline.embcache import EmbCacheTrainPipeline, HostEmbeddingBag

STEPS = 8


def global_batches() -> List[Dict[str, torch.Tensor]]:
    return make_batches(2 * STEPS, "zipf", seed=21)


def train_on_rank(rank: int, world_size: int) -> Dict[str, Any]:
    model = cached_model(N // 2, "adagrad")
    model.top = torch.nn.parallel.DistributedDataParallel(model.top)  # the dense layers: plain DDP
    group = dist.new_group(backend="gloo")  # the pipeline's own group, apart from DDP's
    pipe = EmbCacheTrainPipeline(model, torch.optim.SGD(model.top.parameters(), lr=LR_DENSE), "cpu", ids_of=ids_of,
                                 process_group=group)
    assert [r.name for r in pipe.plan.tasks][:2] == ["H2D", "InputDist"] and pipe.plan.depth == 5
    outputs = pipe.run(global_batches()[rank::world_size])
    table = model.emb
    assert isinstance(table, HostEmbeddingBag)
    return {"weight": table.full_weight(), "sum": table.full_optimizer_state(),
            "top": model.top.module.weight.detach().clone(), "outputs": outputs,
            "swapped_in": pipe.stats().table("emb").swapped_in}


def test_two_ranks_keep_identical_replicas_of_the_averaged_training() -> None:
    first, second = run_on_ranks(train_on_rank, world_size=2, timeout=120)
    for key in ("weight", "sum", "top"):
        assert torch.equal(first[key], second[key]), key
    assert first["swapped_in"] == second["swapped_in"]  # the same cache decisions (the union of the ids)
    ref = Reference("adagrad")
    batches = global_batches()
    for step in range(STEPS):
        pair = batches[2 * step:2 * step + 2]
        ref.sparse.zero_grad()
        ref.dense.zero_grad()
        losses = [ref.model(b)[0] for b in pair]
        (sum(losses) / 2).backward()
        ref.dense.step()
        ref.sparse.step()
    assert torch.allclose(first["weight"], ref.weight, rtol=0, atol=1e-5)
    assert torch.allclose(first["sum"], ref.adagrad_sum(), rtol=1e-5, atol=1e-7)
    assert torch.allclose(first["top"], ref.model.top.weight.detach(), rtol=0, atol=1e-5)
