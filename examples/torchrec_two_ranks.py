"""TorchRec's TrainPipelineSparseDist, swapped for swpipeline's by changing one import (CPU, gloo).

    torchrun --nproc_per_node 2 examples/torchrec_two_ranks.py

Needs TorchRec (pip install --no-deps -r requirements-torchrec.txt). Each rank builds the same
sharded DLRM twice, trains one with TorchRec's pipeline and one with swpipeline's on the same
batches, and checks that the losses are bitwise equal.
"""

import gc
import os
import warnings

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.datasets.utils import Batch
from torchrec.distributed import DistributedModelParallel, ShardingEnv
from torchrec.distributed import TrainPipelineSparseDist as TorchRecSparseDist
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
from torchrec.distributed.types import ShardingPlan
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.optim import apply_optimizer_in_backward
from torchrec.optim.optimizers import in_backward_optimizer_filter

from swpipeline.torchrec import TrainPipelineSparseDist  # the one changed line

TABLES, ROWS, DIM, DENSE = 3, 100, 8, 8
CPU = torch.device("cpu")


def build_model():
    """A DLRM: table t0 on rank 0, t1 on rank 1, t2 split by rows over all ranks; SGD everywhere."""
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f"f{i}"])
              for i in range(TABLES)]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))  # allocated by the sharding
    model = DLRMTrain(DLRM(embedding_bag_collection=ebc, dense_in_features=DENSE, dense_arch_layer_sizes=[16, DIM],
                           over_arch_layer_sizes=[16, 1], dense_device=CPU))
    apply_optimizer_in_backward(torch.optim.SGD, model.model.sparse_arch.parameters(), {"lr": 0.1})
    sharder = EmbeddingBagCollectionSharder()
    world = dist.get_world_size()
    placement = {"t0": table_wise(rank=0), "t1": table_wise(rank=1 % world), "t2": row_wise()}
    plan = construct_module_sharding_plan(model.model.sparse_arch.embedding_bag_collection, placement,
                                          local_size=world, world_size=world, device_type="cpu", sharder=sharder)
    dmp = DistributedModelParallel(model, device=CPU, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   plan=ShardingPlan({"model.sparse_arch.embedding_bag_collection": plan}),
                                   sharders=[sharder])
    dense = [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]  # the rest: not sharded
    return dmp, torch.optim.SGD(dense, lr=0.1)


def make_batch(size=16):
    lengths = torch.randint(0, 4, (TABLES * size,))  # 0-3 ids per sample and feature
    ids = KeyedJaggedTensor.from_lengths_sync(keys=[f"f{i}" for i in range(TABLES)], lengths=lengths,
                                              values=torch.randint(0, ROWS, (int(lengths.sum()),)))
    return Batch(dense_features=torch.randn(size, DENSE), sparse_features=ids, labels=torch.randint(0, 2, (size,)))


def train(pipeline_class, batches, start):
    torch.random.set_rng_state(start)  # both models get the same initial weights
    model, optimizer = build_model()
    pipeline = pipeline_class(model, optimizer, CPU)  # TorchRec's arguments, unchanged
    losses, it = [], iter(batches)
    while True:
        try:
            losses.append(pipeline.progress(it)[0])  # DLRMTrain's output: (loss, logits, labels)
        except StopIteration:  # the data is drained, as in TorchRec
            return torch.stack(losses)


def main():
    if "RANK" not in os.environ:
        raise SystemExit("launch it with: torchrun --nproc_per_node 2 examples/torchrec_two_ranks.py")
    warnings.filterwarnings("ignore", category=FutureWarning)  # TorchRec's own calls of deprecated torch APIs
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # both ranks on this machine
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # rank, world size and address come from torchrun
    rank = dist.get_rank()
    start = torch.random.get_rng_state()
    batches = [make_batch() for _ in range(12)]  # this rank's data
    theirs = train(TorchRecSparseDist, batches, start)
    ours = train(TrainPipelineSparseDist, batches, start)
    equal = torch.equal(theirs, ours)
    print(f"rank {rank}: {len(ours)} steps, loss {ours[0]:.4f} -> {ours[-1]:.4f}; "
          f"losses bitwise equal to TorchRec's: {'yes' if equal else 'NO'}", flush=True)
    # Free what still holds the process group (models, pipelines and their pending work, some in reference
    # cycles) while the interpreter is whole, and let both ranks finish every collective, before tearing the
    # group down: a group destroyed later, at interpreter exit, can abort the process.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    assert equal


if __name__ == "__main__":
    main()
