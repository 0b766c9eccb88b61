"""A small TorchRec DLRM on the CPU, sharded over the gloo ranks, with identical initialisation every time.

Four embedding tables (two table-wise on different ranks, one row-wise over both,
one more table-wise) with a fused SGD embedding optimizer, a dense SGD optimizer
for the rest, and reproducible synthetic batches per rank. Building the model
again with the same seed gives bitwise the same weights, so a TorchRec run, our
run and a plain loop can be compared step by step.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import torch
import torch.distributed as dist

NUM_TABLES = 4
ROWS = 100
DIM = 8
DENSE_IN = 8


def build_dlrm(seed: int = 0, lr: float = 0.1, python_reducer: bool = False) -> Tuple[Any, Any]:
    """``(DistributedModelParallel(DLRMTrain), dense optimizer)`` on the CPU for the current process group."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan
    from torchrec.models.dlrm import DLRM, DLRMTrain
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    if python_reducer:  # compiled autograd over DDP needs DDP's Python reducer, chosen when DDP wraps the model
        dynamo_config: Any = torch._dynamo.config
        dynamo_config.optimize_ddp = "python_reducer"
    world = dist.get_world_size()
    torch.manual_seed(seed)
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f"f{i}"])
              for i in range(NUM_TABLES)]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    dlrm = DLRM(embedding_bag_collection=ebc, dense_in_features=DENSE_IN, dense_arch_layer_sizes=[16, DIM],
                over_arch_layer_sizes=[16, 1], dense_device=torch.device("cpu"))
    model = DLRMTrain(dlrm)
    apply_optimizer_in_backward(torch.optim.SGD, model.model.sparse_arch.parameters(), {"lr": lr})
    sharder = EmbeddingBagCollectionSharder()
    placement = {"t0": table_wise(rank=0), "t1": table_wise(rank=1 % world), "t2": row_wise(),
                 "t3": table_wise(rank=0)}
    module_plan = construct_module_sharding_plan(model.model.sparse_arch.embedding_bag_collection,
                                                 per_param_sharding=placement, local_size=world, world_size=world,
                                                 device_type="cpu", sharder=sharder)
    dmp = DistributedModelParallel(module=model, device=torch.device("cpu"),
                                   env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   plan=ShardingPlan({"model.sparse_arch.embedding_bag_collection": module_plan}),
                                   sharders=[sharder])
    optimizer = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      lambda params: torch.optim.SGD(params, lr=lr))
    return dmp, optimizer


def make_batches(rank: int, count: int, batch_size: int = 16, seed: int = 1000, ids_per_feature: int = -1) -> List[Any]:
    """``count`` reproducible DLRM batches (torchrec.datasets.utils.Batch) for ``rank``.

    ``ids_per_feature >= 0`` gives every sample that many ids per feature (same shapes in
    every batch: a compiled model then compiles once).
    """
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(seed + rank)
    batches = []
    for _ in range(count):
        lengths = torch.randint(0, 4, (NUM_TABLES * batch_size,), generator=gen)
        if ids_per_feature >= 0:
            lengths = torch.full_like(lengths, ids_per_feature)
        values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=gen)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"f{i}" for i in range(NUM_TABLES)], values=values,
                                                  lengths=lengths)
        batches.append(Batch(dense_features=torch.randn(batch_size, DENSE_IN, generator=gen), sparse_features=kjt,
                             labels=torch.randint(0, 2, (batch_size,), generator=gen)))
    return batches


def logits(output: Any) -> torch.Tensor:
    """The logits in DLRMTrain's output ``(loss, logits, labels)``."""
    return output[1].detach().clone()


def drive(pipeline: Any, batches: List[Any], between_steps: Any = None) -> List[torch.Tensor]:
    """Call ``pipeline.progress`` until StopIteration; the logits of every step."""
    outputs: List[torch.Tensor] = []
    it = iter(batches)
    while True:
        try:
            out = pipeline.progress(it)
        except StopIteration:
            return outputs
        outputs.append(logits(out))
        if between_steps is not None:
            between_steps(len(outputs))


def train_reference(model: Any, optimizer: Any, batches: List[Any], loss_scale: float = 1.0) -> List[torch.Tensor]:
    """The plain, non-pipelined loop."""
    outputs = []
    for batch in batches:
        optimizer.zero_grad()
        loss, out = model(batch)
        (loss * loss_scale).backward()
        optimizer.step()
        outputs.append(logits(out))
    return outputs


def eval_reference(model: Any, batches: List[Any]) -> List[torch.Tensor]:
    return [logits(model(batch)[1]) for batch in batches]


def embedding_weights(model: Any) -> List[torch.Tensor]:
    """This rank's embedding shards, as views into the fused kernels' storage."""
    weights = []
    for key, value in model.state_dict().items():
        if "embedding_bags" in key and hasattr(value, "local_shards"):
            weights += [shard.tensor for shard in value.local_shards()]
    return weights


def semi_sync_reference(model: Any, optimizer: Any, batches: List[Any], start_batch: int,
                        stash_gradients: bool = False) -> List[torch.Tensor]:
    """A plain loop with TorchRec's semi-sync staleness.

    From batch ``start_batch + 1`` on, the forward looks embeddings up in the
    weights as they were one update earlier (before the previous batch's
    embedding backward), and the embedding backward (the fused SGD update)
    applies to the current weights. With ``stash_gradients`` the dense step from
    ``start_batch`` on uses the previous batch's gradients.
    """
    weights = embedding_weights(model)
    one_older = [w.detach().clone() for w in weights]
    stash: dict = {}
    outputs = []
    for i, batch in enumerate(batches):
        current = [w.detach().clone() for w in weights]
        stale = i - 1 >= start_batch
        optimizer.zero_grad()
        if stale:  # (through .data: the lookup saved the weights for backward, which only reads their shape)
            for w, old in zip(weights, one_older):
                w.data.copy_(old)
        loss, out = model(batch)
        if stale:
            for w, cur in zip(weights, current):
                w.data.copy_(cur)
        loss.backward()
        if stash_gradients and i >= start_batch:
            for name, param in model.named_parameters():
                previous = stash.get(name)
                if param.grad is not None:
                    stash[name] = param.grad.clone()
                param.grad = previous
        if not (stash_gradients and i == start_batch):
            optimizer.step()
        one_older = current
        outputs.append(logits(out))
    return outputs
