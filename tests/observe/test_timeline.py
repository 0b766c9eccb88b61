"""Timelines of traced runs (src/swpipeline/observe/timeline.py) and the engine's recorded path.

Wall-clock durations are never asserted: only orderings, counts and identities,
and that derived figures equal what the records say.
"""

from __future__ import annotations

import gc
import inspect
import json
import threading
import time
from typing import Any, Dict, List, Tuple

import pytest

from engine_helpers import ExecLog, drive, make_plan, sparse_dist_plan, swp_threads, wait_until
from swpipeline import (CPUDevice, DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SWPipeline,
                        TaskRecord, TaskSchedule, Timeline)
from swpipeline.observe.timeline import Recorder


# Plans here put several thread groups on one stream on purpose (the turns are what is tested).
pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")

ENGINES = {
    "SWPipeline": lambda plan: SWPipeline(plan, device="cpu"),
    "DataFlowPipeline": lambda plan: DataFlowPipeline(plan, max_depth=3, device="cpu"),
}


class StampLog:
    """Task bodies that note (task, iteration) -> (perf_counter at entry, at exit, thread name)."""

    def __init__(self) -> None:
        self.stamps: Dict[Tuple[str, int], Tuple[float, float, str]] = {}
        self.lock = threading.Lock()

    def fn(self, name: str) -> Any:
        def body(ctx: IterContext) -> None:
            start = time.perf_counter()
            end = time.perf_counter()
            with self.lock:
                self.stamps[(name, ctx.iter_idx)] = (start, end, threading.current_thread().name)
        return body


def stamped_sparse_dist(log: StampLog) -> PipelinePlan:
    plan = sparse_dist_plan(ExecLog())
    schedule = {PipelineTask(t.name, log.fn(t.name)): plan.schedules[t.name] for t in plan.tasks}
    return PipelinePlan(schedule, [(c, p) for c in plan.task_names for p in plan.intra[c]],
                        plan.inter_entries())


def by_unit(timeline: Timeline) -> Dict[Tuple[str, int], TaskRecord]:
    units = {(r.task, r.iteration): r for r in timeline.records}
    assert len(units) == len(timeline.records), "a unit was recorded twice"
    return units


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_traced_run_records_every_unit_where_and_when_it_ran(engine: str) -> None:
    log = StampLog()
    plan = stamped_sparse_dist(log)
    pipe = ENGINES[engine](plan)
    pipe.run(range(12), trace=True)
    timeline = pipe.timeline
    assert timeline is not None and timeline.engine == engine and timeline.device == "cpu"
    units = by_unit(timeline)
    assert set(units) == set(log.stamps) == {(t, i) for t in plan.task_names for i in range(12)}
    assert timeline.num_iterations == 12
    assert timeline.tasks == tuple(t.name for t in pipe._serial_order)
    assert timeline.thread_groups == ("io", "dist", "default")
    assert timeline.streams == ("memcpy", "data_dist", "default")
    for (task, it), record in units.items():
        sched = plan.schedules[task]
        assert (record.thread_group, record.stage) == (sched.thread_group, sched.stage)
        assert record.stream == (sched.stream or "default")
        assert record.period == (it + sched.stage if engine == "SWPipeline" else None)
        start, end, thread = log.stamps[(task, it)]
        # run() runs the last stage's group ("default") on the caller's thread
        inline = sched.thread_group == "default"
        assert record.thread == thread == ("MainThread" if inline else f"swp-{sched.thread_group}")
        # the record brackets the task body, on the same clock
        assert record.ready <= record.cpu_start <= start - timeline.origin
        assert end - timeline.origin <= record.cpu_end <= timeline.wall
        assert record.device_start is None and record.device_end is None
    assert list(timeline.records) == sorted(timeline.records, key=lambda r: (r.cpu_start, r.cpu_end))
    assert [r.iteration for r in timeline.for_task("Forward")] == list(range(12))


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_producers_end_and_waits_end_before_their_consumer_starts(engine: str) -> None:
    plan = sparse_dist_plan(ExecLog())
    pipe = ENGINES[engine](plan)
    pipe.run(range(10), trace=True)
    assert pipe.timeline is not None
    units = by_unit(pipe.timeline)
    for (task, it), record in units.items():
        for dep in plan.intra[task]:
            assert units[(dep, it)].cpu_end <= record.cpu_start
        for dep, back in plan.inter[task]:
            if it >= back:
                assert units[(dep, it - back)].cpu_end <= record.cpu_start
        expected = {(d, it) for d in plan.intra[task]} | {(d, it - back) for d, back in plan.inter[task] if it >= back}
        for wait in record.waits:
            assert (wait.task, wait.iteration) in expected
            assert record.ready <= wait.start <= wait.end <= record.cpu_start
            assert units[(wait.task, wait.iteration)].cpu_end <= record.cpu_start


def test_a_consumer_blocked_on_its_producer_records_the_wait() -> None:
    # A(0) holds on until B(0) is blocked on it, so the wait is certain (no timing involved).
    holder: List[SWPipeline] = []

    def slow_producer(ctx: IterContext) -> None:
        if ctx.iter_idx == 0:
            assert wait_until(lambda: holder[0]._run.board.waiters[0] > 0)

    a, b = PipelineTask("A", slow_producer), PipelineTask("B", lambda ctx: None)
    plan = PipelinePlan({a: TaskSchedule(stage=0, thread_group="ta", stream="sa"),
                         b: TaskSchedule(stage=1, thread_group="tb", stream="sb")}, intra_iter_deps=[(b, a)])
    pipe = SWPipeline(plan, device="cpu")
    holder.append(pipe)
    pipe.run(range(3), trace=True)
    assert pipe.timeline is not None
    b0 = by_unit(pipe.timeline)[("B", 0)]
    assert [(w.task, w.iteration) for w in b0.waits] == [("A", 0)]
    assert b0.wait == b0.waits[0].duration >= 0.0
    assert b0.waits[0].end <= b0.cpu_start


def test_tasks_sharing_a_stream_from_two_threads_never_overlap_on_it() -> None:
    # Spans are taken inside the stream's lane, so waiting for the lane is not counted as running.
    log = ExecLog()
    spec = {"A": (0, "shared", "t1"), "B": (0, "shared", "t2"), "C": (1, "shared", "t1")}
    work = {name: (lambda ctx: time.sleep(0.0005)) for name in spec}
    pipe = SWPipeline(make_plan(log, spec, intra=[("C", "B")], work=work), device="cpu")
    pipe.run(range(8), trace=True)
    assert pipe.timeline is not None
    spans = sorted((r.cpu_start, r.cpu_end) for r in pipe.timeline.records if r.stream == "shared")
    assert len(spans) == 24
    assert all(prev[1] <= nxt[0] for prev, nxt in zip(spans, spans[1:]))


def test_an_untraced_run_creates_no_trace_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    created: List[Recorder] = []
    real_init = Recorder.__init__

    def spy(self: Recorder, *args: Any, **kwargs: Any) -> None:
        created.append(self)
        real_init(self, *args, **kwargs)

    def trace_objects() -> int:
        gc.collect()
        return sum(type(o) in (Recorder, TaskRecord, Timeline) for o in gc.get_objects())

    before = trace_objects()
    monkeypatch.setattr(Recorder, "__init__", spy)
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu")
    it = pipe.fill_pipeline(range(5))
    workers = pipe._run.workers.values()
    assert all(inspect.getclosurevars(w._run_batch).nonlocals["run_unit"].__qualname__ ==
               "make_unit_runner.<locals>.run_unit" for w in workers)  # not wrapped for recording
    while True:
        try:
            pipe.progress(it)
        except StopIteration:
            break
    pipe.run(range(5))
    DataFlowPipeline(sparse_dist_plan(ExecLog()), device="cpu").run(range(5))
    assert created == []
    assert trace_objects() == before
    assert pipe.timeline is None
    with pytest.raises(RuntimeError, match=r"stats\(\): the last run was not traced; use run\(data, trace=True\)"):
        pipe.stats()


def test_a_traced_then_untraced_run_forgets_the_timeline() -> None:
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu")
    pipe.run(range(3), trace=True)
    assert pipe.timeline is not None and len(pipe.timeline.records) == 3 * 8
    pipe.run(range(3))
    assert pipe.timeline is None


def test_tracing_block_records_a_step_by_step_run() -> None:
    pipe = DataFlowPipeline(sparse_dist_plan(ExecLog()), max_depth=2, device="cpu")
    with pipe.tracing():
        assert drive(pipe, range(4)) == [0, 1, 2, 3]
        pipe.drain()
    timeline = pipe.timeline
    assert timeline is not None and len(timeline.records) == 4 * 8
    assert timeline.wall >= max(r.cpu_end for r in timeline.records)
    assert pipe.timeline is timeline  # cached once nothing changes
    pipe.run(range(2))  # outside the block: not traced
    assert pipe.timeline is None and swp_threads() == []


def test_verbose_run_records_and_prints_the_statistics(capsys: pytest.CaptureFixture[str]) -> None:
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu")
    pipe.run(range(6), verbose=True)
    err = capsys.readouterr().err
    assert "SWPipeline: 6/6 iterations" in err
    assert "SWPipeline on cpu: 6 iterations in " in err and "iterations/s" in err
    assert "task            thread   stream     runs  median ms  p95 ms  median wait ms  share of wall" in err
    assert "thread io" in err and "stream data_dist" in err
    assert pipe.timeline is not None


def test_trace_path_writes_the_chrome_trace(tmp_path: Any) -> None:
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu")
    target = tmp_path / "sub" / "run.json"
    pipe.run(range(4), trace=target)
    assert pipe.timeline is not None and json.loads(target.read_text()) == pipe.timeline.to_chrome_trace()
    pipe.run(range(4), trace=str(tmp_path / "again.json"))
    assert (tmp_path / "again.json").exists()


@pytest.mark.parametrize("bad, error, message", [
    (3, TypeError, "trace must be None, a bool, or a path"),
    ("", ValueError, "trace: an empty path"),
])
def test_trace_argument_is_checked(bad: Any, error: type, message: str) -> None:
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu")
    with pytest.raises(error, match=message):
        pipe.run(range(2), trace=bad)
    assert swp_threads() == []


def test_a_failed_traced_run_keeps_what_completed() -> None:
    def boom(ctx: IterContext) -> None:
        if ctx.iter_idx == 3:
            raise ValueError("bad batch")

    a, b = PipelineTask("A", lambda ctx: None), PipelineTask("B", boom)
    pipe = SWPipeline(PipelinePlan({a: TaskSchedule(stage=0, thread_group="ta"), b: TaskSchedule(stage=1)},
                                   intra_iter_deps=[(b, a)]), device="cpu")
    with pytest.raises(ValueError, match="bad batch"):
        pipe.run(range(6), trace=True)
    assert pipe.timeline is not None
    recorded = {(r.task, r.iteration) for r in pipe.timeline.records}
    assert {("B", 0), ("B", 1), ("B", 2)} <= recorded and ("B", 3) not in recorded


def test_shortcut_tasks_are_recorded_like_the_others() -> None:
    log = ExecLog()
    pipe = SWPipeline(sparse_dist_plan(log), device="cpu")
    pipe.enable_shortcut("InputDistStart")
    pipe.run(range(5), trace=True)
    assert pipe.timeline is not None
    assert [r.iteration for r in pipe.timeline.for_task("InputDistStart")] == list(range(5))


class FakeTimingEvent:
    """Stands in for torch.Event(enable_timing=True): a record() notes the CPU clock."""

    def __init__(self) -> None:
        self.at = -1.0

    def record(self, stream: Any = None) -> None:
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "FakeTimingEvent") -> float:
        return (end.at - self.at) * 1e3


class TimingCPUDevice(CPUDevice):
    has_timing_events = True

    def new_timing_event(self) -> Any:
        return FakeTimingEvent()


def test_device_times_come_from_timing_events_around_the_task() -> None:
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device=TimingCPUDevice())
    pipe.run(range(5), trace=True)
    timeline = pipe.timeline
    assert timeline is not None and timeline.has_device_times
    for record in timeline.records:
        assert record.device_start is not None and record.device_end is not None
        # the events bracket the task body; the reference event is recorded just after time 0
        assert record.device_start <= record.cpu_start
        assert record.device_end - record.device_start >= record.duration
    trace = timeline.to_chrome_trace()
    assert {e["cat"] for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 2} == {"device"}


def test_timeline_records_are_frozen() -> None:
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu")
    pipe.run(range(2), trace=True)
    assert pipe.timeline is not None
    with pytest.raises(AttributeError):
        setattr(pipe.timeline.records[0], "cpu_start", 0.0)
