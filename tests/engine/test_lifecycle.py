"""The engine's life cycle under faults: exceptions that resist notes, stragglers, stopping time, exit and GC.

Each test here reproduces a way the engine used to hang, lose an error or corrupt a
later run. Promptness is checked structurally (which error arrives, which join
budgets were used), never against a clock.
"""

from __future__ import annotations

import dataclasses
import gc
import subprocess
import sys
import textwrap
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest
import torch

from engine_helpers import ExecLog, MakePipe, check_dependencies, drive, make_plan, swp_threads, wait_until
from swpipeline import DependencyTimeoutError, IterContext, PipelinePlan, ProgressTimeoutError, SWPipeline
from swpipeline.engine.worker import Worker


def two_group_plan(log: ExecLog, work: Optional[Dict[str, Callable[[IterContext], None]]] = None) -> PipelinePlan:
    """Load (group io) -> Train (group compute), on their own streams."""
    return make_plan(log, {"Load": (0, "copy", "io"), "Train": (1, None, "compute")},
                     intra=[("Train", "Load")], work=work)


# -- the error path never fails -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FrozenError(Exception):
    """Refuses every new attribute, so ``add_note`` (which sets ``__notes__``) raises."""

    code: int


class NotesNotAList(Exception):
    def __init__(self) -> None:
        super().__init__("odd notes")
        self.__notes__ = "not a list"  # add_note raises TypeError on this


@pytest.mark.parametrize("task", ["Load", "Train"])
@pytest.mark.parametrize("make_exc", [lambda: FrozenError(7), NotesNotAList], ids=["frozen", "notes-not-a-list"])
def test_an_exception_that_refuses_notes_still_surfaces_as_itself(make_pipe: MakePipe, task: str,
                                                                 make_exc: Callable[[], BaseException]) -> None:
    raised: List[BaseException] = []

    def fail(ctx: IterContext) -> None:
        if ctx.iter_idx == 2 and not raised:
            exc = make_exc()
            raised.append(exc)
            raise exc

    pipe = make_pipe(two_group_plan(ExecLog(), {task: fail}), device="cpu", progress_timeout=20)
    with pytest.raises(BaseException) as info:
        drive(pipe, range(8))
    assert raised and info.value is raised[0]  # not a ProgressTimeoutError after the worker died
    assert swp_threads() == []
    assert drive(pipe, range(3)) == [0, 1, 2]  # and the pipeline is usable again


def test_a_data_iterator_error_that_refuses_notes_surfaces_as_itself(make_pipe: MakePipe) -> None:
    def batches() -> Any:
        yield 0
        yield 1
        raise FrozenError(3)

    pipe = make_pipe(two_group_plan(ExecLog()), device="cpu", progress_timeout=20)
    with pytest.raises(FrozenError):
        drive(pipe, batches())
    assert swp_threads() == []


def test_worker_init_that_raises_a_frozen_exception_fails_the_run(make_pipe: MakePipe) -> None:
    def init(group: str) -> None:
        if group == "io":
            raise FrozenError(1)

    pipe = make_pipe(two_group_plan(ExecLog()), device="cpu", progress_timeout=20, worker_init=init)
    with pytest.raises(FrozenError):
        pipe.run(range(4))
    assert swp_threads() == []


def test_a_task_that_raises_stop_iteration_fails_instead_of_ending_the_data(make_pipe: MakePipe) -> None:
    # Left alone, StopIteration would reach the caller's loop and look like the end of the data:
    # the remaining batches would be dropped without a word.
    def stop(ctx: IterContext) -> None:
        if ctx.iter_idx == 3:
            raise StopIteration

    pipe = make_pipe(two_group_plan(ExecLog(), {"Train": stop}), device="cpu")
    with pytest.raises(RuntimeError, match="task 'Train' raised StopIteration at iteration 3") as info:
        pipe.run(range(10))
    assert isinstance(info.value.__cause__, StopIteration)
    assert swp_threads() == []


# -- stopping time: joins share one budget ----------------------------------------------------------


def test_stuck_workers_are_joined_together_within_one_join_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two tasks on two thread groups never return (until released); a third task times out waiting.
    # The caller must get the timeout error after one join budget in total, not one per worker.
    release = threading.Event()
    log = ExecLog()
    stuck = lambda ctx: release.wait(30)  # noqa: E731
    plan = make_plan(log, {"A": (0, "a", "ga"), "B": (0, "b", "gb"), "C": (0, "c", "gc")},
                     intra=[("C", "A"), ("C", "B")], work={"A": stuck, "B": stuck})
    budgets: List[Optional[float]] = []
    real_join = Worker.join

    def spy(self: Worker, timeout: float) -> None:
        budgets.append(timeout)
        real_join(self, timeout)

    monkeypatch.setattr(Worker, "join", spy)
    pipe = SWPipeline(plan, device="cpu", signal_timeout=0.2, join_timeout=0.5)
    try:
        with pytest.raises(DependencyTimeoutError, match="task 'C' \\(iteration 0\\) waited 0.2 s"):
            drive(pipe, range(3))
        assert budgets and all(b is not None for b in budgets)
        assert sum(b for b in budgets if b is not None) <= 0.5 + 1e-6  # one budget shared by all joins
        assert sorted(swp_threads()) == ["swp-ga", "swp-gb"]  # the stragglers, reported and left
    finally:
        release.set()
        monkeypatch.undo()
        assert wait_until(lambda: swp_threads() == [], timeout=10)


# -- stragglers never touch a later run -------------------------------------------------------------


def test_a_fill_while_an_earlier_runs_thread_is_still_in_a_task_is_refused_by_name() -> None:
    release = threading.Event()
    log = ExecLog()

    def slow(ctx: IterContext) -> None:
        if ctx.iter_idx == 2:
            release.wait(30)

    plan = two_group_plan(log, {"Load": slow})
    pipe = SWPipeline(plan, device="cpu", progress_timeout=0.3, join_timeout=0.2)
    try:
        with pytest.raises(ProgressTimeoutError):
            pipe.run(range(10))
        assert swp_threads() == ["swp-io"]
        with pytest.raises(RuntimeError) as info:
            pipe.run(range(5))
        assert ("thread 'swp-io' of an earlier run is still running task 'Load' (iteration 2) on stream 'copy'"
                in str(info.value))
        assert "wait until that task returns" in str(info.value)
    finally:
        release.set()
    assert wait_until(lambda: swp_threads() == [], timeout=10)
    log.events.clear()
    assert drive(pipe, range(5)) == list(range(5))  # the straggler left nothing behind
    assert check_dependencies(log, plan, 5) == 5


def test_a_straggler_in_worker_init_never_runs_or_completes_anything_of_a_later_run(make_pipe: MakePipe) -> None:
    # An earlier run's thread that is still starting (worker_init blocked) when its run is abandoned
    # must not run units, complete iterations or pass turns of the next run once it wakes up.
    release = threading.Event()
    first = {"call": True}
    errors: List[BaseException] = []

    def init(group: str) -> None:
        if group == "io" and first["call"]:
            first["call"] = False
            release.wait(30)

    old_hook = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)  # type: ignore[assignment,misc]
    try:
        log = ExecLog()
        plan = two_group_plan(log)
        pipe = make_pipe(plan, device="cpu", worker_init=init, join_timeout=0.2, progress_timeout=0.3)
        with pytest.raises(ProgressTimeoutError):
            pipe.run(range(4))
        assert "swp-io" in swp_threads()  # still inside worker_init
        log.events.clear()
        it = pipe.fill_pipeline(range(6))  # allowed: that thread holds no stream
        release.set()  # the old thread wakes up while the new run is in flight
        results = []
        while True:
            try:
                results.append(pipe.progress(it))
            except StopIteration:
                break
        assert results == list(range(6))
        assert check_dependencies(log, plan, 6) == 6
        assert sorted(log.starts()) == sorted((t, i) for t in ("Load", "Train") for i in range(6))
    finally:
        release.set()
        threading.excepthook = old_hook
    assert wait_until(lambda: swp_threads() == [], timeout=10)
    assert errors == []


# -- exit and garbage collection ----------------------------------------------------------------------


EXIT_SCRIPT = textwrap.dedent("""
    import torch
    from swpipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

    a = torch.randn(256, 256)

    def work(ctx):
        for _ in range(20):
            torch.mm(a, a)

    tasks = [PipelineTask(f"T{k}", work) for k in range(3)]
    plan = PipelinePlan({t: TaskSchedule(stage=k, thread_group=f"g{k}", stream=f"s{k}")
                         for k, t in enumerate(tasks)})
    pipe = SWPipeline(plan, device="cpu")
    it = pipe.fill_pipeline(range(100000))
    pipe.progress(it)
    raise SystemExit("user code failed between progress() calls")  # never drained
""")


def test_an_undrained_pipeline_does_not_abort_the_interpreter_at_exit(tmp_path: Path) -> None:
    script = tmp_path / "undrained.py"
    script.write_text(EXIT_SCRIPT)
    for _ in range(3):
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stderr  # SystemExit's message, not SIGABRT (134) / "terminate called"
        assert "user code failed between progress() calls" in proc.stderr
        assert "terminate called" not in proc.stderr


def test_a_garbage_collected_pipeline_stops_its_threads(make_pipe: MakePipe) -> None:
    pipe = make_pipe(two_group_plan(ExecLog()), device="cpu")
    it = pipe.fill_pipeline(range(100))
    pipe.progress(it)
    assert sorted(swp_threads()) == ["swp-compute", "swp-io"]
    del pipe, it
    gc.collect()
    assert wait_until(lambda: swp_threads() == [], timeout=10)


# -- the context's own fields ---------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["set iter_idx", "del iter_idx", "set batch", "del batch"])
def test_a_task_cannot_change_the_contexts_own_fields(make_pipe: MakePipe, action: str) -> None:
    verb, field = action.split()

    def meddle(ctx: IterContext) -> None:
        if ctx.iter_idx == 1:
            if verb == "set":
                setattr(ctx, field, 99)
            else:
                delattr(ctx, field)

    pipe = make_pipe(two_group_plan(ExecLog(), {"Load": meddle}), device="cpu", progress_timeout=20)
    with pytest.raises(AttributeError, match=f"IterContext.{field} is read-only") as info:
        pipe.run(range(5))
    assert (getattr(info.value, "swp_task"), getattr(info.value, "swp_iter")) == ("Load", 1)
    assert swp_threads() == []


def test_context_fields_read_only_outside_the_engine_too() -> None:
    ctx = IterContext("b", 3)
    with pytest.raises(AttributeError, match="IterContext.iter_idx is read-only"):
        ctx.iter_idx = 4
    with pytest.raises(AttributeError, match="IterContext.batch is read-only"):
        del ctx.batch
    assert (ctx.iter_idx, ctx.batch) == (3, "b")
    ctx.y = 1
    del ctx.y
    with pytest.raises(AttributeError, match="has no attribute 'iter'.*did you mean 'iter_idx'"):
        ctx.iter  # noqa: B018


# -- one join budget on every path ---------------------------------------------------------------------


class Boom(Exception):
    pass


@pytest.mark.parametrize("path", ["progress-loop", "run", "with-block"])
def test_a_stuck_worker_is_joined_once_on_every_path(make_pipe: MakePipe, monkeypatch: pytest.MonkeyPatch,
                                                    path: str) -> None:
    # Load(1) never returns (until released); Train(0) fails once Load(1) is stuck. Stopping the failed run
    # joins the stuck worker against join_timeout; the handler of run() (and a with block) that abandons
    # the run afterwards must not join it again with a fresh budget.
    release, stuck = threading.Event(), threading.Event()

    def load(ctx: IterContext) -> None:
        if ctx.iter_idx == 1:
            stuck.set()
            release.wait(30)

    def train(ctx: IterContext) -> None:
        assert stuck.wait(10)
        raise Boom("train 0")

    joins: List[Any] = []
    real_join = Worker.join

    def join(self: Worker, timeout: float) -> None:
        joins.append((self.group, timeout))
        if self.group != "io":  # the stuck one: as if it had waited the whole budget in vain
            real_join(self, timeout)

    monkeypatch.setattr(Worker, "join", join)
    pipe = make_pipe(two_group_plan(ExecLog(), {"Load": load, "Train": train}), device="cpu", join_timeout=2.0,
                     caller_thread_group=None)
    try:
        with pytest.raises(Boom):
            if path == "run":
                pipe.run(range(6))
            elif path == "with-block":
                with pipe:
                    drive(pipe, range(6))
            else:
                drive(pipe, range(6))
        budgets = [timeout for group, timeout in joins if group == "io"]
        assert len(budgets) == 1 and 0 < budgets[0] <= 2.0  # one budget, used once
        assert swp_threads() == ["swp-io"]
    finally:
        release.set()
        monkeypatch.undo()
    assert wait_until(lambda: swp_threads() == [], timeout=10)
    pipe.drain()


# -- a run leaves no reference cycle ----------------------------------------------------------------------


def garbage_of(action: Callable[[], None]) -> List[str]:
    """The types of the objects that ``action`` left for the garbage collector: unreachable, in reference cycles."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        action()
        gc.collect()
        return sorted({type(o).__qualname__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("caller", ["auto", None])
@pytest.mark.parametrize("path", ["run", "progress-loop"])
def test_a_run_leaves_nothing_for_the_garbage_collector(make_pipe: MakePipe, caller: Optional[str],
                                                        path: str) -> None:
    # Every run's workers once held a bound method of their run, which holds them (run -> crew -> worker -> run),
    # and every worker thread loaded libc anew (a ctypes.CDLL is a cycle): about 200 objects per run, 600 per step
    # of swpipeline.pp, which made the collector run often and, every ~150 steps there, a full collection of
    # about 100 ms. Now reference counting frees all of a run the moment it ends.
    pipe = make_pipe(two_group_plan(ExecLog()), device="cpu", caller_thread_group=caller)
    pipe.run(range(4))  # threads, caches and the plan's own objects made once

    def one_run() -> None:
        if path == "run":
            pipe.run(range(6))
            return
        assert drive(pipe, range(6)) == list(range(6))

    failing = make_pipe(two_group_plan(ExecLog(), {"Train": lambda ctx: _fail_at(ctx, 2)}), device="cpu",
                        caller_thread_group=caller)

    def one_failed_run() -> None:
        with pytest.raises(Boom):
            failing.run(Batches(6))

    assert garbage_of(one_run) == []
    assert garbage_of(one_failed_run) == []
    assert swp_threads() == []


def _fail_at(ctx: IterContext, it: int) -> None:
    if ctx.iter_idx == it:
        raise Boom(f"train {it}")


# -- a failure leaves no reference cycle ------------------------------------------------------------------


class Batches:
    """A data iterator of a caller, holding a payload of its own."""

    def __init__(self, n: int) -> None:
        self.payload = torch.zeros(256)
        self.items = iter(range(n))

    def __iter__(self) -> "Batches":
        return self

    def __next__(self) -> int:
        return next(self.items)


def drive_until_it_raises(pipe: Any, data: Any, path: str) -> None:
    """``pipe.run(data)``, or a fill and a progress() loop ("advance-false": progress(advance=False), advance())
    that only an exception ends."""
    if path == "run":
        pipe.run(data)
        return
    it = pipe.fill_pipeline(data)
    while True:
        pipe.progress(it, advance=path != "advance-false")
        if path == "advance-false":
            pipe.advance()


@pytest.mark.parametrize("path", ["run", "progress-loop", "advance-false"])
def test_a_failed_run_frees_the_callers_objects_as_soon_as_the_exception_is_dropped(make_pipe: MakePipe,
                                                                                   path: str) -> None:
    # With the garbage collector off, only reference counts free things: a reference cycle through the
    # raised exception (its traceback holds the frame that raised it) would keep the caller's frame alive.
    def fail(ctx: IterContext) -> None:
        if ctx.iter_idx == 3:
            raise Boom("train 3")

    pipe = make_pipe(two_group_plan(ExecLog(), {"Train": fail}), device="cpu")
    refs: List[Any] = []

    def train() -> None:
        big = torch.zeros(1 << 16)  # a local of the caller's frame
        data = Batches(10)
        refs.extend([weakref.ref(big), weakref.ref(data), weakref.ref(data.payload)])
        drive_until_it_raises(pipe, data, path)

    gc.collect()
    gc.disable()
    try:
        caught: List[str] = []
        try:
            train()
        except Boom as exc:
            caught.append(str(exc))
        assert caught == ["train 3"]
        assert [ref() for ref in refs] == [None, None, None]
    finally:
        gc.enable()
    assert swp_threads() == []
    pipe.drain()


@pytest.mark.parametrize("path", ["run", "progress-loop"])
def test_a_failed_runs_data_loader_workers_end_when_the_exception_is_dropped(make_pipe: MakePipe,
                                                                            path: str) -> None:
    from torch.utils.data import DataLoader

    def fail(ctx: IterContext) -> None:
        if ctx.iter_idx == 2:
            raise Boom("train 2")

    pipe = make_pipe(two_group_plan(ExecLog(), {"Train": fail}), device="cpu")
    processes: List[Any] = []

    def train() -> None:
        loader = iter(DataLoader(list(range(32)), batch_size=2, num_workers=2))  # type: ignore[arg-type]
        processes.extend(loader._workers)  # type: ignore[attr-defined]
        drive_until_it_raises(pipe, loader, path)

    gc.collect()
    gc.disable()
    try:
        caught: List[str] = []
        try:
            train()
        except Boom as exc:
            caught.append(str(exc))
        assert caught == ["train 2"]
        # the loader's iterator was freed with the exception, which shut its worker processes down
        assert len(processes) == 2 and not any(p.is_alive() for p in processes)
    finally:
        gc.enable()
    pipe.drain()
