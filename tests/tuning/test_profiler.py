"""TaskProfiler: exposed time per task from shortcut measurements, and the report format."""

from __future__ import annotations

from typing import Any, Dict

import pytest

from swpipeline import IterContext, PipelinePlan, PipelineTask, ProfileResult, SWPipeline, TaskProfiler, TaskSchedule


class VirtualClock:
    """A clock that only tasks move: each task advances it by its cost, so every timing is exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def task(self, name: str, ms: float) -> PipelineTask:
        def fn(ctx: IterContext) -> None:
            self.now += ms / 1000
            setattr(ctx, name, ms)
        return PipelineTask(name, fn)

    def chain(self, costs_ms: Dict[str, float]) -> PipelinePlan:
        """One task per ``{name: ms}``, each after the one before."""
        tasks = [self.task(name, ms) for name, ms in costs_ms.items()]
        return PipelinePlan({t: TaskSchedule() for t in tasks},
                            intra_iter_deps=[(b, a) for a, b in zip(tasks, tasks[1:])])


def test_exposed_times_are_what_each_task_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = VirtualClock()
    monkeypatch.setattr("swpipeline.tuning.profiler.time", clock)
    costs = {"T1ms": 1.0, "T9ms": 9.0, "T3ms": 3.0, "T0ms": 0.0}
    plan = clock.chain(costs)
    result = TaskProfiler(SWPipeline(plan, device="cpu")).profile(None, num_warmup=1, num_measure=4, num_rounds=3)
    assert list(result.exposed_s) == list(costs)  # serial order
    assert result.exposed_s == pytest.approx({name: ms / 1000 for name, ms in costs.items()}, abs=1e-12)
    assert result.baseline_s == pytest.approx(0.013, abs=1e-12)


def test_a_drifting_machine_is_cancelled_by_pairing(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every timed block runs 10% slower than the one before (a machine slowing down); each shortcut block is
    # compared with the baseline block measured just before it, so the drift shows only as that 10%.
    clock = VirtualClock()
    monkeypatch.setattr("swpipeline.tuning.profiler.time", clock)
    blocks = [0]
    real_round = TaskProfiler._timed_round

    def drifting_round(self: TaskProfiler, batch: Any, num_measure: int) -> float:
        blocks[0] += 1
        return real_round(self, batch, num_measure) * 1.1 ** blocks[0]

    monkeypatch.setattr(TaskProfiler, "_timed_round", drifting_round)
    a, b = clock.task("A", 2.0), clock.task("B", 8.0)
    plan = PipelinePlan({a: TaskSchedule(), b: TaskSchedule()}, intra_iter_deps=[(b, a)])
    result = TaskProfiler(SWPipeline(plan, device="cpu")).profile(None, num_warmup=0, num_measure=1, num_rounds=1)
    # A: baseline block 1 (10 ms x 1.1), then 8 ms x 1.1^2; B: baseline block 3 (10 ms x 1.1^3), then 2 ms x 1.1^4
    assert result.exposed_s == pytest.approx({"A": 0.010 * 1.1 - 0.008 * 1.1 ** 2,
                                              "B": 0.010 * 1.1 ** 3 - 0.002 * 1.1 ** 4}, abs=1e-12)


def test_profiling_restores_the_shortcut_state_and_respects_skip_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = VirtualClock()
    monkeypatch.setattr("swpipeline.tuning.profiler.time", clock)
    costs = {"T0ms": 0.0, "T0.5ms": 0.5, "T0.25ms": 0.25}
    pipe = SWPipeline(clock.chain(costs), device="cpu")
    pipe.enable_shortcut("T0.5ms")
    pipe.run_one_serial_iter(None)  # builds the cache
    cache = pipe._shortcut.table.caches["T0.5ms"]
    result = TaskProfiler(pipe).profile(None, num_warmup=0, num_measure=2, num_rounds=1, skip_tasks={"T0ms"})
    # the baseline runs every task (the shortcut is off while profiling), the skipped one too
    assert result.baseline_s == pytest.approx(sum(costs.values()) / 1000, abs=1e-12)
    assert result.exposed_s == pytest.approx({"T0.5ms": 0.5 / 1000, "T0.25ms": 0.25 / 1000}, abs=1e-12)
    assert list(result.exposed_s) == ["T0.5ms", "T0.25ms"]
    assert pipe.shortcuts == ["T0.5ms"] and pipe._shortcut.table.caches["T0.5ms"] is cache
    many = TaskProfiler(pipe).profile_many([None, None], num_warmup=0, num_measure=1, num_rounds=1)
    assert [r.baseline_s for r in many] == pytest.approx([sum(costs.values()) / 1000] * 2, abs=1e-12)


def test_invalid_arguments_and_state() -> None:
    pipe = SWPipeline(VirtualClock().chain({"T0ms": 0.0, "T0.1ms": 0.1}), device="cpu")
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
