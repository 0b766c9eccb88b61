"""Failures at run time surface in the caller, name the task and iteration, and leave no thread behind.

Promptness is checked structurally, never with a clock: the signal and progress
timeouts are left at their 30 s / 60 s defaults, so an error that only surfaced
through a timeout would arrive as a timeout error (and take half a minute), not
as the task's own exception.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator, List

import pytest

from engine_helpers import (SPARSE_DIST_INTER, SPARSE_DIST_INTRA, ExecLog, MakePipe, check_dependencies, drive,
                            make_plan, sparse_dist_plan, swp_threads, wait_until)
from swpipeline import (DataFlowPipeline, DependencyTimeoutError, IterContext, PipelinePlan, PipelineTask,
                        ProgressTimeoutError, SWPipeline, TaskSchedule)


# Plans here put several thread groups on one stream on purpose (the turns are what is tested).
pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")


class Boom(Exception):
    pass


def fail_at(iteration: int) -> Any:
    def work(ctx: IterContext) -> None:
        if ctx.iter_idx == iteration:
            raise Boom(f"boom at {iteration}")
    return work


@pytest.mark.parametrize("task", ["H2D", "InputDistWait", "Forward", "OptimizerStep"])
def test_task_exception_surfaces_as_itself_with_task_and_iteration(task: str, make_pipe: MakePipe) -> None:
    log = ExecLog()
    pipe = make_pipe(sparse_dist_plan(log, work={task: fail_at(4)}), device="cpu")
    with pytest.raises(Boom, match="boom at 4") as info:
        drive(pipe, range(50))
    exc = info.value
    assert (getattr(exc, "swp_task"), getattr(exc, "swp_iter")) == (task, 4)
    assert f"swpipeline: raised by task {task!r} at iteration 4" in exc.__notes__
    assert swp_threads() == []
    # Nothing of iteration 4 ran after the failing task's dependents; far-away iterations never started.
    assert not any(i >= 10 for _, i in log.starts())
    with pytest.raises(RuntimeError, match="after the pipeline failed"):
        pipe.progress(iter([]))
    pipe.drain()
    assert swp_threads() == []


def test_pipeline_is_reusable_after_a_failure_and_drain(make_pipe: MakePipe) -> None:
    flaky = {"fail": True}

    def work(ctx: IterContext) -> None:
        if flaky["fail"] and ctx.iter_idx == 2:
            raise Boom("once")

    log = ExecLog()
    pipe = make_pipe(sparse_dist_plan(log, work={"Backward": work}), device="cpu")
    with pytest.raises(Boom):
        pipe.run(range(10))
    assert swp_threads() == []
    flaky["fail"] = False
    log.events.clear()
    pipe.run(range(10))
    assert sorted(i for t, i in log.starts() if t == "OptimizerStep") == list(range(10))


def test_an_error_wakes_workers_blocked_on_dependencies(make_pipe: MakePipe) -> None:
    # WaitBatch (group "default") waits on InputDistWait (group "dist"), which fails: the waiting
    # worker must be woken by the abort, not by its 30 s signal timeout.
    log = ExecLog()
    pipe = make_pipe(sparse_dist_plan(log, work={"InputDistWait": fail_at(0)}), device="cpu")
    with pytest.raises(Boom) as info:
        drive(pipe, range(5))
    assert getattr(info.value, "swp_task") == "InputDistWait"
    assert ("WaitBatch", 0) not in log.starts()
    assert swp_threads() == []


def released_later(seconds: float = 1.0) -> threading.Event:
    """An event set by a timer: a stuck task returns eventually, so its worker can be joined."""
    release = threading.Event()
    timer = threading.Timer(seconds, release.set)
    timer.daemon = True
    timer.start()
    return release


def test_dependency_that_never_arrives_times_out_naming_task_dependency_and_iteration() -> None:
    release = released_later()
    log = ExecLog()
    plan = make_plan(log, {"Producer": (0, None, "slow"), "Consumer": (0, None, "fast")},
                     intra=[("Consumer", "Producer")], work={"Producer": lambda ctx: release.wait(10)})
    pipe = SWPipeline(plan, device="cpu", signal_timeout=0.2)
    try:
        with pytest.raises(DependencyTimeoutError) as info:
            drive(pipe, range(3))
    finally:
        release.set()
    exc = info.value
    assert (exc.task, exc.dependency, exc.iter_idx, exc.dep_iter) == ("Consumer", "Producer", 0, 0)
    assert "task 'Consumer' (iteration 0) waited 0.2 s for its intra-iteration dependency 'Producer'" in str(exc)
    assert isinstance(exc, RuntimeError)
    assert swp_threads() == []


def test_inter_iteration_timeout_names_the_previous_iteration() -> None:
    release = released_later()
    log = ExecLog()
    # A(2) is enqueued in period 2 together with B(1), before iteration 1 can retire.
    plan = make_plan(log, {"A": (0, "sa", "g1"), "B": (1, "sb", "g2"), "C": (2, "sa", "g1")}, inter=[("A", "B")],
                     work={"B": lambda ctx: release.wait(10) if ctx.iter_idx == 1 else None})
    pipe = SWPipeline(plan, device="cpu", signal_timeout=0.2)
    try:
        with pytest.raises(DependencyTimeoutError, match=r"inter-iteration dependency 'B' \(iteration 1\)") as info:
            drive(pipe, range(4))
    finally:
        release.set()
    assert (info.value.task, info.value.iter_idx) == ("A", 2)
    assert swp_threads() == []


def test_progress_timeout_names_the_unfinished_tasks(make_pipe: MakePipe) -> None:
    release = released_later()
    log = ExecLog()
    plan = make_plan(log, {"Load": (0, None, "default"), "Train": (1, None, "default")},
                     intra=[("Train", "Load")], work={"Train": lambda ctx: release.wait(10)})
    pipe = make_pipe(plan, device="cpu", progress_timeout=0.2)
    try:
        with pytest.raises(ProgressTimeoutError, match=r"iteration 0 to complete; tasks not yet done: \['Train'\]"):
            drive(pipe, range(3))
    finally:
        release.set()
    assert swp_threads() == []


def test_data_iterator_that_raises_midway(make_pipe: MakePipe) -> None:
    def batches() -> Iterator[int]:
        yield 0
        yield 1
        yield 2
        yield 3
        raise OSError("disk gone")

    log = ExecLog()
    pipe = make_pipe(sparse_dist_plan(log), device="cpu")
    it = pipe.fill_pipeline(batches())
    assert pipe.progress(it) == 0  # fetches batch 3
    with pytest.raises(OSError, match="disk gone") as info:
        pipe.progress(it)  # retires 1, then the iterator raises while fetching iteration 4
    note = info.value.__notes__[-1]
    assert note == ("swpipeline: the data iterator raised while fetching the batch for iteration 4; "
                    "in-flight iterations [2, 3] were abandoned")
    assert swp_threads() == []
    pipe.drain()
    assert drive(pipe, range(2)) == [0, 1]


def test_data_iterator_that_raises_during_fill(make_pipe: MakePipe) -> None:
    def batches() -> Iterator[int]:
        yield 0
        raise ValueError("bad record")

    log = ExecLog()
    plan = sparse_dist_plan(log)
    pipe = make_pipe(plan, device="cpu")
    with pytest.raises(ValueError, match="bad record"):
        pipe.fill_pipeline(batches())
    assert swp_threads() == []
    with pytest.raises(ValueError, match="bad record"):
        pipe.run(batches())
    assert swp_threads() == []
    log.events.clear()
    pipe.run(range(3))  # runs again, every dependency held
    assert check_dependencies(log, plan, 3) == 3 * len(SPARSE_DIST_INTRA) + 2 * len(SPARSE_DIST_INTER)


def test_serial_run_annotates_task_errors(make_pipe: MakePipe) -> None:
    pipe = make_pipe(sparse_dist_plan(ExecLog(), work={"Forward": fail_at(1)}), device="cpu")
    with pytest.raises(Boom) as info:
        pipe.run_serial(range(3))
    assert (getattr(info.value, "swp_task"), getattr(info.value, "swp_iter")) == ("Forward", 1)


def test_task_of_a_string_keyed_plan_cannot_run(make_pipe: MakePipe) -> None:
    plan = PipelinePlan({"H2D": TaskSchedule(stage=0), "Forward": TaskSchedule(stage=1)},
                        intra_iter_deps=[("Forward", "H2D")])
    pipe = make_pipe(plan, device="cpu")
    with pytest.raises(RuntimeError, match="task 'H2D' has no function"):
        pipe.run(range(2))
    assert swp_threads() == []


def test_failures_in_two_groups_report_the_first_and_join_all(make_pipe: MakePipe) -> None:
    box: List[Any] = []

    def first(ctx: IterContext) -> None:
        raise Boom("first")

    def second(ctx: IterContext) -> None:
        assert wait_until(lambda: box[0]._run.error is not None)
        raise KeyError("second")

    a, b = PipelineTask("A", first), PipelineTask("B", second)
    plan = PipelinePlan({a: TaskSchedule(thread_group="g1", stream="s1"),
                         b: TaskSchedule(thread_group="g2", stream="s2")})
    pipe = make_pipe(plan, device="cpu")
    box.append(pipe)
    with pytest.raises(Boom, match="first"):
        pipe.run(range(3))
    assert swp_threads() == []


def test_dataflow_dependency_that_never_arrives_is_named_by_the_progress_timeout() -> None:
    # The data-flow engine never hands a unit to a worker before its dependencies are done,
    # so a missing dependency shows up as an iteration that does not complete.
    release = released_later()
    log = ExecLog()
    plan = make_plan(log, {"Producer": (0, None, "slow"), "Consumer": (0, None, "fast")},
                     intra=[("Consumer", "Producer")], work={"Producer": lambda ctx: release.wait(10)})
    pipe = DataFlowPipeline(plan, max_depth=2, device="cpu", progress_timeout=0.2)
    try:
        with pytest.raises(ProgressTimeoutError) as info:
            drive(pipe, range(3))
    finally:
        release.set()
    assert str(info.value).startswith(
        "progress() waited 0.2 s for iteration 0 to complete; tasks not yet done: ['Producer', 'Consumer']; "
        "'Consumer' waits for 'Producer' (iteration 0)")
    assert swp_threads() == []
