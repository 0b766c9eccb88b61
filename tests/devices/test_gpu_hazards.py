"""What would go wrong on a GPU, caught on the CPU.

``SimulatedDevice(behind_host=True)`` runs streams behind the host: it reports unordered
cross-stream accesses, memory reused under another stream's pending work, waits on
events never recorded, and two threads inside one stream object's context. A fake
accelerator API exercises ``TorchDevice``'s own stream switching without a GPU.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
import torch

from engine_helpers import swp_threads
from swpipeline import (DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SharedStreamWarning,
                        SimulatedDevice, SWPipeline, TaskSchedule, TorchDevice)

ENGINES = ["SWPipeline", "DataFlowPipeline"]


def make(engine: str, plan: PipelinePlan, device: Any) -> Any:
    return SWPipeline(plan, device=device) if engine == "SWPipeline" else DataFlowPipeline(plan, 3, device=device)


# -- the device model itself -----------------------------------------------------------------------


def launch(device: SimulatedDevice, stream: Any, name: str, fn: Any, it: int = 0) -> None:
    device.launch(stream, fn, IterContext(None, it), name)


def test_a_read_on_another_stream_without_a_wait_is_reported_and_a_wait_orders_it() -> None:
    for wait in (False, True):
        device = SimulatedDevice(behind_host=True)
        a, b = device.stream("a"), device.stream("b")
        box: Dict[str, torch.Tensor] = {}
        launch(device, a, "Make", lambda ctx: box.update(x=torch.ones(4) * 2))
        if wait:
            event = device.new_event()
            device.record(event, a)
            device.wait(b, event)
        launch(device, b, "Use", lambda ctx: box.update(y=box["x"] + 1))
        expected = [] if wait else [
            "Use(i0) on stream 'b' reads a storage allocated by Make(i0) on stream 'a', which Make(i0) on stream "
            "'a' wrote, without waiting for it"]
        assert device.hazards == expected


def test_a_write_under_another_streams_read_is_reported() -> None:
    device = SimulatedDevice(behind_host=True)
    a, b = device.stream("a"), device.stream("b")
    box: Dict[str, torch.Tensor] = {}
    launch(device, a, "Make", lambda ctx: box.update(x=torch.zeros(4) + 1))
    event = device.new_event()
    device.record(event, a)
    device.wait(b, event)
    launch(device, b, "Read", lambda ctx: box.update(y=box["x"] * 3))
    launch(device, a, "Overwrite", lambda ctx: box["x"].fill_(7.0))  # a never waited for b's read
    assert device.hazards == [
        "Overwrite(i0) on stream 'a' writes a storage allocated by Make(i0) on stream 'a', which Read(i0) on stream "
        "'b' read, without waiting for it"]


def test_freeing_memory_another_stream_may_still_read_is_reported_unless_kept_alive_or_synchronized() -> None:
    for protect in ("nothing", "keep_alive", "synchronize"):
        device = SimulatedDevice(behind_host=True)
        a, b = device.stream("a"), device.stream("b")
        box: Dict[str, torch.Tensor] = {}
        launch(device, a, "Copy", lambda ctx: box.update(x=torch.zeros(8) + 1))
        event = device.new_event()
        device.record(event, a)
        device.wait(b, event)
        launch(device, b, "Forward", lambda ctx: box.update(y=box["x"].sum()))
        if protect == "keep_alive":
            device.keep_alive(box["x"], b)
        elif protect == "synchronize":
            device.synchronize()
        del box["x"]  # the last reference: the storage is freed now
        expected = [] if protect != "nothing" else [
            "use after reuse: a storage allocated by Copy(i0) on stream 'a' was freed while Forward(i0) on stream "
            "'b' may still use it; nothing keeps it for stream 'b' (record_stream), so stream 'a' may reuse the "
            "memory under it"]
        assert device.hazards == expected, protect


def test_a_wait_on_an_event_never_recorded_is_reported() -> None:
    device = SimulatedDevice(behind_host=True)
    event = device.new_event()
    device.wait(device.stream("b"), event)
    assert device.hazards == [f"stream 'b' waits on event #{event.ident}, which was never recorded"]


def test_two_threads_inside_one_stream_objects_context_are_reported() -> None:
    device = SimulatedDevice(behind_host=True)
    stream = device.stream("s")
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with stream:
            inside.set()
            leave.wait(5)

    holder = threading.Thread(target=hold, name="holder")
    holder.start()
    inside.wait(5)
    with stream:
        pass
    leave.set()
    holder.join(5)
    assert device.hazards == ["two threads inside stream 's''s context: 'MainThread' entered it while 'holder' was "
                              "inside"]


# -- the engine on the model: memory handed across streams ----------------------------------------------


def copy_then_forward(results: Dict[int, float]) -> PipelinePlan:
    """The README's shape: the batch copied on a "copy" stream, used by the forward on the default stream."""

    def h2d(ctx: IterContext) -> None:
        ctx.x = ctx.batch * 1.0  # allocated on the copy stream
        ctx.parts = [ctx.x[:2] * 2, {"tail": ctx.x[2:] + 0}]  # tensors inside containers, too

    def forward(ctx: IterContext) -> None:
        results[ctx.iter_idx] = float((ctx.x * 2).sum() + ctx.parts[0].sum() + ctx.parts[1]["tail"].sum())

    copy, fwd = PipelineTask("H2D", h2d), PipelineTask("Forward", forward)
    return PipelinePlan({copy: TaskSchedule(stage=0, stream="copy", thread_group="io"), fwd: TaskSchedule(stage=1)},
                        intra_iter_deps=[(fwd, copy)])


def expected(n: int) -> Dict[int, float]:
    batches = [torch.arange(4.0) + i for i in range(n)]
    return {i: float((b * 2).sum() + (b[:2] * 2).sum() + b[2:].sum()) for i, b in enumerate(batches)}


@pytest.mark.parametrize("engine", ENGINES)
def test_tensors_handed_to_another_stream_are_kept_alive_for_it(engine: str) -> None:
    results: Dict[int, float] = {}
    device = SimulatedDevice(behind_host=True)
    make(engine, copy_then_forward(results), device).run([torch.arange(4.0) + i for i in range(8)])
    assert results == expected(8)
    assert device.hazards == []
    assert swp_threads() == []


@pytest.mark.parametrize("engine", ENGINES)
def test_without_keep_alive_the_model_reports_the_reuse(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The control: the same run with the engine's keep-alive switched off is a use-after-reuse on a GPU.
    monkeypatch.setattr("swpipeline.engine.executor.keep_written", lambda *args: None)
    device = SimulatedDevice(behind_host=True)
    make(engine, copy_then_forward({}), device).run([torch.arange(4.0) + i for i in range(3)])
    reused = [h for h in device.hazards if h.startswith("use after reuse: a storage allocated by H2D(i")]
    assert len(reused) >= 3 and all("Forward(i" in h and "stream 'default'" in h for h in reused)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_missing_cross_stream_dependency_is_reported(engine: str) -> None:
    # The host happens to order H2D(i) before Forward(i) (a threading.Event, not a declared dependency),
    # so the CPU run works; a GPU would still run Forward's kernels without waiting for the copy.
    copied = {i: threading.Event() for i in range(4)}

    def h2d(ctx: IterContext) -> None:
        ctx.x = ctx.batch * 1.0
        copied[ctx.iter_idx].set()

    def forward(ctx: IterContext) -> None:
        assert copied[ctx.iter_idx].wait(60)
        ctx.y = ctx.x * 2

    plan = PipelinePlan({PipelineTask("H2D", h2d): TaskSchedule(stage=0, stream="copy", thread_group="io"),
                         PipelineTask("Forward", forward): TaskSchedule(stage=1)})  # no (Forward, H2D) pair
    device = SimulatedDevice(behind_host=True)
    make(engine, plan, device).run([torch.arange(4.0) + i for i in range(4)])
    unordered = [h for h in device.hazards if "without waiting" in h]
    assert unordered == [f"Forward(i{i}) on stream 'default' reads a storage allocated by H2D(i{i}) on stream "
                         f"'copy', which H2D(i{i}) on stream 'copy' wrote, without waiting for it" for i in range(4)]


def prep_on_a_side_stream(results: Dict[int, float]) -> PipelinePlan:
    """Prep reads the batch on its own stream and thread group; Train uses Prep's output on the default stream."""

    def prep(ctx: IterContext) -> None:
        ctx.x = ctx.batch * 2

    def train(ctx: IterContext) -> None:
        results[ctx.iter_idx] = float(ctx.x.sum())

    p, t = PipelineTask("Prep", prep), PipelineTask("Train", train)
    return PipelinePlan({p: TaskSchedule(stage=0, stream="prep", thread_group="prep"), t: TaskSchedule(stage=1)},
                        intra_iter_deps=[(t, p)])


def batches_made_while_drawn(n: int) -> Iterator[torch.Tensor]:
    """A data iterator that makes each batch with tensor operations (on the caller's current stream)."""
    for i in range(n):
        yield torch.arange(4.0) + i


@pytest.mark.parametrize("engine", ENGINES)
def test_a_batch_made_on_the_callers_stream_is_read_on_another_stream_only_after_it(engine: str) -> None:
    results: Dict[int, float] = {}
    device = SimulatedDevice(behind_host=True)
    make(engine, prep_on_a_side_stream(results), device).run(batches_made_while_drawn(6))
    assert results == {i: float(((torch.arange(4.0) + i) * 2).sum()) for i in range(6)}
    assert device.hazards == []
    # Prep(i) waits for the event recorded on the caller's stream right after batch i was drawn
    launches = sim_positions(device, "fetch")
    for i in range(6):
        assert device.happens_before(launches[i], device.launches()[("Prep", i)])


@pytest.mark.parametrize("engine", ENGINES)
def test_without_the_batch_event_the_model_reports_the_unordered_read(engine: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # The control: a GPU would run Prep's kernels before the batch is made (the GPU run that found this
    # read batches made on the default stream from a side stream while other processes kept the GPU busy).
    def draw_without_event(self: Any, data_iter: Iterator[Any], idx: int) -> Any:
        return self.device.fetch(self.device.caller_stream(), data_iter, idx)

    monkeypatch.setattr("swpipeline.engine.feed.Feed._draw_on_device", draw_without_event)
    device = SimulatedDevice(behind_host=True)
    make(engine, prep_on_a_side_stream({}), device).run(batches_made_while_drawn(4))
    assert device.hazards == [
        f"Prep(i{i}) on stream 'prep' reads a storage allocated by the data iterator (batch {i}) on stream "
        f"'default', which the data iterator (batch {i}) on stream 'default' wrote, without waiting for it"
        for i in range(4)]


def test_a_batch_drawn_on_the_stream_of_every_reader_needs_no_event() -> None:
    # Every task that reads the batch first runs on the stream it is drawn on: nothing to record or wait.
    device = SimulatedDevice(behind_host=True)
    results: Dict[int, float] = {}
    prep = PipelineTask("Prep", lambda ctx: setattr(ctx, "x", ctx.batch * 2))
    train = PipelineTask("Train", lambda ctx: results.__setitem__(ctx.iter_idx, float(ctx.x.sum())))
    plan = PipelinePlan({prep: TaskSchedule(stage=0, thread_group="prep"), train: TaskSchedule(stage=1)},
                        intra_iter_deps=[(train, prep)])
    with pytest.warns(SharedStreamWarning):
        pipe = SWPipeline(plan, device=device)
    pipe.run(batches_made_while_drawn(3))
    assert results == {i: float(((torch.arange(4.0) + i) * 2).sum()) for i in range(3)}
    assert device.hazards == [] and [op[0] for op in device.log["default"] if op[0] in ("record", "wait")] == []


def sim_positions(device: SimulatedDevice, kind: str) -> Dict[int, Tuple[str, int]]:
    """Iteration -> (stream, position) of each ``(kind, iteration)`` op in the device's log."""
    return {op[1]: (name, pos) for name, ops in device.log.items() for pos, op in enumerate(ops) if op[0] == kind}


def test_a_side_stream_sinks_tensors_are_kept_for_the_callers_stream() -> None:
    kept: List[str] = []
    device = SimulatedDevice(behind_host=True)
    original = device.keep_alive

    def spy(tensor: torch.Tensor, stream: Any) -> None:
        kept.append(stream.name)
        original(tensor, stream)

    device.keep_alive = spy  # type: ignore[method-assign]

    def publish(ctx: IterContext) -> None:
        ctx.out = ctx.batch * 3.0

    plan = PipelinePlan({PipelineTask("Publish", publish): TaskSchedule(stream="side", thread_group="w")})
    SWPipeline(plan, device=device).run([torch.ones(2)] * 3)
    assert kept == ["default"] * 3 and device.hazards == []


def test_the_run_uses_the_stream_current_on_the_filling_thread_as_default() -> None:
    device = SimulatedDevice(behind_host=True)
    mine = device.stream("mine")
    seen: List[str] = []

    def work(ctx: IterContext) -> None:
        seen.append(device.current_stream().name)

    plan = PipelinePlan({PipelineTask("Work", work): TaskSchedule(thread_group="w")})
    pipe = SWPipeline(plan, device=device)
    with device.use_stream(mine):
        pipe.run(range(2))
    pipe.run(range(1))
    assert seen == ["mine", "mine", "default"]
    # the batches are drawn on it too (the third draw finds the end of the data)
    assert [op[0] for op in device.log["mine"]] == ["fetch", "launch", "fetch", "launch", "fetch"]


def test_filling_inside_a_stream_the_plan_names_is_refused() -> None:
    device = SimulatedDevice(behind_host=True)
    plan = PipelinePlan({PipelineTask("A", lambda ctx: None): TaskSchedule(stream="copy"),
                         PipelineTask("B", lambda ctx: None): TaskSchedule()})
    pipe = SWPipeline(plan, device=device)
    with device.use_stream(device.stream("copy")), pytest.raises(ValueError) as refused:
        pipe.fill_pipeline(range(2))
    assert str(refused.value) == (
        "fill_pipeline(): the stream current on this thread ('copy') is also the stream of task(s) ['A']; the "
        "plan's \"default\" tasks would run on it beside them. Fill the pipeline outside that stream's context, "
        "or give those tasks another stream")
    pipe.run(range(2))  # outside it, fine
    assert swp_threads() == []


# -- TorchDevice's stream switching, through a fake accelerator -------------------------------------------


class FakeStream:
    """Like torch.Stream: ``with stream:`` keeps the stream to restore in one slot on the object."""

    def __init__(self, name: str, priority: int = 0) -> None:
        self.name, self.priority = name, priority
        self._saved: Optional["FakeStream"] = None
        self._entered = False

    def __enter__(self) -> "FakeStream":
        if self._entered:
            raise RuntimeError("Stream's context should not be initialized")
        self._entered = True
        self._saved = Accelerator.current.get()
        Accelerator.current.set(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._saved is not None
        Accelerator.current.set(self._saved)
        self._entered = False


class Accelerator:
    """A per-thread current stream, as torch keeps one."""

    class _Current(threading.local):
        stream: Optional[FakeStream] = None

        def get(self) -> FakeStream:
            return self.stream or DEFAULT

        def set(self, stream: FakeStream) -> None:
            self.stream = stream

    current = _Current()


DEFAULT = FakeStream("default")


@pytest.fixture
def fake_accelerator(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("xpu"))
    monkeypatch.setattr(torch.accelerator, "current_stream", lambda index=None: Accelerator.current.get())
    monkeypatch.setattr(torch.accelerator, "set_stream", lambda stream: Accelerator.current.set(stream))
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda index: None)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda index=None: None)
    monkeypatch.setattr(torch, "Stream", lambda device=None, priority=0: FakeStream("named", priority))
    yield
    Accelerator.current.stream = None


def test_torch_device_switches_streams_per_call_and_thread(fake_accelerator: None) -> None:
    # A worker runs a task on the default stream while the caller's thread is inside `with default:`
    # (its own work on that stream). Entering the stream object from two threads at once breaks it.
    # The caller enters once the worker is inside the task and stays inside until the unit has completed
    # (progress() returns after the worker switched back), so the worker's whole switch-back happens then.
    started, release = threading.Event(), threading.Event()
    seen: List[str] = []

    def slow(ctx: IterContext) -> None:
        seen.append(torch.accelerator.current_stream().name)
        started.set()
        release.wait(5)

    device = TorchDevice(torch.device("xpu", 0))
    plan = PipelinePlan({PipelineTask("Slow", slow): TaskSchedule(thread_group="w")})
    pipe = SWPipeline(plan, device=device)
    it = pipe.fill_pipeline(range(1))
    assert started.wait(5)
    with DEFAULT:  # the caller uses the same stream object meanwhile
        release.set()
        assert pipe.progress(it) == 0
    pipe.drain()
    assert seen == ["default"]
    assert Accelerator.current.get() is DEFAULT


def test_torch_device_named_streams_get_their_priority(fake_accelerator: None) -> None:
    device = TorchDevice("xpu:0", stream_priorities={"memcpy": -1})
    assert (device.stream("memcpy").priority, device.stream("other").priority) == (-1, 0)
    with pytest.raises(ValueError, match=r"stream_priorities: 'memcpy': 1; give each stream name an int <= 0"):
        TorchDevice("xpu:0", stream_priorities={"memcpy": 1})


def test_devices_refuse_what_they_cannot_be(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("swpipeline.devices.device.machine_accelerator", lambda: None)  # whatever this machine has
    with pytest.raises(ValueError, match=r"TorchDevice\('cpu'\): this machine's accelerator is absent; a "
                                         r"TorchDevice drives an accelerator \(for the CPU, pass device=\"cpu\" or "
                                         r"CPUDevice\(\)\)"):
        TorchDevice("cpu")
    with pytest.raises(TypeError, match=r"SimulatedDevice: behind_host must be True or False, got 'yes'"):
        SimulatedDevice(behind_host="yes")  # type: ignore[arg-type]
