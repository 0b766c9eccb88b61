"""globally_ordered on real collectives: two gloo ranks, all-reduces issued from two thread groups.

Every iteration, thread group ``comm_a`` all-reduces one tensor and thread group
``comm_b`` another of a different size; before each, an unordered task sleeps a
rank-dependent random time, so on rank 0 the B collective is usually ready first
and on rank 1 the A collective. Issued in ready order, the ranks would disagree
on which collective comes next (a hang, or a size mismatch). With both marked
``globally_ordered`` the engine's sequencer issues them in one pre-assigned order
on every rank: each rank records its issue order, and the test checks the orders
are identical, that they differ from the orders in which the collectives became
ready (the sequencer did the work), that every result is the exact sum, and that
both engines finish hundreds of iterations well within the timeout. A control
runs the same plan without ``globally_ordered`` and sees gloo fail on a
collective mismatch.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Dict, List

import pytest

from dist_harness import run_on_ranks
from swpipeline import DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

ITERATIONS = 300


def _plan(rank: int, log: Dict[str, List[Any]], ordered: bool = True) -> PipelinePlan:
    import torch
    import torch.distributed as dist

    rng = random.Random(rank)
    lock = threading.Lock()

    def prepare(ctx: IterContext) -> None:
        ctx.a = torch.full((3,), float(ctx.iter_idx * 10 + rank))
        ctx.b = torch.full((5,), float(ctx.iter_idx * 100 + rank))

    def jitter(slow_on_rank: int, name: str) -> Any:
        def fn(ctx: IterContext) -> None:
            time.sleep(rng.uniform(0.0005, 0.002) if rank == slow_on_rank else 0.0)
            with lock:
                log["ready"].append((name, ctx.iter_idx))
        return fn

    def reduce(name: str) -> Any:
        def fn(ctx: IterContext) -> None:
            with lock:
                log["issued"].append((name, ctx.iter_idx))
            tensor = getattr(ctx, name)
            dist.all_reduce(tensor)
            log["results"].append((name, ctx.iter_idx, tensor.tolist()))
        return fn

    t = {n: PipelineTask(n, f) for n, f in [("Prepare", prepare), ("JitterA", jitter(0, "a")),
                                           ("JitterB", jitter(1, "b")), ("ReduceA", reduce("a")),
                                           ("ReduceB", reduce("b"))]}
    return PipelinePlan(
        schedule={
            t["Prepare"]: TaskSchedule(stage=0),
            t["JitterA"]: TaskSchedule(stage=1, thread_group="comm_a", stream="a"),
            t["ReduceA"]: TaskSchedule(stage=1, thread_group="comm_a", stream="a", globally_ordered=ordered),
            t["JitterB"]: TaskSchedule(stage=1, thread_group="comm_b", stream="b"),
            t["ReduceB"]: TaskSchedule(stage=1, thread_group="comm_b", stream="b", globally_ordered=ordered),
        },
        intra_iter_deps=[(t["JitterA"], t["Prepare"]), (t["JitterB"], t["Prepare"]),
                         (t["ReduceA"], t["JitterA"]), (t["ReduceB"], t["JitterB"])],
    )


def ordered_collectives(rank: int, world_size: int, ordered: bool = True) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for engine in ("clocked", "dataflow"):
        log: Dict[str, List[Any]] = {"ready": [], "issued": [], "results": []}
        plan = _plan(rank, log, ordered)
        pipe = (SWPipeline(plan, device="cpu", signal_timeout=20.0) if engine == "clocked"
                else DataFlowPipeline(plan, max_depth=3, device="cpu", signal_timeout=20.0))
        start = time.perf_counter()
        pipe.run(range(ITERATIONS))
        out[engine] = {**log, "seconds": time.perf_counter() - start}
    return out


@pytest.fixture(scope="module")
def ranks() -> List[Dict[str, Any]]:
    return run_on_ranks(ordered_collectives, world_size=2, timeout=120)


@pytest.mark.parametrize("engine", ["clocked", "dataflow"])
def test_collectives_issue_in_one_order_on_every_rank(ranks: List[Dict[str, Any]], engine: str) -> None:
    issued = [r[engine]["issued"] for r in ranks]
    assert len(issued[0]) == 2 * ITERATIONS
    assert issued[0] == issued[1]


@pytest.mark.parametrize("engine", ["clocked", "dataflow"])
def test_the_ready_orders_differ_between_ranks(ranks: List[Dict[str, Any]], engine: str) -> None:
    ready = [r[engine]["ready"] for r in ranks]
    assert ready[0] != ready[1]  # without the sequencer the ranks would have issued in different orders


@pytest.mark.parametrize("engine", ["clocked", "dataflow"])
def test_every_result_is_the_exact_sum(ranks: List[Dict[str, Any]], engine: str) -> None:
    for res in ranks:
        results = res[engine]["results"]
        assert len(results) == 2 * ITERATIONS
        for name, i, values in results:
            want = (i * 10 * 2 + 1) if name == "a" else (i * 100 * 2 + 1)  # rank 0 + rank 1
            assert values == [float(want)] * (3 if name == "a" else 5), (name, i, values)


def test_control_without_globally_ordered_the_ranks_mismatch() -> None:
    # The same plan with globally_ordered=False: the ranks issue the two all-reduces in different
    # orders and gloo reports a collective mismatch (it aborts a rank), i.e. the sequencer is what
    # makes the test above pass.
    with pytest.raises((RuntimeError, AssertionError, TimeoutError)):
        run_on_ranks(ordered_collectives, world_size=2, timeout=60, ordered=False)
