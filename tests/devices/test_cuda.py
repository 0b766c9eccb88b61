"""Real streams and events: every test runs on the CPU and, when there is one, on a CUDA GPU.

On the GPU each producer delays its result with a spin kernel before writing it,
on its own stream; a consumer on another stream reads it. Without the event wait
of the two-phase protocol the consumer would read the stale value.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch

from engine_helpers import swp_threads
from swpipeline import DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


def delay(device: str) -> None:
    if device == "cuda":
        torch.cuda._sleep(2_000_000)  # ~1 ms of GPU spin on the current stream


def chain_plan(device: str, results: Dict[int, float]) -> PipelinePlan:
    """Load (stream a) -> Scale (stream b) -> Shift (stream c) -> Collect (default), one stage each."""

    def load(ctx: IterContext) -> None:
        ctx.x = torch.zeros(1024, device=device)
        delay(device)
        ctx.x.fill_(float(ctx.batch))

    def scale(ctx: IterContext) -> None:
        delay(device)
        ctx.y = ctx.x * 2

    def shift(ctx: IterContext) -> None:
        delay(device)
        ctx.z = ctx.y + 1

    def collect(ctx: IterContext) -> None:
        results[ctx.iter_idx] = float(ctx.z.sum().item()) / 1024

    tasks = [PipelineTask(f.__name__, f) for f in (load, scale, shift, collect)]
    streams = ["a", "b", "c", None]
    groups = ["io", "g1", "g2", "default"]
    schedule = {t: TaskSchedule(stage=k, stream=s, thread_group=g)
                for k, (t, s, g) in enumerate(zip(tasks, streams, groups))}
    return PipelinePlan(schedule, intra_iter_deps=[(tasks[1], tasks[0]), (tasks[2], tasks[1]), (tasks[3], tasks[2])])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("engine", ["clocked", "dataflow"])
def test_cross_stream_chain_reads_fresh_values(device: str, engine: str) -> None:
    results: Dict[int, float] = {}
    plan = chain_plan(device, results)
    pipe: Any = SWPipeline(plan, device=device) if engine == "clocked" else DataFlowPipeline(plan, 3, device=device)
    pipe.run(range(30))
    assert results == {i: 2.0 * i + 1 for i in range(30)}
    assert swp_threads() == []


@pytest.mark.parametrize("device", DEVICES)
def test_serial_baseline_matches(device: str) -> None:
    results: Dict[int, float] = {}
    pipe = SWPipeline(chain_plan(device, results), device=device)
    pipe.run_serial(range(5))
    assert results == {i: 2.0 * i + 1 for i in range(5)}


@pytest.mark.parametrize("device", DEVICES)
def test_retired_side_stream_results_are_visible_to_the_caller(device: str) -> None:
    # The sink runs on a side stream; after progress() returns, the caller's stream must see its writes.
    out: List[torch.Tensor] = []

    def produce(ctx: IterContext) -> None:
        buf = torch.zeros(1024, device=device)
        delay(device)
        buf.fill_(float(ctx.batch))
        ctx.buf = buf

    def publish(ctx: IterContext) -> None:
        delay(device)
        out.append(ctx.buf * 3)

    a, b = PipelineTask("Produce", produce), PipelineTask("Publish", publish)
    plan = PipelinePlan({a: TaskSchedule(stage=0, stream="s1", thread_group="io"),
                         b: TaskSchedule(stage=1, stream="s2")}, intra_iter_deps=[(b, a)])
    pipe = SWPipeline(plan, device=device)
    it = pipe.fill_pipeline(range(8))
    seen = []
    while True:
        try:
            idx = pipe.progress(it)
        except StopIteration:
            break
        seen.append(float(out[idx].sum().item()) / 1024)  # read on the caller's (default) stream
    assert seen == [3.0 * i for i in range(8)]


@pytest.mark.parametrize("device", DEVICES)
def test_traced_run_has_device_times_on_accelerators(device: str) -> None:
    # On CUDA each unit records two timing events around its launch on its stream; on the CPU there are none.
    results: Dict[int, float] = {}
    pipe = SWPipeline(chain_plan(device, results), device=device)
    pipe.run(range(10), trace=True)
    assert results == {i: 2.0 * i + 1 for i in range(10)}
    timeline = pipe.timeline
    assert timeline is not None and len(timeline.records) == 40
    assert timeline.has_device_times == (device == "cuda")

    def span(record: Any) -> Tuple[float, float]:
        if device == "cuda":
            return record.device_start, record.device_end
        return record.cpu_start, record.cpu_end

    for stream in timeline.streams:  # one thread group per stream here: spans on a stream never overlap
        spans = sorted(span(r) for r in timeline.records if r.stream == stream)
        assert all(start <= end for start, end in spans)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    cats = {e["cat"] for e in timeline.to_chrome_trace()["traceEvents"] if e["ph"] == "X" and e["pid"] == 2}
    assert cats == ({"device"} if device == "cuda" else {"task"})


# -- one test per hazard of the accelerator path; each fails without its fix -----------------------------

@pytest.mark.parametrize("engine", ["clocked", "dataflow"])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_memory_handed_from_a_copy_stream_is_not_reused_under_the_reader(engine: str) -> None:
    # H2D allocates on the "copy" stream; Forward on the default stream spins ~2 ms before reading it.
    # The context is dropped as soon as Forward has *launched*, so without keep-alive the copy stream
    # hands the block to H2D two iterations later, which overwrites it before the spin ends.
    n, size = 24, 1 << 22
    sums: List[torch.Tensor] = []

    def h2d(ctx: IterContext) -> None:
        ctx.x = torch.full((size,), float(ctx.batch), device="cuda")

    def forward(ctx: IterContext) -> None:
        torch.cuda._sleep(4_000_000)
        sums.append(ctx.x.sum())

    copy, fwd = PipelineTask("H2D", h2d), PipelineTask("Forward", forward)
    plan = PipelinePlan({copy: TaskSchedule(stage=0, stream="copy", thread_group="io"), fwd: TaskSchedule(stage=1)},
                        intra_iter_deps=[(fwd, copy)])
    pipe: Any = SWPipeline(plan, device="cuda") if engine == "clocked" else DataFlowPipeline(plan, 3, device="cuda")
    pipe.run(range(n))
    torch.cuda.synchronize()
    assert [float(s) for s in sums] == [float(i) * size for i in range(n)]


@pytest.mark.parametrize("engine", ["clocked", "dataflow"])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_a_batch_made_on_the_callers_stream_is_ready_before_a_side_stream_reads_it(engine: str) -> None:
    # The data iterator makes each batch on the caller's stream, its values written after a ~1 ms spin;
    # Prep reads it on its own stream. Without the event recorded after the batch is drawn, Prep's
    # kernel would run during the spin and sum zeros.
    n, size = 12, 1 << 20
    sums: List[torch.Tensor] = []

    def batches() -> Any:
        for i in range(n):
            batch = torch.zeros(size, device="cuda")
            torch.cuda._sleep(2_000_000)
            batch.fill_(float(i))
            yield batch

    def prep(ctx: IterContext) -> None:
        ctx.total = ctx.batch.sum()

    def train(ctx: IterContext) -> None:
        sums.append(ctx.total * 1)

    p, t = PipelineTask("Prep", prep), PipelineTask("Train", train)
    plan = PipelinePlan({p: TaskSchedule(stage=0, stream="prep", thread_group="prep"), t: TaskSchedule(stage=1)},
                        intra_iter_deps=[(t, p)])
    pipe: Any = SWPipeline(plan, device="cuda") if engine == "clocked" else DataFlowPipeline(plan, 3, device="cuda")
    pipe.run(batches())
    torch.cuda.synchronize()
    assert [float(s) for s in sums] == [float(i) * size for i in range(n)]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_two_thread_groups_and_the_caller_share_the_default_stream() -> None:
    # Tasks of two thread groups run on the default stream while the caller's thread enters the same
    # stream object; each thread sees its own current stream, and nothing raises.
    default = torch.cuda.default_stream()
    seen: List[Tuple[str, int]] = []

    def task(name: str) -> Any:
        def run(ctx: IterContext) -> None:
            torch.cuda._sleep(1_000_000)
            seen.append((name, torch.cuda.current_stream().stream_id))
        return run

    a, b = PipelineTask("A", task("A")), PipelineTask("B", task("B"))
    plan = PipelinePlan({a: TaskSchedule(thread_group="g1"), b: TaskSchedule(thread_group="g2")})
    pipe = SWPipeline(plan, device="cuda")
    it = pipe.fill_pipeline(range(20))
    while True:
        with default:  # the caller's own use of the stream object
            torch.cuda._sleep(100_000)
        try:
            pipe.progress(it)
        except StopIteration:
            break
    assert len(seen) == 40 and {sid for _, sid in seen} == {default.stream_id}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_default_is_the_stream_current_when_filling() -> None:
    mine = torch.cuda.Stream()
    seen: List[int] = []
    plan = PipelinePlan({PipelineTask("Work", lambda ctx: seen.append(torch.cuda.current_stream().stream_id)):
                         TaskSchedule(thread_group="w")})
    with torch.cuda.stream(mine):
        SWPipeline(plan, device="cuda").run(range(3))
    assert seen == [mine.stream_id] * 3


@pytest.mark.parametrize("engine", ["clocked", "dataflow"])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_autocast_of_the_caller_reaches_the_workers(engine: str) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64).cuda()
    out: Dict[int, torch.Tensor] = {}

    def prep(ctx: IterContext) -> None:
        ctx.h = layer(ctx.batch)

    def head(ctx: IterContext) -> None:
        # The spin holds this stream back: a weight cast shared through autocast's process-wide cache (made
        # on Prep's stream, freed when Prep's thread leaves its region) would be reused under this read.
        torch.cuda._sleep(1_000_000)
        out[ctx.iter_idx] = layer(torch.relu(ctx.h)).detach()

    p, h = PipelineTask("Prep", prep), PipelineTask("Head", head)
    plan = PipelinePlan({p: TaskSchedule(stage=0, stream="prep", thread_group="prep"), h: TaskSchedule(stage=1)},
                        intra_iter_deps=[(h, p)])
    data = [torch.randn(32, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(i)) for i in range(6)]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        SWPipeline(plan, device="cuda").run_serial(data)
    serial = {i: t.clone() for i, t in out.items()}
    pipe: Any = SWPipeline(plan, device="cuda") if engine == "clocked" else DataFlowPipeline(plan, 3, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        pipe.run(data)
    torch.cuda.synchronize()
    assert [(out[i].dtype, torch.equal(out[i], serial[i])) for i in range(6)] == [(torch.bfloat16, True)] * 6


@pytest.mark.parametrize("engine", ["clocked", "dataflow"])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_a_dependency_at_distance_two_waits_for_the_producers_stream(engine: str) -> None:
    # Produce (stage 1, stream p) writes iteration i's value after a ~1 ms spin; Consume of iteration
    # i + 2 (stage 0, stream c) reads it. Only the event of Produce(i), kept while two later
    # iterations are in flight, orders the read after the write.
    n, size = 16, 1 << 20
    made: Dict[int, torch.Tensor] = {}
    read: Dict[int, torch.Tensor] = {}

    def consume(ctx: IterContext) -> None:
        if ctx.iter_idx >= 2:
            read[ctx.iter_idx] = made[ctx.iter_idx - 2].sum()

    def produce(ctx: IterContext) -> None:
        out = torch.zeros(size, device="cuda")
        torch.cuda._sleep(2_000_000)
        made[ctx.iter_idx] = out.fill_(float(ctx.iter_idx))

    c, p = PipelineTask("Consume", consume), PipelineTask("Produce", produce)
    plan = PipelinePlan({c: TaskSchedule(stage=0, stream="c", thread_group="c"),
                         p: TaskSchedule(stage=1, stream="p", thread_group="p")},
                        intra_iter_deps=[(p, c)], inter_iter_deps=[(c, p, 2)])
    pipe: Any = SWPipeline(plan, device="cuda") if engine == "clocked" else DataFlowPipeline(plan, 3, device="cuda")
    pipe.run(range(n))
    torch.cuda.synchronize()
    assert [float(read[i]) for i in range(2, n)] == [float(i - 2) * size for i in range(2, n)]


def versioned_training(engine: Optional[str], k: int, spin_ns: int) -> Tuple[List[float], List[torch.Tensor]]:
    """Forward / backward / step on three threads and three streams with WeightVersions(k); the step's stream
    spins before the optimizer, so a gradient whose memory went back to the forward's stream early would be
    overwritten by the next backward before the optimizer reads it. Returns the losses and the final weights."""
    from swpipeline import WeightVersions

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    versions = WeightVersions(model, staleness=k)
    gen = torch.Generator("cuda").manual_seed(1)
    data = [(torch.randn(64, 256, device="cuda", generator=gen), torch.randn(64, 256, device="cuda", generator=gen))
            for _ in range(24)]
    losses: Dict[int, torch.Tensor] = {}

    def forward(ctx: IterContext) -> None:
        with versions.use(ctx):
            x, y = ctx.batch
            ctx.loss = torch.nn.functional.mse_loss(model(x), y)

    def backward(ctx: IterContext) -> None:
        ctx.loss.backward()
        losses[ctx.iter_idx] = ctx.loss.detach()

    def step(ctx: IterContext) -> None:
        versions.step(ctx, opt, before_step=lambda: torch.cuda._sleep(spin_ns))

    f, b, s = PipelineTask("Forward", forward), PipelineTask("Backward", backward), PipelineTask("Step", step)
    plan = PipelinePlan({f: TaskSchedule(stage=0, stream="fwd", thread_group="fwd"),
                         b: TaskSchedule(stage=1, stream="bwd", thread_group="bwd"),
                         s: TaskSchedule(stage=2, stream="step")},
                        intra_iter_deps=[(b, f), (s, b)], inter_iter_deps=[versions.deps(f, s)])
    if engine is None:
        SWPipeline(plan, device="cuda").run_serial(data)
    else:
        pipe: Any = SWPipeline(plan, device="cuda") if engine == "clocked" else DataFlowPipeline(plan, 3, device="cuda")
        pipe.run(data)
    torch.cuda.synchronize()
    return [float(losses[i]) for i in range(len(data))], [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("engine", ["clocked", "dataflow"])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_weight_versions_on_three_streams_equal_the_serial_run(engine: str, k: int) -> None:
    serial_losses, serial_weights = versioned_training(None, k, spin_ns=4_000_000)
    losses, weights = versioned_training(engine, k, spin_ns=4_000_000)
    assert losses == serial_losses
    assert [torch.equal(w, v) for w, v in zip(weights, serial_weights)] == [True] * len(weights)
