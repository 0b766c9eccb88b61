"""TorchRec's train pipelines vs the same pipelines as swpipeline plans: steps/s on 2 gloo ranks (CPU).

Every run trains the same DLRM (TorchRec's ``DLRM``/``DLRMTrain``, embedding tables
sharded table-wise and row-wise over the ranks, fused SGD for the embeddings, SGD
for the dense part) from the same initial weights on the same batches. A batch
starts as raw ids (one Python list of ids per sample and feature, like a record
from a file); *preparing* it (hashing the ids into the tables, building the
KeyedJaggedTensor and the dense tensors) is part of the data loading, as it is
in a real job. Two data-loading scenarios: CPU work only, and the same after a
``--read-ms`` wait per batch (a storage or network read, simulated by a sleep).
Runs:

* ``torchrec Base`` / ``ours Base``: TrainPipelineBase, TorchRec's and ours;
* ``torchrec SparseDist`` / ``ours SparseDist``: TrainPipelineSparseDist;
* ``ours SparseDist + prep thread``: our SparseDist plan with H2D (and the batch
  preparation, via ``prepare_batch``) on a thread group of its own.

TorchRec's pipelines and our same-plan runs prepare each batch in the iterator
(``next()`` on the training thread); the last run hands the iterator's raw
records to H2D's thread instead. Each repeat runs every configuration once, in
turn (interleaved, so machine drift hits them alike); a run is ``--warmup`` steps
then ``--steps`` timed steps, on both ranks. Columns: median steps/s over
``--repeats``, its spread (min-max), and the ratio of the medians to TorchRec's
run of the same plan (Base or SparseDist).

    python benchmarks/torchrec_vs_ours.py [--steps 40] [--repeats 5] [--read-ms 10]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import format_table, machine_line  # noqa: E402

TABLES, ROWS, DIM, DENSE_IN, IDS_PER_FEATURE = 8, 20_000, 64, 64, 20


def build_model(seed: int = 0) -> Tuple[Any, Any]:
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

    world = dist.get_world_size()
    torch.manual_seed(seed)
    configs = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f"f{i}"])
               for i in range(TABLES)]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    model = DLRMTrain(DLRM(embedding_bag_collection=ebc, dense_in_features=DENSE_IN,
                           dense_arch_layer_sizes=[256, DIM], over_arch_layer_sizes=[256, 64, 1],
                           dense_device=torch.device("cpu")))
    apply_optimizer_in_backward(torch.optim.SGD, model.model.sparse_arch.parameters(), {"lr": 0.05})
    sharder = EmbeddingBagCollectionSharder()
    placement = {f"t{i}": (row_wise() if i % 4 == 3 else table_wise(rank=i % world)) for i in range(TABLES)}
    plan = construct_module_sharding_plan(model.model.sparse_arch.embedding_bag_collection,
                                          per_param_sharding=placement, local_size=world, world_size=world,
                                          device_type="cpu", sharder=sharder)
    dmp = DistributedModelParallel(module=model, device=torch.device("cpu"),
                                   env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   plan=ShardingPlan({"model.sparse_arch.embedding_bag_collection": plan}),
                                   sharders=[sharder])
    optimizer = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      lambda params: torch.optim.SGD(params, lr=0.05))
    return dmp, optimizer


def raw_records(rank: int, count: int, batch_size: int) -> List[Dict[str, Any]]:
    """Raw batches: per sample and feature a list of 64-bit ids, plus dense values and a label."""
    gen = torch.Generator().manual_seed(100 + rank)
    records = []
    for _ in range(count):
        ids = torch.randint(0, 2**40, (TABLES, batch_size, IDS_PER_FEATURE), generator=gen).tolist()
        records.append({"ids": ids, "dense": torch.randn(batch_size, DENSE_IN, generator=gen).tolist(),
                        "labels": torch.randint(0, 2, (batch_size,), generator=gen).tolist()})
    return records


READ_SECONDS = 0.0  # simulated storage/network latency per batch (set per scenario)


def prepare(record: Dict[str, Any]) -> Any:
    """Raw record -> torchrec Batch: (wait for the read,) hash the ids into the tables, build the KJT."""
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    if READ_SECONDS:
        time.sleep(READ_SECONDS)
    values: List[int] = []
    lengths: List[int] = []
    for feature in record["ids"]:
        for sample in feature:
            values.extend(hash((i, 7)) % ROWS for i in sample)
            lengths.append(len(sample))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"f{i}" for i in range(TABLES)], values=torch.tensor(values),
                                              lengths=torch.tensor(lengths))
    return Batch(dense_features=torch.tensor(record["dense"]), sparse_features=kjt,
                 labels=torch.tensor(record["labels"]))


def configurations() -> Dict[str, Tuple[Callable[..., Any], Dict[str, Any], bool]]:
    """name -> (pipeline class or function, its keyword arguments, whether the iterator yields raw records)."""
    import torchrec.distributed.train_pipeline as trec

    import swpipeline.torchrec as ours

    return {
        "torchrec Base": (trec.TrainPipelineBase, {}, False),
        "ours Base": (ours.TrainPipelineBase, {}, False),
        "torchrec SparseDist": (trec.TrainPipelineSparseDist, {}, False),
        "ours SparseDist": (ours.TrainPipelineSparseDist, {}, False),
        "ours SparseDist + prep thread": (ours.TrainPipelineSparseDist,
                                          {"thread_groups": {"H2D": "prep"}, "prepare_batch": prepare}, True),
    }


def time_run(factory: Callable[..., Any], kwargs: Dict[str, Any], raw: bool, records: List[Dict[str, Any]],
             warmup: int) -> float:
    """Seconds for the timed steps (all records after the first ``warmup``)."""
    model, optimizer = build_model()
    pipeline = factory(model, optimizer, torch.device("cpu"), **kwargs)
    source: Iterator[Any] = iter(records) if raw else map(prepare, records)
    for _ in range(warmup):
        pipeline.progress(source)
    dist.barrier()
    start = time.perf_counter()
    while True:
        try:
            pipeline.progress(source)
        except StopIteration:
            break
    elapsed = time.perf_counter() - start
    dist.barrier()
    return elapsed


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, results: Any) -> None:
    global READ_SECONDS
    warnings.filterwarnings("ignore")
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        configs = configurations()
        records = raw_records(rank, args.warmup + args.steps, args.batch_size)
        times: Dict[float, Dict[str, List[float]]] = {}
        for read_ms in (0.0, args.read_ms):
            READ_SECONDS = read_ms / 1000
            times[read_ms] = {name: [] for name in configs}
            for _ in range(args.repeats):
                for name, (factory, kwargs, raw) in configs.items():
                    times[read_ms][name].append(time_run(factory, kwargs, raw, records, args.warmup))
        if rank == 0:
            results.put(times)
    finally:
        dist.destroy_process_group()


def table(times: Dict[str, List[float]], steps: int) -> str:
    rows = []
    for name, seconds in times.items():
        rates = [steps / s for s in seconds]
        same_plan = "torchrec Base" if "Base" in name else "torchrec SparseDist"
        ratio = statistics.median(rates) / statistics.median([steps / s for s in times[same_plan]])
        rows.append((name, f"{statistics.median(rates):.1f}", f"{min(rates):.1f}-{max(rates):.1f}", f"{ratio:.2f}x"))
    return format_table(("pipeline", "steps/s", "min-max", "vs TorchRec, same plan"), rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--read-ms", type=float, default=10.0, help="I/O wait per batch in the second scenario")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, 2, port, args, results)) for r in range(2)]
    for p in procs:
        p.start()
    times = results.get(timeout=3600)
    for p in procs:
        p.join()
    print(f"2 gloo ranks on 127.0.0.1, 1 torch thread each; {machine_line()}")
    print(f"DLRM: {TABLES} tables x {ROWS} rows x dim {DIM}, batch {args.batch_size}, {IDS_PER_FEATURE} ids per "
          f"feature; {args.steps} timed steps after {args.warmup}, median of {args.repeats} (interleaved)")
    for read_ms, per_config in times.items():
        what = "CPU-only" if not read_ms else f"a {read_ms:g} ms read (I/O wait) plus the CPU work"
        print(f"\ndata loading: {what} per batch\n{table(per_config, args.steps)}")


if __name__ == "__main__":
    main()
