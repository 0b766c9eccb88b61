"""Resident memory (RSS) of a pipelined run: what the process holds, not what the contexts hold.

What is measured
    ``--iters`` iterations (default 10,000) of a 3-stage plan, each stage one task on its own
    thread group and stream (so allocating and freeing happen on different threads)::

        stage 0  Alloc:   ctx.x = torch.full((n,), i)          a --mib (default 4) MiB float32 tensor
        stage 1  Touch:   ctx.v = float(ctx.x[-1])
        stage 2  Consume: ctx.out = float(ctx.x[0]) + ctx.v; del ctx.x

    At most ``depth`` tensors are in flight, plus the one Alloc is writing, so the memory the
    run needs is bounded by ``(depth + 1) x mib``: 16 MiB at depth 3.

    Methods (``--methods``):

    * ``serial``: ``pipe.run_serial(data)``: every task on the caller's thread;
    * ``thread+Queue``: a hand-written producer ``threading.Thread`` runs Alloc and puts the
      context into a ``queue.Queue(maxsize=2)``; the caller's thread runs Touch and Consume;
    * ``SWPipeline``: ``SWPipeline(plan).run(data)`` (depth 3);
    * ``DataFlow(3)``, ``DataFlow(6)``: ``DataFlowPipeline(plan, max_depth=3 / 6).run(data)``;
    * ``SWPipeline-1group``: the same stages all on thread group "default": one worker thread
      allocates and frees, to separate "freed on another thread" from "several in flight".

Variants (each (method, variant) runs in a fresh Python process: glibc reads its ``MALLOC_*``
variables only at start-up, and a process's heap remembers what ran before)

    * ``default``: the environment as given;
    * ``MALLOC_MMAP_THRESHOLD_=131072``: pins glibc's mmap threshold at its default 128 KiB, so
      that every 4 MiB tensor is its own ``mmap`` and its ``free`` a ``munmap`` (without it, glibc
      raises the threshold to the size of any mmapped chunk that is freed, up to 32 MiB: after the
      first tensor is freed, 4 MiB tensors come from the allocating thread's heap arena);
    * ``MALLOC_TRIM_THRESHOLD_=131072``: setting any ``MALLOC_*`` threshold also switches the
      dynamic mmap threshold off: the same effect by another knob;
    * ``mallopt``: ``mallopt(M_MMAP_THRESHOLD, 131072)`` through ctypes at start-up: the same,
      without an environment variable (what a program, or a library, could do);
    * ``MALLOC_ARENA_MAX=1`` / ``=2``: at most 1 / 2 heap arenas, shared by all threads;
    * ``malloc_trim``: the default environment, and ``malloc_trim(0)`` after every ``run()``
      (its own column, ``trim +MiB``: RSS after the last trim);
    * ``numpy alloc``: Alloc makes the tensor with ``torch.from_numpy(np.full(...))``: numpy
      allocates with plain ``malloc`` (16-byte aligned) where torch's CPU allocator calls
      ``posix_memalign(64, n)``; the rest is unchanged (needs numpy);
    * ``jemalloc`` / ``tcmalloc``: ``LD_PRELOAD`` of ``libjemalloc.so.2`` / ``libtcmalloc_minimal.so.4``
      (Debian: ``apt-get install libjemalloc2 libtcmalloc-minimal4``), skipped where not installed.

Experiments (``--experiment``)
    * ``methods``: every method, default environment;
    * ``knobs``: thread+Queue and SWPipeline under every variant;
    * ``repeat``: thread+Queue and SWPipeline, ``--runs`` (default 5) consecutive ``run()`` calls
      of ``iters / runs`` iterations each (one pipeline, one process), under default,
      ``MALLOC_ARENA_MAX=1``, ``malloc_trim`` and ``jemalloc``; ``after each run`` lists RSS above
      the baseline after each run (before the trim, for ``malloc_trim``);
    * ``default`` (no option): ``methods``, then SWPipeline under every variant but the two
      aliases of ``MALLOC_MMAP_THRESHOLD_``, then SWPipeline's ``repeat`` rows;
    * ``all``: every method under every variant, and ``repeat``.
    ``--methods``/``--variants`` pick rows by hand instead.

How RSS is measured
    RSS is read from ``/proc/self/statm`` (psutil where there is no /proc). ``baseline``: after
    building the pipeline and ``gc.collect()``, just before the first run. ``peak``: the larger of
    the kernel's high-water mark ``VmHWM`` (/proc/self/status), reset just before the first run by
    writing 5 to /proc/self/clear_refs (it sees every page, but the kernel updates it lazily), and
    the largest sample of a background thread reading RSS every ``--sample-ms`` (default 1) ms. ``after``: after the
    last ``run()`` returned and ``gc.collect()``. Through weakrefs the run also counts the live
    big tensors (``peak tensors``) and the live ``IterContext`` objects (``peak ctx``, and ``ctx
    after``, once the run returned).

Columns: ``baseline MiB``; ``peak +MiB``, ``after +MiB`` and ``trim +MiB`` above the baseline;
``bound`` = (depth + 1) x mib; ``peak tensors``, ``peak ctx``, ``ctx after``; ``ms/it``, wall
time per iteration (for the cost of the knobs).

What it shows (glibc 2.36, torch 2.13 CPU; see benchmarks/README.md for the figures)
    The engine keeps no more than it should: at most depth + 1 tensors and contexts are alive,
    none after the run. The excess RSS is glibc's heap: torch allocates with
    ``posix_memalign(64, n)``, which glibc serves by taking a chunk 96 bytes (alignment + minimum
    chunk) larger than needed and giving the ends back, so a freed tensor's chunk never fits the
    next same-size request unless it merges with a free neighbour, and the small allocations
    interleaved with the tensors (TensorImpl, StorageImpl, ...) keep neighbours apart: the
    allocating thread's arena grows to 60-85 MiB. The same
    happens to the hand-written thread and to one thread alone (``SWPipeline-1group``); plain
    ``malloc`` (``numpy alloc``) stays near the bound. Freed memory stays resident in that arena
    after the run; ``malloc_trim(0)`` gives back free chunks but not a thread arena's top chunk,
    so it releases anything from all to nothing. Each ``run()`` starts new worker threads, which
    may pick another arena, so RSS can climb over consecutive runs (``repeat``).
    ``MALLOC_ARENA_MAX=1`` caps that but not the peak; the mmap threshold knobs give the bound
    at the price of an mmap, munmap and 1024 page faults per tensor (several times slower here);
    jemalloc gives the bound at full speed.

Run: ``python benchmarks/memory.py`` (about 5 minutes on the reference machine, most of it the
mmap-threshold row and starting 17 Python processes), ``--quick`` (1,000 iterations, about 1.5
minutes). ``--child METHOD`` runs one measurement in this process and prints it as JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import importlib.util
import json
import os
import queue
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

import swpipeline as swp
from _common import format_table, machine_line

MIB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number

METHODS = ("serial", "thread+Queue", "SWPipeline", "DataFlow(3)", "DataFlow(6)", "SWPipeline-1group")
DEPTH = {"serial": 1, "thread+Queue": 3, "SWPipeline": 3, "DataFlow(3)": 3, "DataFlow(6)": 6,
         "SWPipeline-1group": 3}  # thread+Queue: one in the producer, two in the queue

PRELOADS = {"jemalloc": "jemalloc", "tcmalloc": "tcmalloc_minimal"}

# variant -> (environment additions, child options); LD_PRELOAD variants are resolved in variant_setup()
VARIANTS: Dict[str, Tuple[Dict[str, str], List[str]]] = {
    "default": ({}, []),
    "MALLOC_MMAP_THRESHOLD_=131072": ({"MALLOC_MMAP_THRESHOLD_": "131072"}, []),
    "MALLOC_TRIM_THRESHOLD_=131072": ({"MALLOC_TRIM_THRESHOLD_": "131072"}, []),
    "mallopt": ({}, ["--mallopt-mmap-threshold", "131072"]),
    "MALLOC_ARENA_MAX=1": ({"MALLOC_ARENA_MAX": "1"}, []),
    "MALLOC_ARENA_MAX=2": ({"MALLOC_ARENA_MAX": "2"}, []),
    "malloc_trim": ({}, ["--malloc-trim"]),
    "numpy alloc": ({}, ["--alloc", "numpy"]),
    "jemalloc": ({}, []),
    "tcmalloc": ({}, []),
}
MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX", "MALLOC_TOP_PAD_",
              "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES", "LD_PRELOAD")

Pair = Tuple[str, str, int]  # method, variant, runs


ALIASES = ("MALLOC_TRIM_THRESHOLD_=131072", "mallopt")  # the same effect as MALLOC_MMAP_THRESHOLD_
REPEAT_VARIANTS = ("default", "MALLOC_ARENA_MAX=1", "malloc_trim", "jemalloc")


def experiment_pairs(name: str, runs: int) -> List[Pair]:
    """The rows of an experiment: (method, variant, runs)."""
    methods = [(m, "default", 1) for m in METHODS]
    both = ("thread+Queue", "SWPipeline")
    if name == "methods":
        return methods
    if name == "knobs":
        return [(m, v, 1) for v in VARIANTS if v != "default" for m in both]
    if name == "repeat":
        return [(m, v, runs) for v in REPEAT_VARIANTS for m in both]
    if name == "all":
        return [(m, v, 1) for v in VARIANTS for m in METHODS] + [(m, v, runs) for v in REPEAT_VARIANTS for m in both]
    # default: every method; SWPipeline under each knob (but the two aliases) and over consecutive runs
    knobs = [("SWPipeline", v, 1) for v in VARIANTS if v != "default" and v not in ALIASES]
    return methods + knobs + [("SWPipeline", v, runs) for v in REPEAT_VARIANTS]


# -- reading memory ----------------------------------------------------------------------------

class Rss:
    """The process's resident set size in bytes, and its kernel-kept peak where Linux offers one."""

    def __init__(self) -> None:
        self._fd: Optional[int] = None
        self._psutil: Any = None
        try:
            self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            try:
                import psutil
                self._psutil = psutil.Process()
            except ImportError as exc:
                raise SystemExit("memory.py needs /proc/self/statm (Linux) or psutil") from exc
        self.source = "/proc/self/statm" if self._fd is not None else "psutil"

    def now(self) -> int:
        if self._fd is not None:
            return int(os.pread(self._fd, 128, 0).split()[1]) * PAGE
        return int(self._psutil.memory_info().rss)

    @staticmethod
    def reset_peak() -> bool:
        """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is not possible."""
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    @staticmethod
    def kernel_peak() -> Optional[int]:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return None


class Sampler:
    """A background thread sampling RSS every ``period`` seconds; keeps the largest sample."""

    def __init__(self, rss: Rss, period: float) -> None:
        self.rss, self.period = rss, period
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss.now())
            self.samples += 1
            self._stop.wait(self.period)

    def __enter__(self) -> "Sampler":
        self.peak = self.rss.now()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss.now())


class LiveCounter:
    """How many objects registered with ``track`` are alive, and the most at once."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self._lock = threading.Lock()

    def track(self, obj: Any) -> None:
        with self._lock:
            self.live += 1
            self.peak = max(self.peak, self.live)
        weakref.finalize(obj, self._dead)

    def _dead(self) -> None:
        with self._lock:
            self.live -= 1


# -- the workload --------------------------------------------------------------------------------

class Workload:
    """The three task functions, with the live tensors and contexts counted."""

    def __init__(self, mib: float, alloc: str = "torch") -> None:
        self.numel = int(mib * MIB) // 4
        self.tensors = LiveCounter()
        self.contexts = LiveCounter()
        self._np: Any = None
        if alloc == "numpy":
            import numpy
            self._np = numpy

    def alloc(self, ctx: swp.IterContext) -> None:
        self.contexts.track(ctx)
        if self._np is None:
            x = torch.full((self.numel,), float(ctx.iter_idx))
        else:  # plain malloc instead of torch's posix_memalign
            x = torch.from_numpy(self._np.full((self.numel,), float(ctx.iter_idx), dtype=self._np.float32))
        self.tensors.track(x)
        ctx.x = x

    @staticmethod
    def touch(ctx: swp.IterContext) -> None:
        ctx.v = float(ctx.x[-1])

    @staticmethod
    def consume(ctx: swp.IterContext) -> None:
        ctx.out = float(ctx.x[0]) + ctx.v
        del ctx.x

    def plan(self, one_group: bool) -> swp.PipelinePlan:
        tasks = [swp.PipelineTask("Alloc", self.alloc), swp.PipelineTask("Touch", self.touch),
                 swp.PipelineTask("Consume", self.consume)]
        schedule = {t: (swp.TaskSchedule(stage=k) if one_group
                        else swp.TaskSchedule(stage=k, thread_group=t.name, stream=t.name))
                    for k, t in enumerate(tasks)}
        return swp.PipelinePlan(schedule, intra_iter_deps=[(tasks[1], tasks[0]), (tasks[2], tasks[1])])


def thread_queue_run(work: Workload, data: Iterable[Any]) -> float:
    """Producer thread: Alloc; the caller: Touch and Consume; a Queue(maxsize=2) between them."""
    q: "queue.Queue[Optional[swp.IterContext]]" = queue.Queue(maxsize=2)
    failure: List[BaseException] = []

    def producer() -> None:
        try:
            for i, batch in enumerate(data):
                ctx = swp.IterContext(batch, i)
                work.alloc(ctx)
                q.put(ctx)
                del ctx
        except BaseException as exc:
            failure.append(exc)
        finally:
            q.put(None)

    start = time.perf_counter()
    thread = threading.Thread(target=producer, name="producer", daemon=True)
    thread.start()
    while True:
        ctx = q.get()
        if ctx is None:
            break
        work.touch(ctx)
        work.consume(ctx)
        del ctx
    thread.join()
    elapsed = time.perf_counter() - start
    if failure:
        raise failure[0]
    return elapsed


def make_runner(method: str, work: Workload) -> Tuple[Callable[[Iterable[Any]], float], Any]:
    """The run function for ``method`` and the object to keep alive (the pipeline) while measuring."""
    if method == "thread+Queue":
        return (lambda data: thread_queue_run(work, data)), None
    plan = work.plan(one_group=(method == "SWPipeline-1group"))
    if method == "serial":
        pipe: Any = swp.SWPipeline(plan, device="cpu")
        return pipe.run_serial, pipe
    if method in ("SWPipeline", "SWPipeline-1group"):
        pipe = swp.SWPipeline(plan, device="cpu")
    else:
        pipe = swp.DataFlowPipeline(plan, max_depth=DEPTH[method], device="cpu")
    return pipe.run, pipe


def libc() -> Optional[ctypes.CDLL]:
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        lib = ctypes.CDLL(name)
        lib.malloc_trim  # glibc only
        return lib
    except (OSError, AttributeError):
        return None


def libc_version() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or "libc ?"
    except (AttributeError, ValueError, OSError):
        return "libc ?"


def measure(method: str, iters: int, runs: int, mib: float, sample_ms: float, malloc_trim: bool,
            mallopt_threshold: Optional[int], alloc: str) -> Dict[str, Any]:
    """One measurement in this process: ``runs`` consecutive runs of ``iters`` iterations."""
    lib = libc()
    if mallopt_threshold is not None:
        if lib is None or lib.mallopt(M_MMAP_THRESHOLD, mallopt_threshold) != 1:
            raise SystemExit("mallopt(M_MMAP_THRESHOLD) is not available here (not glibc?)")
    if malloc_trim and lib is None:
        raise SystemExit("malloc_trim is not available here (not glibc?)")
    torch.set_num_threads(1)
    work = Workload(mib, alloc)
    run, keep = make_runner(method, work)
    rss = Rss()
    gc.collect()
    baseline = rss.now()
    exact_peak = Rss.reset_peak()
    seconds = 0.0
    after_each: List[float] = []
    trimmed: Optional[int] = None
    trim_seconds = 0.0
    with Sampler(rss, sample_ms / 1e3) as sampler:
        for _ in range(runs):
            seconds += run(range(iters))
            gc.collect()
            after_each.append((rss.now() - baseline) / MIB)
            if malloc_trim:
                assert lib is not None
                start = time.perf_counter()
                lib.malloc_trim(0)
                trim_seconds += time.perf_counter() - start
                trimmed = rss.now()
    kernel_peak = Rss.kernel_peak() if exact_peak else None
    after = rss.now() if trimmed is None else baseline + int(after_each[-1] * MIB)
    result: Dict[str, Any] = {
        "method": method, "iters": iters, "runs": runs, "mib": mib, "seconds": seconds,
        "baseline": baseline / MIB,
        "peak": max(kernel_peak or 0, sampler.peak) / MIB,
        "sampled_peak": sampler.peak / MIB, "samples": sampler.samples,
        "peak_source": (f"VmHWM and samples every {sample_ms:g} ms" if kernel_peak is not None
                        else f"samples every {sample_ms:g} ms"),
        "after": after / MIB, "after_each": after_each,
        "peak_tensors": work.tensors.peak, "tensors_after": work.tensors.live,
        "peak_contexts": work.contexts.peak, "contexts_after": work.contexts.live,
        "env": {k: os.environ[k] for k in MALLOC_ENV if k in os.environ},
        "rss_source": rss.source,
    }
    if trimmed is not None:
        result["trimmed"] = trimmed / MIB
        result["trim_ms"] = trim_seconds / runs * 1e3
    del keep
    return result


# -- the driver ----------------------------------------------------------------------------------

def variant_setup(variant: str) -> Optional[Tuple[Dict[str, str], List[str]]]:
    """Environment additions and child options for ``variant``; None where it cannot run here."""
    env_add, options = VARIANTS[variant]
    if variant in PRELOADS:
        lib = ctypes.util.find_library(PRELOADS[variant])
        if lib is None:
            return None
        env_add = {"LD_PRELOAD": " ".join(filter(None, [os.environ.get("LD_PRELOAD"), lib]))}
    if variant == "numpy alloc" and importlib.util.find_spec("numpy") is None:
        return None
    return dict(env_add), list(options)


def run_child(method: str, variant: str, runs: int, args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    setup = variant_setup(variant)
    if setup is None:
        return None
    env_add, options = setup
    env = dict(os.environ)
    env.update(env_add)
    iters = max(1, args.iters // runs)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, "--iters", str(iters), "--runs", str(runs),
           "--mib", str(args.mib), "--sample-ms", str(args.sample_ms), *options]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{method} / {variant} failed:\n{proc.stderr}")
    result: Dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["variant"] = variant
    return result


def table_rows(results: Sequence[Dict[str, Any]]) -> List[List[str]]:
    rows = []
    for r in results:
        depth = DEPTH[r["method"]]
        base = r["baseline"]
        trim = f"{r['trimmed'] - base:.1f}" if "trimmed" in r else "--"
        each = "/".join(f"{a:.0f}" for a in r["after_each"]) if r["runs"] > 1 else "--"
        ms_it = r["seconds"] / (r["iters"] * r["runs"]) * 1e3
        rows.append([r["method"], r["variant"], f"{r['runs']}x{r['iters']}", f"{base:.1f}",
                     f"{r['peak'] - base:.1f}", f"{r['after'] - base:.1f}", trim, each,
                     f"{(depth + 1) * r['mib']:g}", str(r["peak_tensors"]), str(r["peak_contexts"]),
                     str(r["contexts_after"]), f"{ms_it:.2f}"])
    return rows


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--iters", type=int, default=None,
                        help="iterations of a measurement (default 10000; split over --runs in 'repeat')")
    parser.add_argument("--runs", type=int, default=None, help="consecutive run() calls in the 'repeat' "
                                                               "experiment (default 5); with --child, of that child")
    parser.add_argument("--mib", type=float, default=4.0, help="size of the tensor each iteration allocates")
    parser.add_argument("--sample-ms", type=float, default=1.0, help="RSS sampling period of the background "
                                                                     "thread (default 1 ms)")
    parser.add_argument("--experiment", choices=("default", "methods", "knobs", "repeat", "all"),
                        default="default",
                        help="which rows (see the module docstring); default: methods, knobs and repeat")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=None,
                        help="run these methods (with --variants, or the default environment) instead of --experiment")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=None,
                        help="run these variants (for --methods, or every method) instead of --experiment")
    parser.add_argument("--quick", action="store_true", help="1,000 iterations")
    parser.add_argument("--child", choices=METHODS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--malloc-trim", action="store_true",
                        help="with --child: call malloc_trim(0) after every run() and report RSS after it")
    parser.add_argument("--mallopt-mmap-threshold", type=int, default=None,
                        help="with --child: mallopt(M_MMAP_THRESHOLD, BYTES) before anything is measured")
    parser.add_argument("--alloc", choices=("torch", "numpy"), default="torch",
                        help="with --child: how Alloc makes its tensor (numpy: plain malloc)")
    args = parser.parse_args(argv)
    if args.iters is None:
        args.iters = 1000 if args.quick else 10000
    if args.runs is None:
        args.runs = 1 if args.child is not None else 5
    if args.iters < 1 or args.runs < 1 or args.mib <= 0:
        parser.error("--iters, --runs and --mib must be positive")
    return args


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)  # as in every child
    if args.child is not None:
        result = measure(args.child, args.iters, args.runs, args.mib, args.sample_ms, args.malloc_trim,
                         args.mallopt_mmap_threshold, args.alloc)
        print(json.dumps(result))
        return
    if args.methods or args.variants:  # their cross product, instead of --experiment
        pairs = [(m, v, 1) for v in (args.variants or ["default"]) for m in (args.methods or METHODS)]
    else:
        pairs = experiment_pairs(args.experiment, args.runs)
    print(f"RSS of {args.iters} iterations allocating a {args.mib:g} MiB tensor at stage 0 that stage 2 "
          f"frees; each row in a fresh process")
    print(machine_line())
    inherited = {k: os.environ[k] for k in MALLOC_ENV if k in os.environ}
    print(f"allocator environment inherited by every row: {inherited or 'none'}; {libc_version()}")
    sys.stdout.flush()
    results: List[Dict[str, Any]] = []
    skipped = set()
    for method, variant, runs in pairs:
        found = run_child(method, variant, runs, args)
        if found is None:
            skipped.add(variant)
            continue
        results.append(found)
        print(f"  done: {method} / {variant} ({found['env'] or 'no allocator variables'})",
              file=sys.stderr, flush=True)
    if results:
        print(f"RSS from {results[0]['rss_source']}; peak from {results[0]['peak_source']}")
    for variant in sorted(skipped):
        print(f"skipped variant {variant!r}: "
              f"{'numpy is not installed' if variant == 'numpy alloc' else 'the library is not installed'}")
    print()
    headers = ["method", "variant", "runs x it", "baseline MiB", "peak +MiB", "after +MiB", "trim +MiB",
               "after each run", "bound", "peak tensors", "peak ctx", "ctx after", "ms/it"]
    print(format_table(headers, table_rows(results), left=2))


if __name__ == "__main__":
    main()
