"""SWPipeline end to end on the CPU: timelines, data edge cases, life cycle, threads and streams."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, List

import pytest
import torch

from engine_helpers import (ExecLog, FakeStream, check_dependencies, drive, make_plan, progress_until_stop,
                            sparse_dist_plan, swp_threads, wait_until)
from swpipeline import (CPUDevice, DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SimulatedDevice,
                        SWPipeline, TaskSchedule)
from swpipeline.plan import ordering
from swpipeline.errors import DependencyTimeoutError, ProgressTimeoutError


# Plans here put several thread groups on one stream on purpose (the turns are what is tested).
pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")

SD = ["H2D", "InputDistStart", "ZeroGrad", "InputDistWait", "WaitBatch", "Forward", "Backward", "OptimizerStep"]


def test_single_thread_timeline_is_the_period_schedule() -> None:
    # One worker receives each period in the ready-first order; it must run exactly that.
    log = ExecLog()
    pipe = SWPipeline(sparse_dist_plan(log, single_group=True), device="cpu")
    assert pipe.enqueue_order == SD
    assert drive(pipe, range(4)) == [0, 1, 2, 3]
    period0 = [("H2D", 0)]
    period1 = [("H2D", 1), ("InputDistStart", 0), ("InputDistWait", 0)]
    period2 = [("H2D", 2), ("InputDistStart", 1), ("ZeroGrad", 0), ("InputDistWait", 1), ("WaitBatch", 0),
               ("Forward", 0), ("Backward", 0), ("OptimizerStep", 0)]
    period3 = [("H2D", 3), ("InputDistStart", 2), ("ZeroGrad", 1), ("InputDistWait", 2), ("WaitBatch", 1),
               ("Forward", 1), ("Backward", 1), ("OptimizerStep", 1)]
    period4 = [("InputDistStart", 3), ("ZeroGrad", 2), ("InputDistWait", 3), ("WaitBatch", 2), ("Forward", 2),
               ("Backward", 2), ("OptimizerStep", 2)]
    period5 = [("ZeroGrad", 3), ("WaitBatch", 3), ("Forward", 3), ("Backward", 3), ("OptimizerStep", 3)]
    assert log.starts() == period0 + period1 + period2 + period3 + period4 + period5
    assert log.threads_of("H2D") == {"swp-default"}
    assert swp_threads() == []


def test_each_thread_group_runs_its_share_in_period_order() -> None:
    log = ExecLog()
    plan = sparse_dist_plan(log)
    pipe = SWPipeline(plan, device="cpu")
    assert drive(pipe, range(5)) == list(range(5))
    assert log.starts_on("swp-io") == [("H2D", i) for i in range(5)]
    assert log.starts_on("swp-dist") == [(t, i) for i in range(5) for t in ("InputDistStart", "InputDistWait")]
    stage2 = ["ZeroGrad", "WaitBatch", "Forward", "Backward", "OptimizerStep"]
    assert log.starts_on("swp-default") == [(t, i) for i in range(5) for t in stage2]
    assert check_dependencies(log, plan, 5) == 5 * 8 + 4 * 1


@pytest.mark.parametrize("num_batches", [0, 1, 2, 3, 4, 11])
def test_every_batch_is_processed_whatever_the_count(num_batches: int) -> None:
    # depth 3: covers an empty iterator, fewer batches than the depth, exactly the depth, more.
    seen: List[int] = []

    def consume(ctx: IterContext) -> None:
        seen.append(ctx.batch)

    log = ExecLog()
    plan = sparse_dist_plan(log, work={"OptimizerStep": consume})
    pipe = SWPipeline(plan, device="cpu")
    batches = [f"b{k}" for k in range(num_batches)]
    assert drive(pipe, iter(batches)) == list(range(num_batches))
    assert [f"b{k}" for k in range(num_batches)] == seen
    assert sorted(log.starts()) == sorted((t, i) for t in plan.task_names for i in range(num_batches))
    with pytest.raises(StopIteration):
        pipe.progress(iter([]))  # stays exhausted
    assert swp_threads() == []


class TaskClock:
    """A ``time.perf_counter`` that only tasks move, each by its cost: the seconds a run reports are exact."""

    def __init__(self) -> None:
        self.now = 0.0
        self._lock = threading.Lock()

    def perf_counter(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        with self._lock:  # tasks on several threads
            self.now += seconds


def test_run_returns_seconds_and_results_flow_through_the_context(monkeypatch: pytest.MonkeyPatch) -> None:
    out: List[int] = []
    clock = TaskClock()
    monkeypatch.setattr(time, "perf_counter", clock.perf_counter)
    cost = {"A": 1.0, "B": 2.0, "C": 4.0}  # seconds, exact in binary

    def double(ctx: IterContext) -> None:
        clock.spend(cost["A"])
        ctx.y = ctx.batch * 2

    def add_one(ctx: IterContext) -> None:
        clock.spend(cost["B"])
        ctx.z = ctx.y + 1
        del ctx.y

    def collect(ctx: IterContext) -> None:
        clock.spend(cost["C"])
        out.append(ctx.z)

    a, b, c = PipelineTask("A", double), PipelineTask("B", add_one), PipelineTask("C", collect)
    plan = PipelinePlan({a: TaskSchedule(stage=0, thread_group="io"), b: TaskSchedule(stage=1),
                         c: TaskSchedule(stage=1)}, intra_iter_deps=[(b, a), (c, b)])
    pipe = SWPipeline(plan, device="cpu")
    elapsed = pipe.run(range(20))
    assert isinstance(elapsed, float) and elapsed == 20 * sum(cost.values())  # from the fill to the last retire
    assert out == [2 * k + 1 for k in range(20)]
    assert pipe.run_serial(range(3)) == 3 * sum(cost.values())
    assert out[20:] == [1, 3, 5]


def test_progress_returns_oldest_and_last_context() -> None:
    log = ExecLog()
    pipe = SWPipeline(sparse_dist_plan(log), device="cpu")
    it = pipe.fill_pipeline(["a", "b", "c", "d"])
    assert pipe.progress(it) == 0
    ctx = pipe.last_context
    assert ctx is not None and (ctx.iter_idx, ctx.batch) == (0, "a")
    assert pipe.progress(it) == 1
    pipe.drain()
    assert swp_threads() == []


def test_live_contexts_never_exceed_the_depth() -> None:
    observed: List[int] = []
    pipe_box: List[SWPipeline] = []

    def observe(ctx: IterContext) -> None:
        observed.append(len(pipe_box[0].contexts_in_flight()))

    log = ExecLog()
    pipe = SWPipeline(sparse_dist_plan(log, work={"H2D": observe, "Forward": observe}), device="cpu")
    pipe_box.append(pipe)
    it = pipe.fill_pipeline(range(30))
    while True:
        assert len(pipe.contexts_in_flight()) <= pipe.depth
        try:
            pipe.progress(it)
        except StopIteration:
            break
    assert max(observed) == pipe.depth and len(observed) == 60


def test_life_cycle_errors_and_reuse() -> None:
    log = ExecLog()
    pipe = SWPipeline(sparse_dist_plan(log), device="cpu")
    with pytest.raises(RuntimeError, match="before fill_pipeline"):
        pipe.progress(iter([1]))
    it = pipe.fill_pipeline(range(10))
    with pytest.raises(RuntimeError, match="call drain"):
        pipe.fill_pipeline(range(10))
    assert pipe.progress(it) == 0
    pipe.drain()  # retires iterations 1 and 2 (fetched during fill and the first progress)
    assert {i for _, i in log.starts()} == {0, 1, 2, 3}
    assert sorted(i for t, i in log.starts() if t == "OptimizerStep") == [0, 1, 2, 3]
    assert swp_threads() == []
    log.events.clear()
    assert drive(pipe, ["x", "y"]) == [0, 1]  # fresh run: iteration numbers restart at 0
    pipe.drain()
    with pytest.raises(TypeError, match="data_iter must be iterable"):
        pipe.fill_pipeline(5)  # type: ignore[arg-type]


def test_refill_after_stop_iteration_without_drain() -> None:
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu")
    assert drive(pipe, range(2)) == [0, 1]
    assert drive(pipe, range(3)) == [0, 1, 2]


def test_progress_none_retires_without_fetching_then_resumes() -> None:
    seen: List[Any] = []
    log = ExecLog()
    pipe = SWPipeline(sparse_dist_plan(log, work={"OptimizerStep": lambda ctx: seen.append(ctx.batch)}),
                      device="cpu")
    it = pipe.fill_pipeline(iter(range(100)))  # fetches batches 0, 1, 2
    assert pipe.progress(None) == 0
    assert pipe.progress(None) == 1
    assert pipe.progress(it) == 2  # the clock ran ahead without data; batch 3 enters now
    assert pipe.progress(it) == 3
    assert pipe.progress(None) == 4
    with pytest.raises(StopIteration):
        pipe.progress(None)
    assert seen == [0, 1, 2, 3, 4]
    assert swp_threads() == []


def test_context_manager_drains() -> None:
    with SWPipeline(sparse_dist_plan(ExecLog()), device="cpu") as pipe:
        it = pipe.fill_pipeline(range(5))
        pipe.progress(it)
        assert len(swp_threads()) == 3
    assert swp_threads() == []


def test_run_serial_uses_the_calling_thread_in_topological_order() -> None:
    log = ExecLog()
    pipe = SWPipeline(sparse_dist_plan(log), device="cpu")
    pipe.run_serial(range(2))
    serial = ["H2D", "InputDistStart", "InputDistWait", "ZeroGrad", "WaitBatch", "Forward", "Backward",
              "OptimizerStep"]
    assert log.starts() == [(t, i) for i in range(2) for t in serial]
    assert log.threads_of("H2D") == {threading.current_thread().name}
    ctx = pipe.run_one_serial_iter("batch", iter_idx=7)
    assert (ctx.batch, ctx.iter_idx) == ("batch", 7)
    it = pipe.fill_pipeline(range(3))
    with pytest.raises(RuntimeError, match="drain"):
        pipe.run_one_serial_iter(0)
    pipe.drain()
    del it


def test_tasks_on_one_stream_never_overlap_on_cpu() -> None:
    # Two thread groups share the stream "lane": like kernels on one GPU stream, they must not overlap, and
    # they take turns in the schedule's order: period p runs A(p) and B(p - 1), in the enqueue order.
    log = ExecLog()
    pipe = SWPipeline(make_plan(log, {"A": (0, "lane", "g1"), "B": (1, "lane", "g2")}), device="cpu")
    pipe.run(range(15))
    stage = {"A": 0, "B": 1}
    turns = [(task, period - stage[task]) for period in range(16) for task in pipe.enqueue_order
             if 0 <= period - stage[task] < 15]
    assert [(kind, task, i) for _, kind, task, i, _ in log.events] == [
        (kind, task, i) for task, i in turns for kind in ("start", "end")]


def test_device_resolution(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("swpipeline.devices.device.machine_accelerator", lambda: None)  # a machine without one
    plan = sparse_dist_plan(ExecLog())
    assert isinstance(SWPipeline(plan).device, CPUDevice)
    with caplog.at_level(logging.WARNING, logger="swpipeline"):
        pipe = SWPipeline(plan, device=0)
    assert isinstance(pipe.device, CPUDevice) and "no accelerator" in caplog.text
    assert str(SWPipeline(plan, device=torch.device("cpu")).device) == "cpu"
    with pytest.raises(ValueError, match="'cuda:1' requested"):
        SWPipeline(plan, device="cuda:1")
    with pytest.raises(ValueError, match="not a device torch knows"):
        SWPipeline(plan, device="gpu7")
    with pytest.raises(TypeError, match="device must be"):
        SWPipeline(plan, device=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device index must be >= 0"):
        SWPipeline(plan, device=-1)
    sim = SimulatedDevice()
    assert SWPipeline(plan, device=sim).device is sim
    with pytest.raises(ValueError, match="signal_timeout must be a finite number of seconds > 0"):
        SWPipeline(plan, signal_timeout=0)
    with pytest.raises(TypeError, match="plan must be a PipelinePlan"):
        SWPipeline({"A": TaskSchedule()})  # type: ignore[arg-type]


def test_verbose_run_shows_a_progress_line(capsys: pytest.CaptureFixture[str]) -> None:
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu")
    pipe.run(list(range(6)), verbose=True)
    pipe.run_serial(list(range(6)), verbose=True)
    err = capsys.readouterr().err
    assert "SWPipeline: 6/6 iterations" in err
    assert "SWPipeline (serial): 6/6 iterations" in err


def test_ranges_are_annotated_only_when_a_profiler_records(monkeypatch: pytest.MonkeyPatch) -> None:
    labels: List[str] = []
    real = torch.profiler.record_function

    def spy(label: str) -> Any:
        labels.append(label)
        return real(label)

    monkeypatch.setattr(torch.profiler, "record_function", spy)
    a = PipelineTask("A", lambda ctx: None)
    pipe = SWPipeline(PipelinePlan({a: TaskSchedule()}), device="cpu")
    pipe.run(range(3))
    pipe.run_serial(range(3))
    assert labels == []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        pipe.run_serial(range(2))
    assert labels == ["SWP_serial/A/iter0", "SWP_serial/A/iter1"]
    names = {e.name for e in prof.events()}
    assert {"SWP_serial/A/iter0", "SWP_serial/A/iter1"} <= names


def test_emit_nvtx_is_ignored_without_cuda(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("swpipeline.devices.annotations.nvtx_available", lambda: False)
    log = ExecLog()
    plan = sparse_dist_plan(log)
    pipe = SWPipeline(plan, device="cpu")
    with caplog.at_level(logging.WARNING, logger="swpipeline"):
        pipe.run(range(3), emit_nvtx=True)
    assert "emit_nvtx=True ignored" in caplog.text
    assert sorted(log.starts()) == sorted((task, i) for task in plan.task_names for i in range(3))  # it ran


def test_emit_nvtx_opens_a_range_per_unit_where_cuda_is(caplog: pytest.LogCaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # With CUDA present NVTX marks the host timeline whatever device the pipeline computes on.
    pushed: List[str] = []
    monkeypatch.setattr("swpipeline.devices.annotations.nvtx_available", lambda: True)
    monkeypatch.setattr("swpipeline.devices.annotations._range_push", pushed.append)
    monkeypatch.setattr("swpipeline.devices.annotations._range_pop", lambda: pushed.append("pop"))
    monkeypatch.setattr("swpipeline.devices.annotations.emit_nvtx_context", contextlib.nullcontext)  # autograd's ranges
    a = PipelineTask("A", lambda ctx: None)
    pipe = SWPipeline(PipelinePlan({a: TaskSchedule(thread_group="w")}), device="cpu")
    with caplog.at_level(logging.WARNING, logger="swpipeline"):
        pipe.run(range(2), emit_nvtx=True)
        pipe.run_serial(range(1), emit_nvtx=True)
    assert pushed == ["SWP/A/iter0", "pop", "SWP/A/iter1", "pop", "SWP_serial/A/iter0", "pop"]
    assert caplog.text == ""


def test_seed_api_example_runs_unchanged() -> None:
    # The PipelinePlan example of the API reference, with device=0 (CPU here) and a named copy stream.
    from sw_pipeline import PipelinePlan as SeedPlan, PipelineTask as SeedTask, SWPipeline as SeedPipe
    from sw_pipeline import TaskSchedule as SeedSchedule

    trace: List[str] = []
    copy_stream = "memcpy"
    copy = SeedTask("H2D", lambda ctx: trace.append(f"H2D{ctx.iter_idx}"))
    fwd = SeedTask("Forward", lambda ctx: trace.append(f"F{ctx.iter_idx}"))
    bwd = SeedTask("Backward", lambda ctx: trace.append(f"B{ctx.iter_idx}"))
    optim = SeedTask("Optim", lambda ctx: trace.append(f"O{ctx.iter_idx}"))
    plan = SeedPlan(
        schedule={
            copy: SeedSchedule(stage=0, stream=copy_stream, thread_group="io"),
            fwd: SeedSchedule(stage=1, thread_group="compute"),
            bwd: SeedSchedule(stage=1, thread_group="compute"),
            optim: SeedSchedule(stage=1, thread_group="compute"),
        },
        intra_iter_deps=[(fwd, copy), (bwd, fwd), (optim, bwd)],
        inter_iter_deps=[(fwd, optim)],
        pipeline_depth=2,
    )
    pipe = SeedPipe(plan, device=0)
    data_iter = pipe.fill_pipeline(range(3))
    while True:
        try:
            idx = pipe.progress(data_iter)
        except StopIteration:
            break
    assert idx == 2
    compute = [t for t in trace if not t.startswith("H2D")]
    assert compute == ["F0", "B0", "O0", "F1", "B1", "O1", "F2", "B2", "O2"]
    assert [t for t in trace if t.startswith("H2D")] == ["H2D0", "H2D1", "H2D2"]


def test_stream_objects_get_their_own_lanes_whatever_their_label() -> None:
    first, second = FakeStream("shared"), FakeStream("shared")
    plan = PipelinePlan({"A": TaskSchedule(stream=first), "B": TaskSchedule(stream=second),
                         "C": TaskSchedule(stream="shared"), "D": TaskSchedule(stream=FakeStream()),
                         "E": TaskSchedule(stream="stream0")})
    pipe = SWPipeline(plan, device="cpu")
    lanes = {t.name: t.stream for t in pipe._tasks}
    assert len({id(lane) for lane in lanes.values()}) == 5
    assert [t.stream_label for t in pipe._tasks] == ["shared", "shared", "shared", "stream0", "stream0"]


def test_missing_context_attribute_says_which_dependency_is_missing() -> None:
    def forward(ctx: IterContext) -> None:
        ctx.out = ctx.x_gpu * 2

    plan = PipelinePlan({PipelineTask("Forward", forward): TaskSchedule()})
    with pytest.raises(AttributeError, match=r"iteration 0 has no attribute 'x_gpu'; it has batch, iter_idx\. If "
                                             r"another task sets 'x_gpu', that task must run first: declare it in "
                                             r"intra_iter_deps"):
        SWPipeline(plan, device="cpu").run_one_serial_iter(None)


def test_worker_init_runs_once_per_thread_group_on_its_thread() -> None:
    calls: List[tuple[str, str]] = []
    lock = threading.Lock()

    def init(group: str) -> None:
        with lock:
            calls.append((group, threading.current_thread().name))

    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu", worker_init=init)
    pipe.run(range(4))
    assert sorted(calls) == [("default", "swp-default"), ("dist", "swp-dist"), ("io", "swp-io")]
    with pytest.raises(TypeError, match="worker_init must be a callable"):
        SWPipeline(sparse_dist_plan(ExecLog()), device="cpu", worker_init="pin")  # type: ignore[arg-type]


def test_worker_init_failure_fails_the_pipeline() -> None:
    def init(group: str) -> None:
        if group == "dist":
            raise OSError("cannot pin")

    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu", worker_init=init)
    with pytest.raises(OSError, match="cannot pin"):
        pipe.run(range(4))
    assert swp_threads() == []


def test_caller_thread_group_runs_on_the_thread_that_calls_progress() -> None:
    log = ExecLog()
    pipe = SWPipeline(sparse_dist_plan(log), device="cpu", caller_thread_group="default")
    assert drive(pipe, range(6)) == list(range(6))
    main = threading.current_thread().name
    assert log.threads_of("Forward") == {main} and log.threads_of("H2D") == {"swp-io"}
    assert len(swp_threads()) == 0
    with pytest.raises(ValueError, match=r"caller_thread_group='gpu' is not a thread group of the plan"):
        SWPipeline(sparse_dist_plan(log), device="cpu", caller_thread_group="gpu")


def test_run_runs_the_last_stage_on_the_caller_and_step_control_keeps_workers() -> None:
    main = threading.current_thread().name
    log = ExecLog()
    pipe = SWPipeline(sparse_dist_plan(log), device="cpu")  # caller_thread_group="auto"
    pipe.run(range(6))
    assert {t: log.threads_of(t) for t in ("H2D", "InputDistStart", "Forward", "OptimizerStep")} == {
        "H2D": {"swp-io"}, "InputDistStart": {"swp-dist"}, "Forward": {main}, "OptimizerStep": {main}}
    log.events.clear()
    assert drive(pipe, range(6)) == list(range(6))  # fill_pipeline()/progress(): every group on a worker
    assert log.threads_of("Forward") == {"swp-default"}
    for kwargs in (dict(caller_thread_group=None), dict(worker_init=lambda group: None)):
        log.events.clear()
        SWPipeline(sparse_dist_plan(log), device="cpu", **kwargs).run(range(4))  # type: ignore[arg-type]
        assert log.threads_of("Forward") == {"swp-default"}, kwargs
    assert swp_threads() == []


# Load (stage 0) on a worker; Fwd (stage 1) and Step (stage 2) on the caller's thread, where a period runs
# Step(i - 2) before Fwd(i - 1) (on one stream the older iteration goes first).
LOAD_FWD_STEP = {"Load": (0, "load", "load"), "Fwd": (1, None, "default"), "Step": (2, None, "default")}


def load_fwd_step_pipe(engine: str, log: ExecLog, work: Any = None) -> Any:
    plan = make_plan(log, LOAD_FWD_STEP, [("Fwd", "Load"), ("Step", "Fwd")], work=work)
    if engine == "SWPipeline":
        return SWPipeline(plan, device="cpu", caller_thread_group="default")
    return DataFlowPipeline(plan, max_depth=3, device="cpu", caller_thread_group="default")


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_the_caller_hands_out_the_next_period_before_its_own_units_of_newer_iterations(engine: str) -> None:
    # Once Step(k) is done, iteration k retires and Load(k + 3) is handed out before the caller runs Fwd(k + 1):
    # so Fwd(i) can see Load(i + 2) start. (If the caller ran its whole period first, Load(i + 2) would be handed
    # out only after Fwd(i) returned, and each wait below would time out.)
    started = [threading.Event() for _ in range(8)]
    seen: List[bool] = []

    def fwd(ctx: IterContext) -> None:
        if ctx.iter_idx + 2 < len(started):
            seen.append(started[ctx.iter_idx + 2].wait(5))

    pipe = load_fwd_step_pipe(engine, ExecLog(), {"Load": lambda ctx: started[ctx.iter_idx].set(), "Fwd": fwd})
    pipe.run(range(len(started)))
    assert seen == [True] * (len(started) - 2)
    assert swp_threads() == []


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_progress_runs_the_callers_units_up_to_the_oldest_iteration_and_a_held_step_its_whole_period(
        engine: str) -> None:
    log = ExecLog()
    pipe = load_fwd_step_pipe(engine, log)
    main = threading.current_thread().name
    it = pipe.fill_pipeline(range(6))
    assert log.starts_on(main) == []  # the caller's units run only inside progress()
    assert pipe.progress(it) == 0
    assert log.starts_on(main) == [("Fwd", 0), ("Step", 0)]  # not Fwd(1), submitted after Step(0) in its period
    assert pipe.progress(it, advance=False) == 1
    assert log.starts_on(main)[2:] == [("Fwd", 1), ("Step", 1), ("Fwd", 2)]  # a held step: the whole period
    pipe.advance()
    assert pipe.progress(it) == 2
    assert log.starts_on(main)[5:] == [("Step", 2)]
    assert progress_until_stop(pipe, it) == [3, 4, 5]
    assert log.starts_on(main)[6:] == [("Fwd", 3), ("Step", 3), ("Fwd", 4), ("Step", 4), ("Fwd", 5), ("Step", 5)]
    assert swp_threads() == []


def test_the_last_stage_group_is_that_of_the_highest_stage_task_last_in_serial_order() -> None:
    a, b, c, d = (PipelineTask(n, lambda ctx: None) for n in "ABCD")
    plan = PipelinePlan({a: TaskSchedule(stage=0, thread_group="load"), b: TaskSchedule(stage=1, thread_group="x"),
                         c: TaskSchedule(stage=1, thread_group="y"), d: TaskSchedule(stage=0, thread_group="z")},
                        intra_iter_deps=[(b, a), (c, b)])
    assert ordering.last_stage_group(plan) == "y"  # B and C at stage 1; C comes after B
    assert ordering.last_stage_group(PipelinePlan({a: TaskSchedule(thread_group="only")})) == "only"


def test_a_dependency_the_caller_waits_on_is_bounded_by_progress_timeout() -> None:
    # Train runs on the caller's thread in run(); Load (a worker) hangs at iteration 2. The caller,
    # inside Train(2)'s wait, gives up after progress_timeout (not signal_timeout) and says what blocks.
    release = threading.Event()

    def load(ctx: IterContext) -> None:
        if ctx.iter_idx == 2:
            release.wait(30)

    log = ExecLog()
    plan = make_plan(log, {"Load": (0, "copy", "io"), "Train": (1, None, "compute")}, intra=[("Train", "Load")],
                     work={"Load": load})
    pipe = SWPipeline(plan, device="cpu", progress_timeout=0.2, signal_timeout=30, join_timeout=0.2)
    try:
        with pytest.raises(ProgressTimeoutError) as info:
            pipe.run(range(6))
        assert "tasks not yet done: ['Load', 'Train']" in str(info.value)
        assert "'Train' waits for 'Load' (iteration 2)" in str(info.value)
        cause = info.value.__cause__
        assert isinstance(cause, DependencyTimeoutError) and "'Train' (iteration 2) waited 0.2 s" in str(cause)
    finally:
        release.set()
    assert wait_until(lambda: swp_threads() == [], timeout=10)


def test_caller_thread_group_refuses_what_is_not_a_group_of_the_plan() -> None:
    for bad in ("gpu", 3, ""):
        with pytest.raises(ValueError, match=r"caller_thread_group=.* is not a thread group of the plan \(its "
                                             r"groups: \['io', 'dist', 'default'\]\); or pass \"auto\" or None"):
            SWPipeline(sparse_dist_plan(ExecLog()), device="cpu", caller_thread_group=bad)  # type: ignore[arg-type]


def test_progress_without_advance_holds_the_next_period_back() -> None:
    # With every task on the caller's thread, work happens only inside progress(): the log is exact.
    log = ExecLog()
    pipe = SWPipeline(sparse_dist_plan(log, single_group=True), device="cpu", caller_thread_group="default")
    it = pipe.fill_pipeline(range(5))
    assert log.starts() == []  # fill only queued periods 0-2
    assert pipe.progress(it, advance=False) == 0
    ran = len(log.starts())
    assert ran == 1 + 3 + 8 and [c.iter_idx for c in pipe.contexts_in_flight()] == [1, 2]
    with pytest.raises(RuntimeError, match=r"call advance\(\) first"):
        pipe.progress(it)
    pipe.advance()  # period 3 enqueued (batch 3 fetched), not yet run
    assert len(log.starts()) == ran and [c.iter_idx for c in pipe.contexts_in_flight()] == [1, 2, 3]
    assert pipe.progress(it) == 1
    assert log.starts()[ran:] == [("H2D", 3), ("InputDistStart", 2), ("ZeroGrad", 1), ("InputDistWait", 2),
                                  ("WaitBatch", 1), ("Forward", 1), ("Backward", 1), ("OptimizerStep", 1)]
    pipe.drain()
    assert sorted(i for t, i in log.starts() if t == "OptimizerStep") == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("caller", [None, "default"])
def test_abandon_drops_in_flight_iterations(caller: Any) -> None:
    log = ExecLog()
    pipe = SWPipeline(sparse_dist_plan(log), device="cpu", caller_thread_group=caller)
    it = pipe.fill_pipeline(range(100))
    assert pipe.progress(it) == 0
    pipe.abandon()
    assert swp_threads() == [] and pipe.contexts_in_flight() == []
    assert not any(t == "OptimizerStep" and i >= 3 for t, i in log.starts())
    assert drive(pipe, range(2)) == [0, 1]


# -- the device: what was asked, what is used, and drain() after serial iterations -----------------------


class CountingDevice(CPUDevice):
    """The CPU, counting the synchronizations it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.synchronized = 0

    def synchronize(self) -> None:
        self.synchronized += 1


class FakeAccelerator(CPUDevice):
    """What ``device=0`` resolves to on a machine with an accelerator, as far as the repr is concerned."""

    kind = "cuda:0"
    index = 0


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_repr_shows_the_device_asked_for_and_the_one_used_when_they_differ(engine: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def make(**kwargs: Any) -> Any:
        plan = sparse_dist_plan(ExecLog())
        return SWPipeline(plan, **kwargs) if engine == "SWPipeline" else DataFlowPipeline(plan, max_depth=3,
                                                                                          **kwargs)

    monkeypatch.setattr("swpipeline.devices.device.machine_accelerator", lambda: None)  # a machine without one
    assert repr(make(device=0)).startswith(f"{engine}(device=0 (cpu), ")  # the documented fall-back, shown
    assert repr(make(device="cpu")).startswith(f"{engine}(device=cpu, ")
    assert repr(make(device=torch.device("cpu"))).startswith(f"{engine}(device=cpu, ")
    assert repr(make()).startswith(f"{engine}(device=cpu, ")  # nothing asked: the one used
    monkeypatch.setattr("swpipeline.engine.parts.resolve_device", lambda spec: FakeAccelerator())
    assert repr(make(device=0)).startswith(f"{engine}(device=0, ")  # asked and used are the same
    assert repr(make(device="cuda:0")).startswith(f"{engine}(device=cuda:0, ")


def test_drain_after_serial_iterations_synchronizes_the_device(make_pipe: Any) -> None:
    device = CountingDevice()
    pipe = make_pipe(sparse_dist_plan(ExecLog()), device=device)
    pipe.run_one_serial_iter(0)
    pipe.run_one_serial_iter(1, iter_idx=1)
    assert device.synchronized == 0
    pipe.drain()  # serial iterations: drain() is just a device synchronize
    assert device.synchronized == 1
    drive(pipe, range(4))
    pipe.drain()
    assert device.synchronized == 2
