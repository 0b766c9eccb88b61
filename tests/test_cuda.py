"""Real streams and events: every test runs on the CPU and, when there is one, on a CUDA GPU.

On the GPU each producer delays its result with a spin kernel before writing it,
on its own stream; a consumer on another stream reads it. Without the event wait
of the two-phase protocol the consumer would read the stale value.
"""

from __future__ import annotations

from typing import Any, Dict, List

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
