"""Ctrl-C: a KeyboardInterrupt delivered at any moment surfaces as itself and abandons what is in flight.

A real SIGINT is sent to the main thread (where pytest runs the test) at random moments
of a run: during the fill, while a task runs, while the caller waits, while the data
iterator fetches, between fetching a batch and handing out its work, during the final
drain. Every time, the interrupt must reach the caller as a KeyboardInterrupt (not a
timeout error a few seconds later, which is what a swallowed interrupt turns into
here: the timeouts are set to 5 s), every worker must be joined, and the pipeline must
run again afterwards. The interrupt-free path must stay bitwise the same.
"""

from __future__ import annotations

import collections
import random
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, List

import pytest

import swpipeline
from engine_helpers import ExecLog, check_dependencies, drive, sparse_dist_plan, swp_threads
from swpipeline import DataFlowPipeline, IterContext, SWPipeline


# Plans here put several thread groups on one stream on purpose (the turns are what is tested).
pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")

MakePipe = Callable[..., Any]
TIMEOUTS = dict(signal_timeout=5.0, progress_timeout=5.0, join_timeout=5.0)


@pytest.fixture(params=["SWPipeline", "SWPipeline-caller-group", "DataFlowPipeline", "DataFlowPipeline-caller-group"])
def make_pipe(request: pytest.FixtureRequest) -> MakePipe:
    # run() runs the last stage's group on the calling thread; "-caller-group" does it in step control too
    if request.param == "SWPipeline":
        return lambda plan: SWPipeline(plan, device="cpu", **TIMEOUTS)
    if request.param == "SWPipeline-caller-group":
        return lambda plan: SWPipeline(plan, device="cpu", caller_thread_group="default", **TIMEOUTS)
    if request.param == "DataFlowPipeline-caller-group":
        return lambda plan: DataFlowPipeline(plan, max_depth=3, device="cpu", caller_thread_group="default",
                                             **TIMEOUTS)
    return lambda plan: DataFlowPipeline(plan, max_depth=3, device="cpu", **TIMEOUTS)


DELIVERED = {"count": 0}  # SIGINTs whose handler ran
ON_SIGINT: List[Callable[[], None]] = []  # called by the handler, on the main thread, before it raises
# A SIGINT not handled within this long was lost. (One that reaches the main thread just as it enters a
# lock wait is handled only when that wait ends: Python runs handlers between bytecodes, and the signal
# interrupted nothing. The engine's waits here end within 5 s, TIMEOUTS.)
DELIVERY_BOUND_S = 30.0


def _sigint(signum: int, frame: Any) -> None:
    DELIVERED["count"] += 1
    for hook in ON_SIGINT:
        hook()
    raise KeyboardInterrupt  # what Python's default handler does


@pytest.fixture(autouse=True)
def counting_sigint_handler() -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, _sigint)
    yield
    signal.signal(signal.SIGINT, previous)
    ON_SIGINT.clear()


INTERRUPTERS: List[threading.Thread] = []  # kept alive: a Thread freed on this thread runs a weakref callback


def sigint_after(delay: float, log: ExecLog) -> None:
    main = threading.main_thread().ident
    assert main is not None

    def fire() -> None:
        time.sleep(delay)
        log.mark("sigint", "-", -1)
        signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=fire, name="interrupter", daemon=True)
    INTERRUPTERS.append(thread)  # (in which a Ctrl-C would be lost: that would be the harness's fault)
    thread.start()


def interrupted(action: Callable[[], None], delay: float, log: ExecLog) -> bool:
    """Run ``action`` with a SIGINT arriving after ``delay``; True if the interrupt stopped it."""
    finished = False
    expected = DELIVERED["count"] + 1
    try:
        try:
            sigint_after(delay, log)  # (with delay 0 it may land while the interrupter starts)
            action()
            finished = True
        finally:
            deadline = time.monotonic() + delay + DELIVERY_BOUND_S
            while DELIVERED["count"] < expected:  # the signal lands here at the latest (sleep is interruptible)
                if time.monotonic() > deadline:
                    pytest.fail(f"a SIGINT sent {delay:.4f} s into the action was not handled within "
                                f"{DELIVERY_BOUND_S:g} s after")
                time.sleep(0.0005)
    except KeyboardInterrupt:
        return not finished
    return False


def batches(n: int, rng: random.Random) -> Iterator[int]:
    for k in range(n):
        if rng.random() < 0.2:
            time.sleep(0.0005)  # a slow fetch now and then: the caller is inside next()
        yield k


def jittery(rng: random.Random) -> Callable[[IterContext], None]:
    def work(ctx: IterContext) -> None:
        if rng.random() < 0.3:
            time.sleep(0.0003)
    return work


SRC = str(Path(swpipeline.__file__).parent)


def _ours(unraisable: Any) -> bool:
    """Whether Python code of this package was where an exception was swallowed ("Exception ignored in")."""
    code = getattr(getattr(unraisable.object, "__func__", unraisable.object), "__code__", None)
    frames = traceback.extract_tb(unraisable.exc_traceback) if unraisable.exc_traceback is not None else []
    files = [f.filename for f in frames] + ([code.co_filename] if code is not None else [])
    return any(name.startswith(SRC) for name in files)


def test_swallowed_exceptions_are_told_apart_by_whose_code_swallowed_them() -> None:
    import types
    import weakref

    from swpipeline import errors
    from swpipeline.engine import parts as base

    def swallowed(obj: Any, tb: Any = None) -> Any:
        return types.SimpleNamespace(object=obj, exc_traceback=tb, err_msg=None)

    try:
        base._seconds("timeout", "soon")  # raises inside this package
    except TypeError as exc:
        raised_in_ours = exc.__traceback__
    assert _ours(swallowed(errors.add_note))  # a callback of ours
    assert _ours(swallowed(weakref.WeakKeyDictionary.__init__, raised_in_ours))  # foreign callback, our frame
    assert not _ours(swallowed(weakref.WeakKeyDictionary.__init__))  # a library's cleanup
    assert not _ours(swallowed(None))


RANDOM_SIGINTS = 200  # interrupts that must land inside a run
RANDOM_SIGINT_MAX_TRIALS = 900  # about 400 are needed on an idle machine
RANDOM_SIGINT_BUDGET_S = 120.0  # about 1.5 s are needed on an idle machine


def test_sigint_at_random_moments_always_surfaces_and_leaves_nothing_behind(make_pipe: MakePipe,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # An interrupt that lands in Python code the garbage collector runs is swallowed by Python ("Exception
    # ignored in ..."). None of that code may be ours (the engine keeps its finalizers in C for this reason);
    # other libraries' (hypothesis's gc callback, a WeakKeyDictionary's cleanup) are beyond our reach: such an
    # interrupt is simply not counted as having landed.
    swallowed: List[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", swallowed.append)
    rng = random.Random(20261124)
    log = ExecLog()
    work = {name: jittery(random.Random(k)) for k, name in enumerate(["H2D", "InputDistWait", "Forward"])}
    plan = sparse_dist_plan(log, work=work)
    pipe = make_pipe(plan)
    durations = []
    for _ in range(3):
        started = time.perf_counter()
        pipe.run(batches(25, rng))
        durations.append(time.perf_counter() - started)
    typical = min(durations)  # only used to spread the interrupts over a run

    def step_loop_with_block() -> None:
        with pipe:
            it = pipe.fill_pipeline(batches(25, rng))
            while True:
                try:
                    pipe.progress(it)
                except StopIteration:
                    break

    def step_loop_then_drain() -> None:
        it = pipe.fill_pipeline(batches(25, rng))
        try:
            for _ in range(10):
                pipe.progress(it)
        finally:
            pipe.drain()

    ways = [lambda: pipe.run(batches(25, rng)), step_loop_with_block, step_loop_then_drain]
    outcomes: collections.Counter[str] = collections.Counter()
    # Trials until 200 interrupts landed inside a run (a signal the interrupter thread sends after the run
    # ended, because a busy machine woke it late, counts as "finished"; so the number of trials varies),
    # within a bounded number of trials and of seconds.
    deadline = time.monotonic() + RANDOM_SIGINT_BUDGET_S
    trial = 0
    while outcomes["interrupted"] < RANDOM_SIGINTS:
        if trial == RANDOM_SIGINT_MAX_TRIALS or time.monotonic() > deadline:
            bound = (f"{RANDOM_SIGINT_MAX_TRIALS} trials" if trial == RANDOM_SIGINT_MAX_TRIALS else
                     f"the {RANDOM_SIGINT_BUDGET_S:g} s budget ({trial} trials)")
            pytest.fail(f"only {outcomes['interrupted']} of {RANDOM_SIGINTS} interrupts landed inside a run in "
                        f"{bound}: {dict(outcomes)}; on a machine this busy the interrupter wakes after the runs end")
        delay = 0.0 if trial % 10 == 0 else rng.uniform(0.0, typical)
        stopped = interrupted(ways[trial % 3], delay, log)
        outcomes["interrupted" if stopped else "finished"] += 1
        assert swp_threads() == [], f"trial {trial}: threads left behind"
        trial += 1
    assert outcomes["interrupted"] == RANDOM_SIGINTS
    lost_in_ours = [f"{u.err_msg or 'Exception ignored in'}: {u.object!r}" for u in swallowed if _ours(u)]
    assert lost_in_ours == []
    log.events.clear()
    assert drive(pipe, range(12)) == list(range(12))  # still works, every dependency held
    assert check_dependencies(log, plan, 12) == 12 * 8 + 11


def test_ctrl_c_abandons_the_iterations_in_flight_instead_of_running_them(make_pipe: MakePipe) -> None:
    # Ctrl-C is sent from inside InputDistStart(3), mid-run with iterations in flight, and that unit holds on
    # until the interrupt has landed on the caller's thread; from the moment it is sent every task takes
    # 0.1 s. Draining would start the in-flight iterations' remaining units; abandoning lets each worker
    # finish the unit it is running and start at most one more (racing the abort, which a 0.1 s unit loses).
    log = ExecLog()
    landed: List[int] = []  # the log's sequence number when the handler ran
    landed_event, sent = threading.Event(), threading.Event()
    ON_SIGINT.append(lambda: (landed.append(log.stamp()), landed_event.set()))
    main = threading.main_thread().ident
    assert main is not None

    def data() -> Iterator[int]:
        for k in range(50):
            log.mark("fetch", "-", k)
            yield k

    def slow_once_sent(ctx: IterContext) -> None:
        if sent.is_set():
            time.sleep(0.1)

    def send_at_3(ctx: IterContext) -> None:
        if ctx.iter_idx == 3:
            sent.set()
            log.mark("sigint", "-", -1)
            signal.pthread_kill(main, signal.SIGINT)
            assert landed_event.wait(DELIVERY_BOUND_S), "the SIGINT did not land"
        slow_once_sent(ctx)

    plan = sparse_dist_plan(log, work={"H2D": slow_once_sent, "InputDistStart": send_at_3, "Forward": slow_once_sent})
    pipe = make_pipe(plan)
    with pytest.raises(KeyboardInterrupt):
        pipe.run(data())
    assert swp_threads() == []
    assert len(landed) == 1 and log.seq("sigint", "-", -1) < landed[0]
    caller = threading.current_thread().name  # run() runs the "default" group on it
    late = [(th, t, i) for s, kind, t, i, th in log.events if kind in ("start", "fetch") and s > landed[0]]
    assert [unit for unit in late if unit[0] == caller] == []  # no fetch, no task: it is unwinding
    late_per_worker = collections.Counter(th for th, _, _ in late)
    assert set(late_per_worker) <= {"swp-io", "swp-dist"} and max(late_per_worker.values(), default=0) <= 1, late
    # iteration 3 stopped at InputDistStart: nothing after it in its dependency chain ran on the caller's thread
    assert [(t, i) for t, i in log.starts() if i >= 3 and t in ("WaitBatch", "Forward", "Backward",
                                                                "OptimizerStep")] == []
