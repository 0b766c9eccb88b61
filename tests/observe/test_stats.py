"""Run statistics (src/swpipeline/observe/stats.py): every figure equals what the timeline's records say."""

from __future__ import annotations

import math
import operator
import re
import statistics
from typing import Dict, List

import pytest

from engine_helpers import ExecLog, sparse_dist_plan
from swpipeline import DataFlowPipeline, DependencyWait, RunStats, SWPipeline, TaskRecord, Timeline
from swpipeline.observe.stats import busy_time, percentile, summarize


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


def cells(line: str) -> List[str]:
    """A row of a printed table, split at its column separators (two spaces or more)."""
    return re.split(r" {2,}", line.strip())


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
    headline, blank, *lines = text.splitlines()
    assert blank == ""
    assert headline == (f"SWPipeline on cpu: 5 iterations in {stats.wall:.3f} s, {stats.throughput:.1f} iterations/s, "
                        f"{stats.wall / 5 * 1e3:.2f} ms/iteration")
    tasks, lanes = "\n".join(lines).split("\n\n")  # two tables, a blank line between
    header, rule, *rows = tasks.splitlines()
    assert cells(header) == ["task", "thread", "stream", "runs", "median ms", "p95 ms", "median wait ms",
                             "share of wall"]
    widths = [max(len(cell) for cell in column) for column in zip(*(cells(line) for line in (header, *rows)))]
    assert rule == "  ".join("-" * width for width in widths)  # each column as wide as its widest cell
    assert [cells(row) for row in rows] == [
        [t.task, t.thread_group, t.stream, "5", f"{t.median * 1e3:.3f}", f"{t.p95 * 1e3:.3f}",
         f"{t.median_wait * 1e3:.3f}", f"{t.share_of_wall:.1%}"] for t in stats.tasks]
    assert pipe.timeline is not None and [t.task for t in stats.tasks] == list(pipe.timeline.tasks)
    header, rule, *rows = lanes.splitlines()
    assert cells(header) == ["lane", "busy", "idle (bubbles)"]
    assert [cells(row) for row in rows] == [
        [f"{kind} {name}", f"{1 - idle:.1%}", f"{idle:.1%}"] for kind, idles in (("thread", stats.thread_idle),
                                                                                 ("stream", stats.stream_idle))
        for name, idle in idles.items()]
    assert [row[0] for row in map(cells, rows)] == [
        "thread io", "thread dist", "thread default", "stream memcpy", "stream data_dist", "stream default"]
    with pytest.raises(KeyError, match="no task 'Nope' ran in this run"):
        stats.task("Nope")


def test_stats_print_exactly() -> None:
    # Two iterations in 8 ms: Load (thread io, stream copy) runs 1 ms each; Train (thread and stream default)
    # waits 0.5 ms for Load, then runs 2 ms and 3 ms. Train: median 2.5 ms, p95 the longer run (3 ms), 5 of
    # the 8 ms (62.5%); Load 2 of 8 (25.0%); 2 iterations / 8 ms = 250.0 iterations/s, 4.00 ms each.
    ms = 1e-3

    def load(i: int, start: float) -> TaskRecord:
        return TaskRecord(task="Load", iteration=i, thread_group="io", stream="copy", stage=0, period=i,
                          ready=start * ms, cpu_start=start * ms, cpu_end=(start + 1) * ms)

    def train(i: int, ready: float, start: float, end: float) -> TaskRecord:
        return TaskRecord(task="Train", iteration=i, thread_group="default", stream="default", stage=1, period=i + 1,
                          ready=ready * ms, cpu_start=start * ms, cpu_end=end * ms,
                          waits=(DependencyWait("Load", i, ready * ms, start * ms),))

    records = (load(0, 0), train(0, 0.5, 1, 3), load(1, 4), train(1, 4.5, 5, 8))
    timeline = Timeline("SWPipeline", "cpu", 0.0, 8 * ms, records, ("Load", "Train"), ("io", "default"),
                        ("copy", "default"))
    assert str(summarize(timeline)) == """\
SWPipeline on cpu: 2 iterations in 0.008 s, 250.0 iterations/s, 4.00 ms/iteration

task   thread   stream   runs  median ms  p95 ms  median wait ms  share of wall
-----  -------  -------  ----  ---------  ------  --------------  -------------
Load   io       copy        2      1.000   1.000           0.000          25.0%
Train  default  default     2      2.500   3.000           0.500          62.5%

lane             busy  idle (bubbles)
--------------  -----  --------------
thread io       25.0%           75.0%
thread default  62.5%           37.5%
stream copy     25.0%           75.0%
stream default  62.5%           37.5%"""


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
