"""Misuse gets a clear error at once, and no batch is ever dropped by it.

A pipeline is driven by one thread at a time (fill_pipeline, progress, advance, drain,
abandon, run); tasks must not drive the pipeline that runs them; a second run() while a
fill is active is refused without touching that fill; a run that progress(None) emptied
is not silently resumed.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Dict, List

import pytest

from engine_helpers import ExecLog, MakePipe, make_plan, on_new_thread, progress_until_stop, swp_threads, wait_until
from swpipeline import DataFlowPipeline, IterContext, PipelinePlan, SWPipeline

def plan_with(log: ExecLog, work: Dict[str, Callable[[IterContext], None]]) -> PipelinePlan:
    return make_plan(log, {"Load": (0, "copy", "io"), "Train": (1, None, "compute")},
                     intra=[("Train", "Load")], work=work)


def trained(log: ExecLog) -> List[int]:
    return [i for t, i in log.starts() if t == "Train"]


def inside(thread: threading.Thread, function: str) -> bool:
    """Whether ``thread`` is currently executing ``function`` (anywhere on its stack)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def test_progress_from_a_second_thread_is_refused_at_once(make_pipe: MakePipe) -> None:
    gate = threading.Event()
    log = ExecLog()
    pipe = make_pipe(plan_with(log, {"Train": lambda ctx: gate.wait(10) if ctx.iter_idx == 0 else None}),
                     device="cpu")
    it = pipe.fill_pipeline(range(12))
    results: List[Any] = []
    caller = threading.Thread(target=lambda: results.append(progress_until_stop(pipe, it)), name="caller")
    caller.start()
    try:
        assert wait_until(lambda: ("Train", 0) in log.starts() and inside(caller, "progress"))
        for call in (lambda: pipe.progress(it), lambda: pipe.abandon(), lambda: pipe.drain(),
                     lambda: pipe.advance(), lambda: pipe.fill_pipeline(range(3)), lambda: pipe.run(range(3))):
            with pytest.raises(RuntimeError, match="while thread 'caller' is in progress\\(\\); a pipeline is "
                                                   "driven by one thread at a time"):
                call()
    finally:
        gate.set()
        caller.join(10)
    assert results == [list(range(12))]  # the caller's run lost nothing
    assert trained(log) == list(range(12))
    assert swp_threads() == []


@pytest.mark.parametrize("call", ["progress", "drain", "abandon", "advance", "fill_pipeline"])
def test_driving_the_pipeline_from_inside_its_own_task_is_refused(make_pipe: MakePipe, call: str) -> None:
    box: List[Any] = []

    def meddle(ctx: IterContext) -> None:
        if ctx.iter_idx == 1:
            pipe = box[0]
            fn = getattr(pipe, call)
            fn(range(3)) if call == "fill_pipeline" else fn()

    pipe = make_pipe(plan_with(ExecLog(), {"Train": meddle}), device="cpu", progress_timeout=20)
    box.append(pipe)
    with pytest.raises(RuntimeError, match=f"{call}\\(\\) called from inside task 'Train' \\(iteration 1\\)") as info:
        pipe.run(range(6))
    assert (getattr(info.value, "swp_task"), getattr(info.value, "swp_iter")) == ("Train", 1)
    assert swp_threads() == []


def test_driving_the_pipeline_from_a_task_on_the_callers_thread_is_refused() -> None:
    box: List[Any] = []

    def meddle(ctx: IterContext) -> None:
        if ctx.iter_idx == 1:
            box[0].progress()

    log = ExecLog()
    pipe = SWPipeline(plan_with(log, {"Train": meddle}), device="cpu", caller_thread_group="compute",
                      progress_timeout=20)
    box.append(pipe)
    with pytest.raises(RuntimeError, match="progress\\(\\) called from inside task 'Train' \\(iteration 1\\)"):
        pipe.run(range(6))
    assert swp_threads() == []


def test_run_while_a_fill_is_active_is_refused_and_the_fill_goes_on(make_pipe: MakePipe) -> None:
    log = ExecLog()
    pipe = make_pipe(plan_with(log, {}), device="cpu")
    it = pipe.fill_pipeline(range(20))
    assert pipe.progress(it) == 0
    with pytest.raises(RuntimeError, match="run\\(\\) while a fill_pipeline\\(\\) run is in flight"):
        pipe.run(range(5))
    assert progress_until_stop(pipe, it) == list(range(1, 20))
    assert trained(log) == list(range(20))
    assert swp_threads() == []


def test_progress_none_until_empty_then_progress_with_data_is_refused_not_dropped(make_pipe: MakePipe) -> None:
    log = ExecLog()
    pipe = make_pipe(plan_with(log, {}), device="cpu")
    data = iter(range(10))
    pipe.fill_pipeline(data)
    retired = []
    with pytest.raises(StopIteration):
        while True:
            retired.append(pipe.progress(None))
    with pytest.raises(RuntimeError, match="progress\\(None\\) retired the last iteration in flight.*"
                                           "call fill_pipeline"):
        pipe.progress(data)
    left = list(data)
    assert sorted(retired + left) == list(range(10)) and left  # every batch is either trained or still there
    assert trained(log) == retired
    assert swp_threads() == []


def test_progress_none_then_data_resumes_while_iterations_are_in_flight(make_pipe: MakePipe) -> None:
    log = ExecLog()
    pipe = make_pipe(plan_with(log, {}), device="cpu")
    data = iter(range(10))
    pipe.fill_pipeline(data)
    assert pipe.progress(None) == 0
    assert progress_until_stop(pipe, data) == list(range(1, 10))
    assert trained(log) == list(range(10))


# -- progress(None) and what progress() is given ----------------------------------------------------


def test_progress_none_for_every_iteration_in_flight_then_data_resumes(make_pipe: MakePipe) -> None:
    # Retiring everything in flight with progress(None) does not end the data: the next progress(data)
    # fills the pipeline again from the same iterator, and the iteration numbers go on.
    log = ExecLog()
    pipe = make_pipe(plan_with(log, {}), device="cpu", progress_timeout=10, signal_timeout=10)
    data = iter(range(10))
    pipe.fill_pipeline(data)
    in_flight = len(pipe.contexts_in_flight())
    assert [pipe.progress(None) for _ in range(in_flight)] == list(range(in_flight))
    assert progress_until_stop(pipe, data) == list(range(in_flight, 10))
    assert trained(log) == list(range(10))
    assert swp_threads() == []


def test_progress_with_a_list_instead_of_an_iterator_is_refused_before_anything_is_retired(
        make_pipe: MakePipe) -> None:
    log = ExecLog()
    pipe = make_pipe(plan_with(log, {}), device="cpu", progress_timeout=10, signal_timeout=10)
    batches = list(range(6))
    it = pipe.fill_pipeline(batches)
    for bad in (batches, range(6), "abc"):
        with pytest.raises(TypeError, match=r"progress\(\): data_iter must be an iterator \(the one "
                                            r"fill_pipeline\(\) returned\) or None, got a " + type(bad).__name__):
            pipe.progress(bad)  # type: ignore[arg-type]
    assert pipe.last_context is None  # nothing was retired, and the run goes on
    assert progress_until_stop(pipe, it) == list(range(6))
    assert trained(log) == list(range(6))
    assert swp_threads() == []


@pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")
@pytest.mark.parametrize("spec", [
    {"Load": (0, "lane", "io"), "Train": (1, "lane", "compute")},  # two thread groups take turns on one stream
    {"Load": (0, "copy", "g"), "Train": (1, None, "g")},  # Train(i) sits behind Load(i + 1) in the group's order
], ids=["shared-stream", "one-group"])
@pytest.mark.parametrize("how", ["progress-none", "drain"])
def test_the_data_flow_engine_finishes_what_is_in_flight_without_new_batches(spec: Dict[str, Any],
                                                                            how: str) -> None:
    log = ExecLog()
    pipe = DataFlowPipeline(make_plan(log, spec, intra=[("Train", "Load")]), max_depth=2, device="cpu",
                            progress_timeout=5, signal_timeout=5)
    data = iter(range(10))
    pipe.fill_pipeline(data)
    assert pipe.progress(data) == 0
    if how == "drain":
        pipe.drain()
        assert trained(log) == [0, 1, 2]
    else:
        assert [pipe.progress(None), pipe.progress(None)] == [1, 2]
        assert progress_until_stop(pipe, data) == list(range(3, 10))  # and fetching resumes afterwards
        assert trained(log) == list(range(10))
    assert swp_threads() == []


# -- threads are told apart by object, never by ident -------------------------------------------------


@pytest.mark.parametrize("call", ["drain", "abandon"])
def test_a_new_thread_may_clean_up_after_a_failed_run(make_pipe: MakePipe, call: str) -> None:
    class Boom(Exception):
        pass

    def fail(ctx: IterContext) -> None:
        if ctx.iter_idx == 2:
            raise Boom

    pipe = make_pipe(plan_with(ExecLog(), {"Train": fail}), device="cpu")
    for _ in range(3):
        with pytest.raises(Boom):
            progress_until_stop(pipe, pipe.fill_pipeline(range(6)))
        assert on_new_thread(getattr(pipe, call)) == [None]
    assert swp_threads() == []


def test_another_threads_call_while_run_is_inside_a_task_on_the_callers_thread_names_both_threads() -> None:
    refusals: List[Any] = []

    def train(ctx: IterContext) -> None:
        if ctx.iter_idx == 1:
            refusals.extend(on_new_thread(pipe.abandon))

    pipe = SWPipeline(plan_with(ExecLog(), {"Train": train}), device="cpu")  # run(): Train on this thread
    pipe.run(range(4))
    assert len(refusals) == 1 and isinstance(refusals[0], RuntimeError)
    assert str(refusals[0]).startswith(
        f"abandon() called from thread 'newcomer' while thread {threading.current_thread().name!r} is in run(), "
        f"inside task 'Train' (iteration 1); a pipeline is driven by one thread at a time")
    assert swp_threads() == []
