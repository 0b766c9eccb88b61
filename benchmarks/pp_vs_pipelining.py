"""Pipeline parallelism across ranks: swpipeline.pp next to torch.distributed.pipelining, in one run.

What is measured
    ``--ranks`` gloo ranks on this machine (127.0.0.1), each with one intra-op thread. Three
    models, each split into equal stages: ``tiny``, 8 blocks of Linear(64) + ReLU on a batch of 32
    (4 rows per microbatch, so what each action costs the library shows); ``mlp``, ``--blocks``
    blocks of Linear(width) + ReLU
    (default 8 x Linear(512), a batch of 64), and ``transformer``, 4 encoder layers (d_model
    128, 4 heads, feed-forward 512, no dropout) on a batch of 64 sequences of 16. One *step*
    is ``schedule.step(...)`` on every rank with ``--microbatches`` microbatches and an MSE
    loss (gradients set to None before each step, no optimizer). For every schedule both
    libraries have (GPipe and 1F1B with one stage per rank; Interleaved1F1B and
    InterleavedZeroBubble with two; with ``--schedules``, also LoopedBFS, and ZBVZeroBubble and
    DualPipeV with two stages per rank in a V), both libraries run from the same weights,
    interleaved within every round so that they share the machine's load.

Columns (median over ``--rounds`` rounds of ``--steps`` timed steps, after 3 warm-up steps)
    ``ms/step``: wall time per step (a barrier before and after each round);
    ``min``: the fastest round;
    ``bubble``: ``1 - T_single / (ranks * T_step)``, the share of the ranks' time not spent on
    the model's own work, ``T_single`` being the same model's forward and backward of the same
    microbatches in one process with one thread (communication and overheads count as bubble);
    ``µs/action``: the ranks' time not spent on the model's own work, per compute action,
    ``(p * T_step - T_single) / actions`` (every rank's F, B, I and W of a step): what each action
    costs the library in hand-offs, messages and waiting, bubble included;
    ``ideal``: the bubble of a perfect pipeline, ``(p - 1) / (m + p - 1)``;
    ``peak act. MB``: per rank, the most bytes of tensors that autograd held for backward at
    once during one step (counted through ``saved_tensors_hooks``, each storage once): the
    activation memory a schedule keeps alive;
    ``vs torch``: torch's ms/step over this one's (above 1: faster than torch);
    ``exact``: this library's gradients after one step equal the one-process model's bit for bit;
    ``simulated``: ``swpipeline.pp.simulate``'s ms/step for the schedule, given the stage costs that
    ``measure()`` took from three GPipe steps after each round's timed steps (the median over the
    rounds, and its error against the measured ms/step): the single-stage schedules only (the costs
    are of one stage per rank).

Run: ``python benchmarks/pp_vs_pipelining.py`` (about a minute on 2 cores). The ranks share the
machine's cores: on a 2-core machine 2 ranks have one core each at best, so say so beside
any figure taken there.

On a GPU: ``--device cuda`` puts every stage, the batch and the one-process reference on the
GPU (the ranks share it; each step ends with the GPU's work done). NCCL refuses two ranks on
one GPU (``--backend nccl`` shows it), so the ranks talk through gloo, which carries only CPU
tensors: this library's transport packs its messages on the CPU; torch's stages post theirs
from the GPU (``--libraries`` picks which libraries run). ``--ranks 1`` puts every stage on
one rank, where no message leaves the process.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: one intra-op thread per rank
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # on a GPU: one reduction order on every stream

import argparse  # noqa: E402
import copy  # noqa: E402
import math  # noqa: E402
import queue  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Dict, List, Tuple  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

from _common import format_table, machine_line  # noqa: E402
from swpipeline.pp.orders import placement_of  # noqa: E402
from swpipeline.pp.placement import stages_of  # noqa: E402

SCHEDULES = {"ScheduleGPipe": 1, "Schedule1F1B": 1, "ScheduleInterleaved1F1B": 2, "ScheduleInterleavedZeroBubble": 2,
             "ScheduleLoopedBFS": 2, "ScheduleZBVZeroBubble": 2, "ScheduleDualPipeV": 2}  # stages per rank
DEFAULT_SCHEDULES = list(SCHEDULES)[:4]  # the others with --schedules
LIBRARIES = ("torch", "swpipeline")
DEVICE = torch.device("cpu")  # --device, set in each rank


# -- the models --------------------------------------------------------------------------------------

def mlp_blocks(args: argparse.Namespace) -> List[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU()) for _ in range(args.blocks)]


def tiny_blocks(args: argparse.Namespace) -> List[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(8)]


def transformer_blocks(args: argparse.Namespace) -> List[nn.Module]:
    torch.manual_seed(0)
    return [nn.TransformerEncoderLayer(128, 4, dim_feedforward=512, dropout=0.0, batch_first=True) for _ in range(4)]


Blocks = Callable[[argparse.Namespace], List[nn.Module]]
Shape = Callable[[argparse.Namespace], Tuple[int, ...]]
MODELS: Dict[str, Tuple[Blocks, Shape]] = {
    "tiny": (tiny_blocks, lambda a: (32, 64)),
    "mlp": (mlp_blocks, lambda a: (a.batch, a.width)),
    "transformer": (transformer_blocks, lambda a: (a.batch, 16, 128)),
}


def stage_of(blocks: List[nn.Module], stage: int, num_stages: int) -> nn.Module:
    per = len(blocks) // num_stages
    return copy.deepcopy(nn.Sequential(*blocks[stage * per:(stage + 1) * per]))


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


# -- activation memory: what autograd holds for backward -------------------------------------------

class SavedBytes:
    """The bytes of the tensors autograd holds for backward (each storage once; not the parameters), now and at
    most."""

    def __init__(self, params: List[torch.Tensor]) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.lock = threading.Lock()
        self.refs: Dict[int, Tuple[int, int]] = {}  # storage address -> (references, bytes)
        self.now = 0
        self.peak = 0

    def pack(self, t: torch.Tensor) -> Any:
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if key in self.params:
            return t
        with self.lock:
            count, _ = self.refs.get(key, (0, size))
            self.refs[key] = (count + 1, size)
            if count == 0:
                self.now += size
                self.peak = max(self.peak, self.now)
        return _Held(t, key, self)

    def release(self, key: int) -> None:
        with self.lock:
            count, size = self.refs[key]
            if count == 1:
                del self.refs[key]
                self.now -= size
            else:
                self.refs[key] = (count - 1, size)


def _unpack(held: Any) -> torch.Tensor:
    return held.t if isinstance(held, _Held) else held


class _Held:
    def __init__(self, t: torch.Tensor, key: int, owner: SavedBytes) -> None:
        self.t, self.key, self.owner = t, key, owner

    def __del__(self) -> None:
        self.owner.release(self.key)


# -- one rank ---------------------------------------------------------------------------------------

def build(lib_name: str, name: str, blocks: List[nn.Module], rank: int, world: int,
          n: int) -> Tuple[Any, Dict[int, nn.Module]]:
    if lib_name == "torch":
        import torch.distributed.pipelining as lib
    else:
        import swpipeline.pp as lib  # type: ignore[no-redef]
    local = SCHEDULES[name]
    num_stages = world * local
    mine = stages_of(rank, world, num_stages, placement_of(name))  # in a V for ZBV and DualPipeV
    modules = {s: stage_of(blocks, s, num_stages) for s in mine}
    stages = [lib.PipelineStage(modules[s], s, num_stages, DEVICE) for s in mine]
    schedule = getattr(lib, name)(stages[0] if local == 1 else stages, n, loss_fn=loss_fn)
    return schedule, modules


def settle() -> None:
    """Wait for the GPU's queued work (a step's time includes it); nothing on the CPU."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def single_process_ms(blocks: List[nn.Module], x: torch.Tensor, y: torch.Tensor, n: int, steps: int,
                      rounds: int) -> Tuple[float, List[torch.Tensor]]:
    model = copy.deepcopy(nn.Sequential(*blocks))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        for xm, ym in zip(x.tensor_split(n), y.tensor_split(n)):
            loss_fn(model(xm), ym).backward()
        for p in model.parameters():
            p.grad.div_(n)

    for _ in range(3):
        step()
    times = []
    for _ in range(rounds):
        settle()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        settle()
        times.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(times), [p.grad.clone() for p in model.parameters()]


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    global DEVICE
    torch.set_num_threads(1)
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda":
        torch.cuda.set_device(0)  # one GPU, shared by every rank
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results = [measure_model(model, rank, world, args) for model in args.models]
        if rank == 0:
            out.put(results)
    finally:
        dist.destroy_process_group()


def measure_model(model: str, rank: int, world: int, args: argparse.Namespace) -> Dict[str, Any]:
    make_blocks, shape = MODELS[model]
    blocks = [b.to(DEVICE) for b in make_blocks(args)]
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(shape(args), generator=gen).to(DEVICE), torch.randn(shape(args), generator=gen).to(DEVICE)
    n = args.microbatches
    single, ref = single_process_ms(blocks, x, y, n, args.steps, args.rounds) if rank == 0 else (0.0, [])
    dist.barrier()
    variants = [(name, lib) for name in args.schedules for lib in args.libraries]
    built = {v: build(v[1], v[0], blocks, rank, world, n) for v in variants}
    num_params = len(list(blocks[0].parameters()))

    def step(v: Tuple[str, str]) -> None:
        schedule, modules = built[v]
        for m in modules.values():
            m.zero_grad(set_to_none=True)
        stages = [s for s in modules]
        num_stages = world * SCHEDULES[v[0]]
        schedule.step(*((x,) if 0 in stages else ()), **({"target": y} if num_stages - 1 in stages else {}))
        settle()

    exact: Dict[Tuple[str, str], bool] = {}
    peak: Dict[Tuple[str, str], List[float]] = {}
    for v in variants:
        for _ in range(3):
            step(v)
        exact[v] = _exact(built[v][1], blocks, ref, num_params, world, SCHEDULES[v[0]], rank)
        saved = SavedBytes([p for m in built[v][1].values() for p in m.parameters()])
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, _unpack):
            step(v)
        gathered: List[Any] = [None] * world
        dist.all_gather_object(gathered, saved.peak / 2**20)
        peak[v] = gathered
    # the simulator's costs are host times: on a GPU, where the work is queued, they are not the stages' costs
    measured = ("ScheduleGPipe", "swpipeline") in built and DEVICE.type == "cpu"
    predicted: Dict[Tuple[str, str], List[float]] = {}

    def predict() -> None:
        """The simulator's ms/step for each single-stage schedule, from three GPipe steps measured now (so that the
        prediction sees the load the timed steps of this round see)."""
        from swpipeline.pp import simulate

        schedule, modules = built[("ScheduleGPipe", "swpipeline")]
        for m in modules.values():
            m.zero_grad(set_to_none=True)
        first, last = 0 in modules, world - 1 in modules
        costs = schedule.measure(*((x,) if first else ()), steps=3, **({"target": y} if last else {}))
        for name in args.schedules:
            if SCHEDULES[name] == 1:  # costs of one stage per rank: the interleaved schedules split them again
                predicted.setdefault((name, "swpipeline"), []).append(simulate(name, world, n, x.shape[0], costs))

    times: Dict[Tuple[str, str], List[float]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for v in variants:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                step(v)
            dist.barrier()
            times[v].append((time.perf_counter() - start) / args.steps * 1e3)
        if measured:
            predict()
    simulated = {v: statistics.median(values) for v, values in predicted.items()}
    actions = {name: sum(a is not None for row in built[(name, args.libraries[-1])][0].pipeline_order.values()
                         for a in row) for name in args.schedules}  # every rank's compute actions in a step
    return {"model": model, "single": single, "times": times, "peak": peak, "exact": exact, "simulated": simulated,
            "actions": actions}


def _exact(modules: Dict[int, nn.Module], blocks: List[nn.Module], ref: List[torch.Tensor], num_params: int,
           world: int, local: int, rank: int) -> bool:
    """Whether every rank's gradients after the last step equal the one-process model's (rank 0 has them)."""
    num_stages = world * local
    per = len(blocks) // num_stages * num_params
    grads = {s: [p.grad.clone() for p in m.parameters()] for s, m in modules.items()}
    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, grads)
    if rank != 0:
        return False
    every = {s: g for part in gathered for s, g in part.items()}
    return all(torch.equal(a, b) for s in range(num_stages) for a, b in zip(every[s], ref[s * per:(s + 1) * per]))


# -- the parent: start the ranks, print the table --------------------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def table(result: Dict[str, Any], args: argparse.Namespace) -> str:
    p, m = args.ranks, args.microbatches
    rows = []
    for (name, lib), runs in result["times"].items():
        median = statistics.median(runs)
        theirs = statistics.median(result["times"].get((name, "torch"), [math.nan]))
        bubble = 1 - result["single"] / (p * median)
        sim = result["simulated"].get((name, lib))
        sim_text = f"{sim:.1f} ({sim / median - 1:+.0%})" if sim is not None else ""
        other = (p * median - result["single"]) / result["actions"][name] * 1e3  # µs per action, not the model's
        rows.append([name.replace("Schedule", ""), lib, f"{median:.1f}", f"{min(runs):.1f}", f"{bubble:.0%}",
                     f"{other:.0f}",
                     f"{(p - 1) / (m + p - 1):.0%}", " / ".join(f"{v:.2f}" for v in result["peak"][(name, lib)]),
                     "" if math.isnan(theirs) else f"{theirs / median:.2f}",
                     "yes" if result["exact"][(name, lib)] else "NO", sim_text])
    head = (f"{result['model']}: {p} {args.backend} rank{'s' * (p > 1)} on {args.device}, {m} microbatches; "
            f"one process, one thread: "
            f"{result['single']:.1f} ms/step")
    return head + "\n" + format_table(["schedule", "library", "ms/step", "min", "bubble", "µs/action", "ideal",
                                       "peak act. MB per rank", "vs torch", "exact", "simulated"], rows, left=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=["tiny", "mlp", "transformer"], choices=sorted(MODELS))
    parser.add_argument("--schedules", nargs="+", default=DEFAULT_SCHEDULES, choices=list(SCHEDULES))
    parser.add_argument("--libraries", nargs="+", default=list(LIBRARIES), choices=LIBRARIES)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    args = parser.parse_args()
    print(machine_line())
    print(f"{args.ranks} ranks on {os.cpu_count()} cores: the ranks share them (one intra-op thread each)"
          + (f"; every stage on {torch.cuda.get_device_name(0)}, shared by the ranks" if args.device == "cuda" else "")
          + "\n")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args.ranks, port, args, out)) for r in range(args.ranks)]
    for proc in procs:
        proc.start()
    results = None
    while results is None:
        try:
            results = out.get(timeout=1.0)
        except queue.Empty:
            if any(proc.exitcode not in (None, 0) for proc in procs):
                for proc in procs:
                    proc.kill()
                raise SystemExit(f"a rank failed (exit codes {[proc.exitcode for proc in procs]}); its error is above")
    for proc in procs:
        proc.join()
    for result in results:
        print(table(result, args) + "\n")
    print(machine_line().splitlines()[0].replace("python", "after: python", 1))


if __name__ == "__main__":
    main()
