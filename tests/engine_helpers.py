"""Shared helpers for the engine tests: an execution log and small plan builders."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from hypothesis import strategies as st

from swpipeline import DeclaredIO, IterContext, PipelinePlan, PipelineTask, TaskSchedule

Event = Tuple[str, str, int, str]  # (kind, task, iter, thread name)

MakePipe = Callable[..., Any]  # an engine constructor: (plan, **kwargs) -> pipeline


class ExecLog:
    """Thread-safe log of task starts and ends with a global sequence number."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self.events: List[Tuple[int, str, str, int, str]] = []

    def mark(self, kind: str, task: str, iter_idx: int) -> None:
        with self._lock:
            self.events.append((next(self._counter), kind, task, iter_idx, threading.current_thread().name))

    def stamp(self) -> int:
        """A sequence number between the events', taken without the lock (a signal handler may call it)."""
        return next(self._counter)

    def task_fn(self, name: str, work: Optional[Callable[[Any], None]] = None) -> Callable[[Any], None]:
        def fn(ctx: Any) -> None:
            self.mark("start", name, ctx.iter_idx)
            if work is not None:
                work(ctx)
            self.mark("end", name, ctx.iter_idx)

        fn.__name__ = name
        return fn

    def seq(self, kind: str, task: str, iter_idx: int) -> int:
        for s, k, t, i, _ in self.events:
            if (k, t, i) == (kind, task, iter_idx):
                return s
        raise KeyError((kind, task, iter_idx))

    def starts(self) -> List[Tuple[str, int]]:
        return [(t, i) for _, k, t, i, _ in self.events if k == "start"]

    def starts_on(self, thread: str) -> List[Tuple[str, int]]:
        return [(t, i) for _, k, t, i, th in self.events if k == "start" and th == thread]

    def threads_of(self, task: str) -> set[str]:
        return {th for _, k, t, _, th in self.events if t == task}


def check_dependencies(log: ExecLog, plan: PipelinePlan, num_iters: int) -> int:
    """Assert every declared dependency ended before its consumer started, in every iteration.

    Returns the number of (dependency, iteration) pairs checked.
    """
    index: Dict[Tuple[str, str, int], int] = {(k, t, i): s for s, k, t, i, _ in log.events}
    checked = 0
    for it in range(num_iters):
        for task in plan.task_names:
            start = index[("start", task, it)]
            for dep in plan.intra[task]:
                assert index[("end", dep, it)] < start, f"{task}({it}) started before {dep}({it}) ended"
                checked += 1
            for dep, back in plan.inter[task]:
                if it >= back:
                    assert index[("end", dep, it - back)] < start, \
                        f"{task}({it}) started before {dep}({it - back}) ended"
                    checked += 1
    return checked


Fn = Callable[[IterContext], Any]
Spec = Dict[str, Tuple[int, Optional[str], str, Fn]]  # name -> (stage, stream, thread group, fn)
Pairs = Sequence[Tuple[str, str]]


def schedule_of(spec: Spec, io: Optional[Dict[str, List[DeclaredIO]]] = None) -> Dict[PipelineTask, TaskSchedule]:
    """The tasks of ``{name: (stage, stream, thread_group, fn)}`` (with their declared I/O, if given)."""
    io = io or {}
    return {PipelineTask(name, fn, io.get(name, [])): TaskSchedule(stage=stage, stream=stream, thread_group=group)
            for name, (stage, stream, group, fn) in spec.items()}


def plan_of(spec: Spec, intra: Pairs = (), inter: Pairs = (), io: Optional[Dict[str, List[DeclaredIO]]] = None
            ) -> PipelinePlan:
    """A plan of the tasks of ``{name: (stage, stream, thread_group, fn)}``."""
    return PipelinePlan(schedule_of(spec, io), list(intra), list(inter))


def make_plan(log: ExecLog, spec: Dict[str, Tuple[int, Any, str]], intra: Sequence[Tuple[str, str]] = (),
              inter: Sequence[Any] = (),
              work: Optional[Dict[str, Callable[[Any], None]]] = None) -> PipelinePlan:
    """A plan from ``{name: (stage, stream, thread_group)}`` whose tasks log to ``log``."""
    work = work or {}
    schedule = {
        PipelineTask(name, log.task_fn(name, work.get(name))): TaskSchedule(stage=stage, stream=stream,
                                                                             thread_group=group)
        for name, (stage, stream, group) in spec.items()
    }
    return PipelinePlan(schedule, list(intra), list(inter))


SPARSE_DIST_SPEC: Dict[str, Tuple[int, Any, str]] = {
    "H2D": (0, "memcpy", "io"),
    "InputDistStart": (1, "data_dist", "dist"),
    "InputDistWait": (1, "data_dist", "dist"),
    "ZeroGrad": (2, None, "default"),
    "WaitBatch": (2, None, "default"),
    "Forward": (2, None, "default"),
    "Backward": (2, None, "default"),
    "OptimizerStep": (2, None, "default"),
}
SPARSE_DIST_INTRA = [
    ("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"), ("WaitBatch", "InputDistWait"),
    ("Forward", "InputDistWait"), ("WaitBatch", "ZeroGrad"), ("Forward", "WaitBatch"),
    ("Backward", "Forward"), ("OptimizerStep", "Backward"),
]
SPARSE_DIST_INTER = [("Forward", "OptimizerStep")]


def sparse_dist_plan(log: ExecLog, single_group: bool = False,
                     work: Optional[Dict[str, Callable[[Any], None]]] = None) -> PipelinePlan:
    spec = {n: (s, st, "default" if single_group else g) for n, (s, st, g) in SPARSE_DIST_SPEC.items()}
    return make_plan(log, spec, SPARSE_DIST_INTRA, SPARSE_DIST_INTER, work)


def swp_threads() -> List[str]:
    """Names of live swpipeline worker threads."""
    return [t.name for t in threading.enumerate() if t.name.startswith("swp-")]


def drive(pipe: Any, data: Iterable[Any]) -> List[int]:
    """fill_pipeline + progress until StopIteration; returns the retired iteration indices."""
    return progress_until_stop(pipe, pipe.fill_pipeline(data))


def progress_until_stop(pipe: Any, it: Any) -> List[Any]:
    """Call ``pipe.progress(it)`` until StopIteration; returns what each call returned."""
    results = []
    while True:
        try:
            results.append(pipe.progress(it))
        except StopIteration:
            return results


def on_new_thread(call: Callable[[], Any]) -> List[Any]:
    """Run ``call`` on a fresh thread; returns [result] or [exception]."""
    out: List[Any] = []

    def target() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=target, name="newcomer")
    thread.start()
    thread.join(30)
    return out


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.001)
    return predicate()


class FakeStream:
    """A stream object for CPU tests: what the engine needs of one is its identity (and a display name)."""

    def __init__(self, name: Optional[str] = None) -> None:
        if name is not None:
            self.swp_name = name

    def wait_event(self, event: Any) -> None:
        """Streams order work after events; a lane needs nothing of it."""

    def wait_stream(self, stream: Any) -> None:
        """Streams order work after other streams; a lane needs nothing of it."""


# -- random plans (hypothesis) -------------------------------------------------------------------

STREAMS = [None, "s1", "s2"]
GROUPS = ["default", "g1", "g2"]


@st.composite
def valid_plans(draw: st.DrawFn) -> Dict[str, Any]:
    n = draw(st.integers(2, 12))
    names = [f"T{k}" for k in range(n)]
    stages = sorted(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    spec = {name: (stages[k], draw(st.sampled_from(STREAMS)), draw(st.sampled_from(GROUPS)))
            for k, name in enumerate(names)}
    # intra deps only from earlier-declared tasks: a DAG with stage(dep) <= stage(task) (the intra stage rule)
    intra = [(names[b], names[a]) for b in range(n) for a in range(b) if draw(st.booleans()) and draw(st.booleans())]
    # inter deps at distance d (a pair: d = 1) with stage(dep) - stage(task) <= d (the inter stage rule)
    inter: List[Any] = []
    for a in range(n):
        for b in range(n):
            if draw(st.integers(0, 5)) == 0:
                d = draw(st.sampled_from([1, 1, 2, 3]))
                if stages[b] - stages[a] <= d:
                    inter.append((names[a], names[b]) if d == 1 else (names[a], names[b], d))
    return {"spec": spec, "intra": intra, "inter": inter}


def output_plan(shape: Dict[str, Any]) -> Tuple[PipelinePlan, ExecLog, Dict[Tuple[str, int], int]]:
    """A plan whose tasks compute values from their dependencies' values (intra: this iteration, inter: the last)."""
    log = ExecLog()
    values: Dict[Tuple[str, int], int] = {}
    intra: Dict[str, List[str]] = {n: [] for n in shape["spec"]}
    inter: Dict[str, List[Tuple[str, int]]] = {n: [] for n in shape["spec"]}
    for task, dep in shape["intra"]:
        intra[task].append(dep)
    for task, dep, *back in shape["inter"]:
        inter[task].append((dep, back[0] if back else 1))

    def compute(name: str) -> Any:
        def fn(ctx: IterContext) -> None:
            i = ctx.iter_idx
            total = hash((name, ctx.batch)) % 1000
            total += sum(values[(d, i)] for d in intra[name])
            total += sum(values[(d, i - back)] for d, back in inter[name] if i >= back)
            values[(name, i)] = total % 1_000_003
        return fn

    work = {name: compute(name) for name in shape["spec"]}
    return make_plan(log, shape["spec"], shape["intra"], shape["inter"], work), log, values
