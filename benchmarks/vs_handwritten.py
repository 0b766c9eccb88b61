"""swpipeline vs what a user would write by hand: a plain loop, a thread + queue, torchdata.

What is measured
    One plan of 12 tasks ``T00 .. T11``, each depending on the one before it in the same
    iteration (a chain), on two thread groups::

        stage 0: T00 .. T05    thread group "load", stream "load"   (the input side)
        stage 1: T06 .. T08    thread group "default", default stream
        stage 2: T09 .. T11    thread group "default", default stream

    plus one inter-iteration dependency, T06(i) after T11(i-1) (like a forward pass waiting
    for the previous optimizer step). Each thread group carries half of the work, so the
    best any two-thread pipeline can do is a 2x speedup. The same task functions run in
    every column:

    * ``serial``: a plain loop, ``ctx = IterContext(batch, i)`` then every task in chain order
      (the baseline; ``pipe.run_serial`` costs within 0.1 us/task of it, see overhead.py);
    * ``thread+Queue``: a hand-written ``threading.Thread`` runs the stage-0 tasks of each
      iteration and puts the context into a ``queue.Queue(maxsize=2)``; the main thread
      takes contexts from the queue and runs the stage-1 and stage-2 tasks (a ``None``
      sentinel ends the run; the producer's exception, if any, is re-raised in the caller);
    * ``torchdata``: ``torchdata.nodes`` (if ``import torchdata`` works, else the column says
      "not installed"): ``Loader(Prefetcher(Mapper(IterableWrapper(contexts), stage0),
      prefetch_factor=2))``, so torchdata's prefetch thread runs the stage-0 tasks and the
      main thread the rest, the same split as ``thread+Queue``;
    * ``SWPipeline``: ``SWPipeline(plan).run(data)`` (clock-driven, depth = number of stages);
      ``run()`` runs the last stage's thread group ("default") on the caller's thread, like the
      main thread's share in ``thread+Queue``, and "load" on a worker thread;
    * ``DataFlow(3)``: ``DataFlowPipeline(plan, max_depth=3).run(data)``, which also runs
      "default" on the caller's thread;
    * ``SWP(workers)``, only with ``--workers-column``: ``SWPipeline(plan,
      caller_thread_group=None).run(data)``: every group on a worker thread, as ``SWPipeline``
      ran before ``run()`` took the last stage's group onto the caller's thread.

    Every timing includes starting and joining the threads.

Scenarios
    * ``fine-grained``: every task waits ``D`` us (``--durations``, default 5 10 20 50 100
      200) by a single-threaded ``torch.sin(x, out=y)`` on a tensor sized at start-up so
      that the call takes ``D`` us: a busy wait in C that releases the GIL for its whole
      length (each thread sets ``torch.set_num_threads(1)`` on its first task: the setting
      is per OS thread). Why not a sleep: with Linux's default 50 us timer slack,
      ``time.sleep``, ``select.select`` and ``threading.Event().wait`` of 5..50 us all take
      about D + 60 us on the reference machine (5 us -> 66 us, 50 us -> 111 us); with the
      slack set to 1 ns (``prctl(PR_SET_TIMERSLACK)``) still about D + 8..12 us (5 us ->
      11-17 us). ``torch.sin`` costs a fixed ~2-3 us plus ~1.6-2 ns per element here; the size
      is fitted at start-up, then corrected by measuring each D (aiming at 2% or 0.25 us);
      every task has tensors of its own. The table prints the wait a task really took (``D
      meas``, the median over the serial run's iterations): a loaded machine stretches it.
      Because it is a busy wait, two threads of tasks fill both cores of a 2-core machine:
      the engines' coordinating thread then competes with them.
      The ``break-even D`` lines below the table give, per column, the smallest swept ``D``
      from which on the pipelined run is at least as fast as serial (and, interpolated in
      log D, where the speedup crosses 1.0).
    * ``ms tasks``: every task ``time.sleep``s 1, 1.5 or 2 ms (9 ms per thread group, 18 ms
      per iteration), once as the 3-stage plan above and once with the same tasks declared
      as 2 stages (T00-T05 stage 0, T06-T11 stage 1). The target for ``SWPipeline`` is a
      1.9x speedup.

How to read the table
    ``serial us/it`` is the median wall time of the plain loop per iteration; every other
    column is the speedup over it, ``serial time / method time``, median over ``--repeats``
    runs (the methods are interleaved within each repeat so that machine drift hits them
    alike). ``ideal`` is 2.00x minus the unavoidable fill: ``2 * iters / (iters + 1)``.

    After the ms rows, one traced ``SWPipeline`` run of the 3-stage plan (``--trace PATH``
    writes it as Chrome/Perfetto JSON) gives, per thread, how long it had no unit in hand:
    between its last unit of a period and its first of the next (``period boundaries``,
    median and p95), between two units of one period, and the median dependency wait
    inside units. A thread that waits only for the hand-off itself shows a boundary gap
    of about one thread wake-up (25-30 us on this project's machine).

``--task-times D`` prints, instead, how long each task's wait of ``D`` us took as seen from
inside the task (the GIL-free call plus taking the GIL back), per thread group and method:
the share of a task a thread spends waiting for the other thread's Python code. One more
row runs the hand-written loop with 2.5 us of plain Python added after each main-thread
task, to compare the engines with a hand-written loop that does that much Python.

Run: ``python benchmarks/vs_handwritten.py`` (about 2 minutes), ``--quick`` for a ~15 s
smoke run.
"""

from __future__ import annotations

import argparse
import math
import queue
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import torch

import swpipeline as swp
from _common import format_table, machine_line

try:  # torchdata >= 0.10 (the nodes API)
    from torchdata.nodes import IterableWrapper, Loader, Mapper, Prefetcher
    HAVE_TORCHDATA = True
except ImportError:
    HAVE_TORCHDATA = False

NUM_TASKS = 12
LOAD_TASKS = 6  # T00 .. T05: stage 0, thread group "load"; the rest on "default"
STAGES_3 = [0] * 6 + [1] * 3 + [2] * 3
STAGES_2 = [0] * 6 + [1] * 6
MS_COSTS = [1.0, 2.0, 1.5, 1.5, 2.0, 1.0, 2.0, 1.0, 1.5, 1.0, 2.0, 1.5]  # 9 ms per thread group
assert sum(MS_COSTS[:LOAD_TASKS]) == sum(MS_COSTS[LOAD_TASKS:])

METHODS = ("thread+Queue", "torchdata", "SWPipeline", "DataFlow(3)")
WORKERS = "SWP(workers)"  # --workers-column: SWPipeline(plan, caller_thread_group=None)
Task = Callable[[swp.IterContext], None]


# -- waits ----------------------------------------------------------------------------------

_thread_state = threading.local()


def one_torch_thread() -> None:
    """torch.set_num_threads(1) once per OS thread (the setting is not inherited by new threads)."""
    if not getattr(_thread_state, "ready", False):
        torch.set_num_threads(1)
        _thread_state.ready = True


class SinWait:
    """A GIL-releasing busy wait: one ``torch.sin(x, out=y)`` sized to take about ``us`` microseconds.

    Every instance has tensors of its own, so that tasks on different threads never write the
    same memory (which would make the cores fight over cache lines).
    """

    MAX_ELEMS = 1 << 20
    _fixed_us = 0.0
    _per_elem_us = 0.0

    @classmethod
    def calibrate(cls) -> None:
        """Fit time = fixed + n * per_elem from medians at two sizes (single-threaded)."""
        one_torch_thread()
        x_all, y_all = torch.rand(16384), torch.empty(16384)

        def med_us(n: int, reps: int = 400) -> float:
            x, y = x_all[:n], y_all[:n]
            for _ in range(20):
                torch.sin(x, out=y)
            samples = []
            for _ in range(reps):
                start = time.perf_counter()
                torch.sin(x, out=y)
                samples.append(time.perf_counter() - start)
            return statistics.median(samples) * 1e6

        small, large = 256, 16384
        t_small, t_large = med_us(small), med_us(large)
        cls._per_elem_us = max((t_large - t_small) / (large - small), 1e-6)
        cls._fixed_us = max(t_small - small * cls._per_elem_us, 0.0)

    def __init__(self, us: float, numel: Optional[int] = None) -> None:
        self.us = us
        self._size(round((us - self._fixed_us) / self._per_elem_us) if numel is None else numel)

    def _size(self, n: int) -> None:
        n = max(1, min(n, self.MAX_ELEMS))
        self.x, self.y = torch.rand(n), torch.empty(n)

    def copy(self) -> "SinWait":
        """A wait of the same size, with tensors of its own."""
        return SinWait(self.us, self.x.numel())

    def __call__(self) -> None:
        torch.sin(self.x, out=self.y)

    def measured_us(self, reps: int = 300) -> float:
        """The median duration of one call, in us."""
        one_torch_thread()
        for _ in range(20):
            self()
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            self()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) * 1e6

    def refine(self, rounds: int = 4) -> "SinWait":
        """Correct the size by measuring (the linear fit is off on a busy machine); returns self."""
        for _ in range(rounds):
            error_us = self.us - self.measured_us()
            if abs(error_us) <= max(0.25, 0.02 * self.us):
                break
            self._size(self.x.numel() + round(error_us / self._per_elem_us))
        return self


def make_tasks(waits: Sequence[Callable[[], None]], timed: Optional[List[float]] = None) -> List[Task]:
    """The 12 task functions; each calls its wait. ``timed``, if given, collects T00's wait times."""

    def make(k: int) -> Task:
        wait = waits[k]
        if k == 0 and timed is not None:
            def task(ctx: swp.IterContext) -> None:
                one_torch_thread()
                start = time.perf_counter()
                wait()
                timed.append(time.perf_counter() - start)
        else:
            def task(ctx: swp.IterContext) -> None:
                one_torch_thread()
                wait()
        task.__name__ = f"T{k:02d}"
        return task

    return [make(k) for k in range(NUM_TASKS)]


def build_plan(fns: Sequence[Task], stages: Sequence[int]) -> swp.PipelinePlan:
    tasks = [swp.PipelineTask(f"T{k:02d}", fn) for k, fn in enumerate(fns)]
    schedule = {}
    for k, task in enumerate(tasks):
        if k < LOAD_TASKS:
            schedule[task] = swp.TaskSchedule(stage=stages[k], thread_group="load", stream="load")
        else:
            schedule[task] = swp.TaskSchedule(stage=stages[k])
    intra = [(tasks[k], tasks[k - 1]) for k in range(1, NUM_TASKS)]
    inter = [(tasks[LOAD_TASKS], tasks[-1])]
    return swp.PipelinePlan(schedule, intra_iter_deps=intra, inter_iter_deps=inter)


# -- the methods ------------------------------------------------------------------------------

def run_plain(fns: Sequence[Task], data: Iterable[Any]) -> float:
    start = time.perf_counter()
    for i, batch in enumerate(data):
        ctx = swp.IterContext(batch, i)
        for fn in fns:
            fn(ctx)
    return time.perf_counter() - start


def run_thread_queue(fns: Sequence[Task], data: Iterable[Any]) -> float:
    """A producer thread runs the stage-0 tasks, the caller the rest; a Queue(maxsize=2) between them."""
    first, rest = fns[:LOAD_TASKS], fns[LOAD_TASKS:]
    q: "queue.Queue[Optional[swp.IterContext]]" = queue.Queue(maxsize=2)
    failure: List[BaseException] = []

    def producer() -> None:
        try:
            for i, batch in enumerate(data):
                ctx = swp.IterContext(batch, i)
                for fn in first:
                    fn(ctx)
                q.put(ctx)
        except BaseException as exc:  # handed to the caller after the sentinel
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
        for fn in rest:
            fn(ctx)
    thread.join()
    elapsed = time.perf_counter() - start
    if failure:
        raise failure[0]
    return elapsed


def run_torchdata(fns: Sequence[Task], data: Iterable[Any]) -> float:
    """torchdata.nodes: the prefetch thread maps the stage-0 tasks over the contexts, the caller runs the rest."""
    first, rest = fns[:LOAD_TASKS], fns[LOAD_TASKS:]

    def stage0(ctx: swp.IterContext) -> swp.IterContext:
        for fn in first:
            fn(ctx)
        return ctx

    start = time.perf_counter()
    contexts = (swp.IterContext(batch, i) for i, batch in enumerate(data))
    loader = Loader(Prefetcher(Mapper(IterableWrapper(contexts), stage0), prefetch_factor=2))
    for ctx in loader:
        for fn in rest:
            fn(ctx)
    return time.perf_counter() - start


def engine_runner(plan: swp.PipelinePlan, engine: str, device: str) -> Callable[[Iterable[Any]], float]:
    pipe: swp.SWPipeline | swp.DataFlowPipeline
    if engine == "SWPipeline":
        pipe = swp.SWPipeline(plan, device=device)
    elif engine == WORKERS:
        pipe = swp.SWPipeline(plan, device=device, caller_thread_group=None)
    else:
        pipe = swp.DataFlowPipeline(plan, max_depth=3, device=device)
    return lambda data: pipe.run(data)


# -- measuring ----------------------------------------------------------------------------------

@dataclass
class Row:
    scenario: str
    label: str  # the D or the plan shape
    wait_us: Optional[float]  # measured per-task wait (fine-grained), else None
    serial: List[float]  # seconds per run
    seconds: Dict[str, List[float]]  # method -> seconds per run
    iters: int

    def speedups(self, method: str) -> Optional[List[float]]:
        runs = self.seconds.get(method)
        if not runs:
            return None
        return [s / m for s, m in zip(self.serial, runs)]

    def median_speedup(self, method: str) -> Optional[float]:
        values = self.speedups(method)
        return statistics.median(values) if values else None


def measure(scenario: str, label: str, fns: Sequence[Task], stages: Sequence[int], iters: int,
            repeats: int, device: str, timed: Optional[List[float]] = None, workers_column: bool = False) -> Row:
    plan = build_plan(fns, stages)
    runners: Dict[str, Callable[[Iterable[Any]], float]] = {
        "thread+Queue": lambda d: run_thread_queue(fns, d),
        "SWPipeline": engine_runner(plan, "SWPipeline", device),
        "DataFlow(3)": engine_runner(plan, "DataFlow(3)", device),
    }
    if HAVE_TORCHDATA:
        runners["torchdata"] = lambda d: run_torchdata(fns, d)
    if workers_column:
        runners[WORKERS] = engine_runner(plan, WORKERS, device)
    warm = list(range(min(iters, 20)))
    run_plain(fns, warm)
    for run in runners.values():  # warm-up: first thread starts, imports, caches
        run(warm)
    serial: List[float] = []
    seconds: Dict[str, List[float]] = {m: [] for m in runners}
    wait_us: Optional[float] = None
    for _ in range(repeats):
        if timed is not None:
            timed.clear()
        serial.append(run_plain(fns, range(iters)))
        if timed is not None and timed:
            wait_us = statistics.median(timed) * 1e6
        for method in (*METHODS, WORKERS):
            if method in runners:
                seconds[method].append(runners[method](range(iters)))
    return Row(scenario, label, wait_us, serial, seconds, iters)


def fine_iters(us: float, target_s: float, min_iters: int) -> int:
    """Iterations so that a serial run takes about target_s (at least min_iters)."""
    per_iter = NUM_TASKS * (us + 3.0) * 1e-6  # + ~3 us per task: the call and the wait's own overhead
    return max(min_iters, int(target_s / per_iter))


def break_even(rows: Sequence[Row], method: str) -> str:
    """Smallest swept D from which on the speedup stays >= 1, and the log-interpolated crossing."""
    points = [(float(r.label), r.median_speedup(method)) for r in rows]
    if any(s is None for _, s in points):
        return "--"
    points.sort()
    from_index = len(points)
    for k in range(len(points) - 1, -1, -1):
        if points[k][1] >= 1.0:  # type: ignore[operator]
            from_index = k
        else:
            break
    if from_index == len(points):
        return f"> {points[-1][0]:g} us"
    if from_index == 0:
        return f"<= {points[0][0]:g} us"
    (d0, s0), (d1, s1) = points[from_index - 1], points[from_index]
    frac = (1.0 - s0) / (s1 - s0) if s1 != s0 else 1.0  # type: ignore[operator]
    crossing = math.exp(math.log(d0) + frac * (math.log(d1) - math.log(d0)))
    return f"{d1:g} us (crosses 1.0 near {crossing:.0f} us)"


def format_rows(rows: Sequence[Row], methods: Sequence[str]) -> List[List[str]]:
    out = []
    for r in rows:
        serial_us = statistics.median(r.serial) / r.iters * 1e6
        cells = [r.scenario, r.label, f"{r.wait_us:.1f}" if r.wait_us is not None else "--", str(r.iters),
                 f"{serial_us:.0f}"]
        for method in methods:
            sp = r.median_speedup(method)
            cells.append("not installed" if method == "torchdata" and not HAVE_TORCHDATA
                         else f"{sp:.2f}x" if sp is not None else "--")
        cells.append(f"{2 * r.iters / (r.iters + 1):.2f}x")
        out.append(cells)
    return out


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--durations", type=float, nargs="+", default=None,
                        help="fine-grained task durations in us (default 5 10 20 50 100 200)")
    parser.add_argument("--iters", type=int, default=None,
                        help="iterations of the ms-task runs (default 100); fine-grained runs size theirs so "
                             "that a serial run takes ~0.15 s, at least 200")
    parser.add_argument("--repeats", type=int, default=5, help="runs per method, the median is shown (default 5)")
    parser.add_argument("--device", default="cpu", help="engine device (default cpu)")
    parser.add_argument("--quick", action="store_true", help="a ~15 s smoke run: 3 durations, fewer iterations, "
                                                             "1 repeat")
    parser.add_argument("--only", choices=("fine-grained", "ms"), default=None, help="run one scenario only")
    parser.add_argument("--trace", default=None, metavar="PATH",
                        help="write the traced run of the ms-task plan (period-boundary gaps) to PATH as Chrome/"
                             "Perfetto trace JSON")
    parser.add_argument("--task-times", type=float, default=None, metavar="D",
                        help="instead of the tables: with tasks of D us, how long each task's wait took inside the "
                             "task (taking the GIL back included), per thread group, under each method")
    parser.add_argument("--workers-column", action="store_true",
                        help=f"add a column {WORKERS!r}: SWPipeline(plan, caller_thread_group=None), every thread "
                             f"group on a worker thread")
    args = parser.parse_args(argv)
    if args.durations is None:
        args.durations = [10.0, 50.0, 200.0] if args.quick else [5.0, 10.0, 20.0, 50.0, 100.0, 200.0]
    if args.quick and args.repeats == parser.get_default("repeats"):
        args.repeats = 1
    if args.iters is None:
        args.iters = 30 if args.quick else 100
    if args.iters < 1 or args.repeats < 1 or min(args.durations) <= 0:
        parser.error("--iters, --repeats and --durations must be positive")
    return args


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    one_torch_thread()
    SinWait.calibrate()
    print(f"swpipeline vs hand-written pipelining: 12 tasks, 2 thread groups (6 + 6), median of {args.repeats}")
    print(machine_line())
    print(f"torchdata: {'torchdata.nodes ' + _torchdata_version() if HAVE_TORCHDATA else 'not installed'}; "
          f"fine-grained wait: torch.sin, {SinWait._fixed_us:.1f} us + {SinWait._per_elem_us * 1e3:.2f} ns/element")
    print()

    if args.task_times is not None:
        print_task_times(args.task_times, args.repeats, args.device)
        return
    fine: List[Row] = []
    ms_rows: List[Row] = []
    target_s = 0.05 if args.quick else 0.15
    min_iters = 100 if args.quick else 200
    if args.only in (None, "fine-grained"):
        for us in args.durations:
            timed: List[float] = []
            wait = SinWait(us).refine()
            fns = make_tasks([wait] + [wait.copy() for _ in range(NUM_TASKS - 1)], timed)
            fine.append(measure("fine-grained", f"{us:g}", fns, STAGES_3, fine_iters(us, target_s, min_iters),
                                args.repeats, args.device, timed, args.workers_column))
    if args.only in (None, "ms"):
        fns = make_tasks([_sleeper(ms) for ms in MS_COSTS])
        for label, stages in (("3 stages", STAGES_3), ("2 stages", STAGES_2)):
            ms_rows.append(measure("ms tasks", label, fns, stages, args.iters, args.repeats, args.device,
                                   workers_column=args.workers_column))

    methods = (*METHODS, WORKERS) if args.workers_column else METHODS
    headers = ["scenario", "D us / plan", "D meas", "iters", "serial us/it", *methods, "ideal"]
    print(format_table(headers, format_rows(fine + ms_rows, methods), left=2))
    if fine:
        print()
        print("break-even D (the smallest swept D from which on the pipelined run is >= serial):")
        for method in methods:
            text = "not installed" if method == "torchdata" and not HAVE_TORCHDATA else break_even(fine, method)
            print(f"  {method:<13} {text}")
    if ms_rows:
        print()
        for r in ms_rows:
            sp = r.median_speedup("SWPipeline")
            if sp is not None:
                print(f"ms tasks, {r.label}: SWPipeline {sp:.2f}x over serial, target >= 1.9x: "
                      f"{'met' if sp >= 1.9 else 'NOT met'} (ideal at {r.iters} iterations: "
                      f"{2 * r.iters / (r.iters + 1):.2f}x)")
        print_boundary_gaps(make_tasks([_sleeper(ms) for ms in MS_COSTS]), args.iters, args.device, args.trace)


class TimedWait:
    """A wait that also records how long each call took, as seen from Python: the GIL-free ``torch.sin`` plus
    taking the GIL back afterwards, which another thread's Python code can delay."""

    def __init__(self, wait: SinWait, seconds: List[float]) -> None:
        self.wait, self.seconds = wait, seconds

    def __call__(self) -> None:
        start = time.perf_counter()
        self.wait()
        self.seconds.append(time.perf_counter() - start)  # one thread per task: list.append is enough


EXTRA_PYTHON_US = 2.5  # --task-times: the hand-written loop again, with this much more Python per main-thread task


def python_spin(us: float) -> Callable[[], None]:
    """A function that runs plain Python bytecode (holding the GIL) for about ``us`` microseconds."""

    def spin_for(n: int) -> Callable[[], None]:
        def spin() -> None:
            for _ in range(n):
                pass
        return spin

    probe, reps = spin_for(10_000), 20
    start = time.perf_counter()
    for _ in range(reps):
        probe()
    per_step = (time.perf_counter() - start) / (reps * 10_000)
    return spin_for(max(1, round(us * 1e-6 / per_step)))


def _then(fn: Task, extra: Callable[[], None]) -> Task:
    def task(ctx: swp.IterContext) -> None:
        fn(ctx)
        extra()
    return task


def print_task_times(us: float, repeats: int, device: str) -> None:
    """The ``--task-times`` table: per method, us per iteration and each thread group's task times (mean, p90)."""
    wait = SinWait(us).refine()
    load_s: List[float] = []
    rest_s: List[float] = []
    fns = make_tasks([TimedWait(wait.copy(), load_s if k < LOAD_TASKS else rest_s) for k in range(NUM_TASKS)])
    plan = build_plan(fns, STAGES_3)
    iters = fine_iters(us, 0.3, 500)
    spin = python_spin(EXTRA_PYTHON_US)
    with_python = [fn if k < LOAD_TASKS else _then(fn, spin) for k, fn in enumerate(fns)]
    runs: Dict[str, Callable[[Iterable[Any]], float]] = {
        "serial": lambda data: run_plain(fns, data), "thread+Queue": lambda data: run_thread_queue(fns, data),
        f"thread+Queue, +{EXTRA_PYTHON_US:g} us Python": lambda data: run_thread_queue(with_python, data),
        "SWPipeline": engine_runner(plan, "SWPipeline", device), "DataFlow(3)": engine_runner(plan, "DataFlow", device)}
    rows = []
    for name, run in runs.items():
        per_it: List[float] = []
        load_all: List[float] = []
        rest_all: List[float] = []
        for _ in range(repeats):
            load_s.clear()
            rest_s.clear()
            per_it.append(run(range(iters)) / iters)
            load_all += load_s
            rest_all += rest_s
        load_us, rest_us = [t * 1e6 for t in load_all], [t * 1e6 for t in rest_all]
        rows.append([name, f"{statistics.median(per_it) * 1e6:.0f}", f"{statistics.mean(load_us):.1f}",
                     _us(load_us, 90), f"{statistics.mean(rest_us):.1f}", _us(rest_us, 90)])
    print(f"tasks of {us:g} us (one call alone: {wait.measured_us():.1f} us), {iters} iterations x {repeats}: how "
          f"long each task's wait took inside the task, in us")
    print(format_table(["method", "us/it", "load: mean", "p90", "default: mean", "p90"], rows, left=1))


def boundary_gaps(timeline: Any) -> List[List[str]]:
    """Per thread group of a traced SWPipeline run: how long its thread had no unit in hand, split into
    the gaps that cross a period boundary (its last unit of period P to its first of P + 1) and those
    inside a period. A unit is "in hand" from when the thread picks it up (``ready``, before its
    dependency waits) to when its task returns."""
    rows = []
    for group in timeline.thread_groups:
        units = sorted((r for r in timeline.records if r.thread_group == group), key=lambda r: r.ready)
        across: List[float] = []
        inside: List[float] = []
        for prev, nxt in zip(units, units[1:]):
            (across if nxt.period != prev.period else inside).append(max(0.0, nxt.ready - prev.cpu_end) * 1e6)
        waits = [r.wait * 1e6 for r in units]
        rows.append([timeline.thread_label(group), str(len(across)), _us(across, 50), _us(across, 95),
                     _us(inside, 50), _us(waits, 50)])
    return rows


def _us(values: List[float], pct: int) -> str:
    if not values:
        return "--"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, math.ceil(pct / 100 * len(ordered)) - 1)]:.0f}"


def print_boundary_gaps(fns: Sequence[Task], iters: int, device: str, trace: Optional[str]) -> None:
    pipe = swp.SWPipeline(build_plan(fns, STAGES_3), device=device)
    pipe.run(range(iters), trace=trace or True)
    print()
    print(f"ms tasks, 3 stages, one traced SWPipeline run{f' (written to {trace})' if trace else ''}: idle time of "
          f"each thread between units, in us")
    print(format_table(["thread", "period boundaries", "gap median", "gap p95", "inside a period median",
                        "dependency wait median"], boundary_gaps(pipe.timeline), left=1))


def _sleeper(ms: float) -> Callable[[], None]:
    seconds = ms / 1e3
    return lambda: time.sleep(seconds)


def _torchdata_version() -> str:
    try:
        import torchdata
        return str(getattr(torchdata, "__version__", "?"))
    except ImportError:
        return "?"


if __name__ == "__main__":
    main()
