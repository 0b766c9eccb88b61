"""A plan whose thread groups share a stream: warned once at construction, shown in stats(), and the
tasks on the shared stream really take turns (never overlap), on both engines."""

from __future__ import annotations

import time
import warnings

import pytest

from swpipeline import (DataFlowPipeline, PipelinePlan, PipelineTask, SharedStreamWarning, SWPipeline,
                        TaskSchedule)

ENGINES = [("SWPipeline", lambda plan: SWPipeline(plan)),
           ("DataFlowPipeline", lambda plan: DataFlowPipeline(plan, max_depth=3))]


def _plan(streams):
    def nap(ctx):
        time.sleep(0.002)

    a, b, c = (PipelineTask(n, nap) for n in "abc")
    return PipelinePlan(schedule={a: TaskSchedule(stage=0, thread_group="load", stream=streams[0]),
                                  b: TaskSchedule(stage=0, thread_group="load", stream=streams[1]),
                                  c: TaskSchedule(stage=1, stream=streams[2])},
                        intra_iter_deps=[(b, a), (c, b)])


@pytest.mark.parametrize("name,make", ENGINES)
def test_shared_stream_warns_once_naming_stream_groups_tasks_and_fix(name, make):
    plan = _plan(["default", "default", "default"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make(plan)
    assert [w.category for w in caught] == [SharedStreamWarning]
    warning = caught[0]
    assert warning.filename == __file__  # attributed to the line that built the pipeline
    assert str(warning.message).startswith(
        "stream 'default' is used by thread group 'load' (a, b) and thread group 'default' (c). Tasks on one "
        "stream take turns, so these thread groups' tasks never overlap each other")
    assert "give each thread group's tasks their own stream (TaskSchedule(stream=...))" in str(warning.message)
    assert "warnings.simplefilter('ignore', swpipeline.SharedStreamWarning)" in str(warning.message)


@pytest.mark.parametrize("streams", [["s", "s", "default"], ["s", "t", "default"], ["default", "default", "x"]])
def test_no_warning_when_each_stream_belongs_to_one_thread_group(streams):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SharedStreamWarning)
        for _, make in ENGINES:
            make(_plan(streams))


def test_one_warning_lists_every_shared_stream():
    def nop(ctx):
        pass

    t = [PipelineTask(f"t{i}", nop) for i in range(4)]
    plan = PipelinePlan(schedule={t[0]: TaskSchedule(stage=0, thread_group="g", stream="s"),
                                  t[1]: TaskSchedule(stage=0, thread_group="h", stream="s"),
                                  t[2]: TaskSchedule(stage=1, thread_group="g"),
                                  t[3]: TaskSchedule(stage=1, thread_group="h")},
                        intra_iter_deps=[(t[2], t[0]), (t[3], t[1])])
    with pytest.warns(SharedStreamWarning) as caught:
        SWPipeline(plan)
    assert len(caught) == 1
    assert str(caught[0].message).startswith(
        "stream 's' is used by thread group 'g' (t0) and thread group 'h' (t1); stream 'default' is used by "
        "thread group 'g' (t2) and thread group 'h' (t3). Tasks on one stream")


@pytest.mark.parametrize("name,make", ENGINES)
def test_stats_show_the_shared_stream_and_its_tasks_never_overlap(name, make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SharedStreamWarning)
        pipe = make(_plan(["default", "default", "default"]))
    pipe.run(iter(range(12)), trace=True)
    stats = pipe.stats()
    assert dict(stats.shared_streams) == {"default": ("load", "default")}
    assert ("stream default is shared by thread groups load, default: their tasks took turns on it and never "
            "overlapped; give each group its own stream to let them") in str(stats)
    spans = sorted((r.cpu_start, r.cpu_end) for r in pipe.timeline.records)
    assert len(spans) == 36
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start  # one lane: no two tasks ever ran at once


def test_stats_of_a_plan_with_separate_streams_list_no_shared_stream():
    pipe = SWPipeline(_plan(["a", "a", "default"]))
    pipe.run(iter(range(6)), trace=True)
    assert dict(pipe.stats().shared_streams) == {}
    assert "is shared by" not in str(pipe.stats())
