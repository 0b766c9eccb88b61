"""TaskProfiler: exposed time per task from shortcut measurements, and the report format."""

from __future__ import annotations

import time
from typing import Any, List

import pytest

from swpipeline import (IterContext, PipelinePlan, PipelineTask, ProfileResult, SWPipeline, TaskProfiler,
                        TaskSchedule)


def sleeper(ms: float) -> Any:
    def fn(ctx: IterContext) -> None:
        time.sleep(ms / 1000)
        setattr(ctx, f"out{ms}", ms)
    return fn


def sleep_plan(costs_ms: List[float]) -> PipelinePlan:
    tasks = [PipelineTask(f"T{ms:g}ms", sleeper(ms)) for ms in costs_ms]
    return PipelinePlan({t: TaskSchedule() for t in tasks},
                        intra_iter_deps=[(b, a) for a, b in zip(tasks, tasks[1:])])


def test_exposed_times_rank_and_scale_like_the_injected_costs() -> None:
    pipe = SWPipeline(sleep_plan([1, 9, 3, 0]), device="cpu")
    result = TaskProfiler(pipe).profile(None, num_warmup=1, num_measure=4, num_rounds=3)
    exposed = result.exposed_s
    assert list(exposed) == ["T1ms", "T9ms", "T3ms", "T0ms"]  # serial order
    assert sorted(exposed, key=exposed.__getitem__, reverse=True)[:3] == ["T9ms", "T3ms", "T1ms"]
    assert 0.006 < exposed["T9ms"] < 0.014  # generous: 9 ms injected
    assert exposed["T9ms"] > 2 * exposed["T3ms"] > 2 * exposed["T1ms"]
    assert exposed["T0ms"] < exposed["T1ms"]
    assert 0.012 < result.baseline_s < 0.030  # 13 ms of sleeps plus overhead


def test_profiling_restores_the_shortcut_state_and_respects_skip_tasks() -> None:
    pipe = SWPipeline(sleep_plan([0, 0.5, 0.25]), device="cpu")
    pipe.enable_shortcut("T0.5ms")
    pipe.run_one_serial_iter(None)  # builds the cache
    cache = pipe._shortcuts.caches["T0.5ms"]
    result = TaskProfiler(pipe).profile(None, num_warmup=0, num_measure=2, num_rounds=1, skip_tasks={"T0ms"})
    assert list(result.exposed_s) == ["T0.5ms", "T0.25ms"]
    assert pipe.shortcuts == ["T0.5ms"] and pipe._shortcuts.caches["T0.5ms"] is cache
    assert [TaskProfiler(pipe).profile_many([None, None], num_warmup=0, num_measure=1, num_rounds=1)[k].baseline_s > 0
            for k in range(2)] == [True, True]


def test_invalid_arguments_and_state() -> None:
    pipe = SWPipeline(sleep_plan([0, 0.1]), device="cpu")
    profiler = TaskProfiler(pipe)
    with pytest.raises(ValueError, match="num_measure must be an int >= 1"):
        profiler.profile(None, num_measure=0)
    with pytest.raises(ValueError, match=r"skip_tasks: unknown task\(s\) \['Nope'\]"):
        profiler.profile(None, skip_tasks={"Nope"})
    with pytest.raises(TypeError, match="needs an SWPipeline or DataFlowPipeline"):
        TaskProfiler(object())  # type: ignore[arg-type]
    it = pipe.fill_pipeline(range(3))
    with pytest.raises(RuntimeError, match="in flight"):
        profiler.profile(None)
    pipe.drain()
    del it


def test_report_format(capsys: pytest.CaptureFixture[str]) -> None:
    result = ProfileResult(0.008503, {"CopyBatch": 0.000521, "EmbLookup": 0.001234})
    result.print_report()
    assert capsys.readouterr().out == (
        "Baseline serial iteration: 8.503 ms\n"
        "\n"
        "Task                        Exposed   % baseline\n"
        "------------------------ ---------- ------------\n"
        "CopyBatch                   0.521ms         6.1%\n"
        "EmbLookup                   1.234ms        14.5%\n"
        "------------------------ ---------- ------------\n"
        "SUM                         1.755ms        20.6%\n")
