"""Run statistics (src/swpipeline/stats.py): every figure equals what the timeline's records say."""

from __future__ import annotations

import math
import operator
import statistics
from typing import Dict, List

import pytest

from engine_helpers import ExecLog, sparse_dist_plan
from swpipeline import DataFlowPipeline, RunStats, SWPipeline, TaskRecord, Timeline
from swpipeline.stats import busy_time, percentile, summarize


def traced(engine: str) -> Timeline:
    log = ExecLog()
    plan = sparse_dist_plan(log)
    pipe = SWPipeline(plan, device="cpu") if engine == "SWPipeline" else DataFlowPipeline(plan, 3, device="cpu")
    pipe.run(range(20), trace=True)
    assert pipe.timeline is not None
    # The execution log saw the same units, on the same threads.
    assert sorted(log.starts()) == sorted((r.task, r.iteration) for r in pipe.timeline.records)
    for record in pipe.timeline.records:
        assert log.threads_of(record.task) == {record.thread}
    return pipe.timeline


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_task_stats_match_the_records(engine: str) -> None:
    timeline = traced(engine)
    stats = timeline.stats()
    assert [t.task for t in stats.tasks] == list(timeline.tasks)
    for task in stats.tasks:
        records = timeline.for_task(task.task)
        durations = sorted(r.duration for r in records)
        assert task.count == len(records) == 20
        assert (task.thread_group, task.stream) == (records[0].thread_group, records[0].stream)
        assert task.median == statistics.median(durations)
        assert task.p95 == durations[math.ceil(0.95 * len(durations)) - 1]
        assert task.median <= task.p95 <= durations[-1]
        assert task.median_wait == statistics.median(sum(w.duration for w in r.waits) for r in records)
        assert task.share_of_wall == pytest.approx(sum(durations) / timeline.wall)


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_run_stats_match_the_records(engine: str) -> None:
    timeline = traced(engine)
    stats = timeline.stats()
    assert (stats.engine, stats.device, stats.iterations) == (engine, "cpu", 20)
    assert stats.wall == timeline.wall and stats.throughput == pytest.approx(20 / timeline.wall)
    per_thread: Dict[str, List[TaskRecord]] = {}
    for record in timeline.records:
        per_thread.setdefault(record.thread_group, []).append(record)
    assert set(stats.thread_idle) == set(timeline.thread_groups)
    for group, records in per_thread.items():
        busy = sum(r.duration for r in records)  # spans on one thread never overlap
        assert stats.thread_idle[group] == pytest.approx(1 - busy / timeline.wall)
        # the tasks' shares add up to the thread's busy fraction
        shares = sum(t.share_of_wall for t in stats.tasks if t.thread_group == group)
        assert shares == pytest.approx(1 - stats.thread_idle[group])
    for stream in timeline.streams:
        busy = sum(r.duration for r in timeline.records if r.stream == stream)
        assert stats.stream_idle[stream] == pytest.approx(1 - busy / timeline.wall)
    assert all(0.0 <= v <= 1.0 for v in [*stats.thread_idle.values(), *stats.stream_idle.values()])


def test_stats_are_frozen_and_print_as_tables() -> None:
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu")
    pipe.run(range(5), trace=True)
    stats = pipe.stats()
    assert isinstance(stats, RunStats)
    with pytest.raises(AttributeError):
        setattr(stats, "wall", 0.0)
    with pytest.raises(TypeError):
        operator.setitem(stats.thread_idle, "io", 0.0)
    text = str(stats)
    assert text == stats.format()
    lines = text.splitlines()
    assert lines[0].startswith("SWPipeline on cpu: 5 iterations in ") and lines[0].endswith(" ms/iteration")
    assert lines[2].split() == ["task", "thread", "stream", "runs", "median", "ms", "p95", "ms", "median", "wait",
                                "ms", "share", "of", "wall"]
    assert pipe.timeline is not None
    assert [line.split()[0] for line in lines[4:12]] == list(pipe.timeline.tasks)
    assert all(line.split()[3] == "5" for line in lines[4:12])
    assert "lane" in lines[13] and "idle (bubbles)" in lines[13]
    assert [" ".join(line.split()[:2]) for line in lines[15:]] == [
        "thread io", "thread dist", "thread default", "stream memcpy", "stream data_dist", "stream default"]
    with pytest.raises(KeyError, match="no task 'Nope' ran in this run"):
        stats.task("Nope")


def test_helpers() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([5.0], 0.95) == 5.0
    assert percentile(list(map(float, range(1, 101))), 0.95) == 95.0
    assert busy_time([]) == 0.0
    assert busy_time([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0), (3.5, 3.6)]) == 3.0


def test_an_empty_timeline_summarizes_to_zeros() -> None:
    empty = Timeline("SWPipeline", "cpu", 0.0, 0.0, (), ("A",), ("default",), ("default",))
    stats = summarize(empty)
    assert (stats.iterations, stats.throughput, stats.tasks) == (0, 0.0, ())
    assert dict(stats.thread_idle) == {"default": 0.0}
    assert "0 iterations" in str(stats)
