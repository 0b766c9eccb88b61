"""Inter-iteration dependencies at a distance: ``(task, dep, d)``, task of iteration i after dep of i - d.

What a distance buys is overlap: with ``("Forward", "Step", 2)`` the forward of iteration
i may run while the step of iteration i - 1 still runs. The tests force that interleaving
with events (the step of iteration j waits until the forward of iteration j + 1 has
started, which a distance-1 dependency would forbid), and check the order the
dependency does impose, on both engines, with the caller's thread group on and off.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Tuple

import pytest

from engine_helpers import ExecLog, check_dependencies, make_plan, swp_threads
from swpipeline import DataFlowPipeline, IterContext, PipelinePlan, SWPipeline, simulate

SPEC: Dict[str, Tuple[int, Any, str]] = {"Forward": (0, "f", "fwd"), "Backward": (1, "b", "bwd"),
                                         "Step": (2, None, "default")}
INTRA = [("Backward", "Forward"), ("Step", "Backward")]


def engine(kind: str, plan: PipelinePlan, caller: bool) -> Any:
    group: Dict[str, Any] = {} if caller else {"caller_thread_group": None}
    if kind == "SWPipeline":
        return SWPipeline(plan, device="cpu", signal_timeout=10, **group)
    return DataFlowPipeline(plan, max_depth=3, device="cpu", signal_timeout=10, **group)


@pytest.mark.parametrize("caller", [True, False], ids=["caller-group", "all-on-workers"])
@pytest.mark.parametrize("kind", ["SWPipeline", "DataFlowPipeline"])
def test_forward_overlaps_the_step_of_the_iteration_before_and_waits_for_the_one_before_that(kind: str,
                                                                                            caller: bool) -> None:
    iters = 8
    started = [threading.Event() for _ in range(iters + 1)]
    overlapped: List[int] = []

    def forward(ctx: IterContext) -> None:
        started[ctx.iter_idx].set()

    def step(ctx: IterContext) -> None:
        # only possible if Forward(i + 1) does not wait for Step(i): the distance-2 dependency allows it
        if ctx.iter_idx + 1 < iters and started[ctx.iter_idx + 1].wait(timeout=10):
            overlapped.append(ctx.iter_idx)

    log = ExecLog()
    plan = make_plan(log, SPEC, INTRA, [("Forward", "Step", 2)], work={"Forward": forward, "Step": step})
    engine(kind, plan, caller).run(range(iters))
    assert overlapped == list(range(iters - 1))
    # Forward(i) started after Step(i - 2) ended, for every i >= 2 (and every intra dependency held)
    assert check_dependencies(log, plan, iters) == 2 * iters + (iters - 2)
    assert swp_threads() == []


@pytest.mark.parametrize("kind", ["SWPipeline", "DataFlowPipeline"])
def test_a_distance_one_dependency_forbids_that_overlap(kind: str) -> None:
    # The negative control: with ("Forward", "Step") the step of iteration j never sees Forward(j + 1) start.
    started = [threading.Event() for _ in range(5)]
    seen: List[bool] = []

    def forward(ctx: IterContext) -> None:
        started[ctx.iter_idx].set()

    def step(ctx: IterContext) -> None:
        seen.append(started[ctx.iter_idx + 1].is_set())

    plan = make_plan(ExecLog(), {**SPEC, "Step": (1, None, "default")}, INTRA, [("Forward", "Step")],
                     work={"Forward": forward, "Step": step})
    engine(kind, plan, True).run(range(4))
    assert seen == [False] * 4


def test_a_distance_reaching_past_the_first_iterations_waits_for_nothing_there() -> None:
    # Iterations 0 .. d - 1 have no iteration i - d: they run at once, in the plan's order.
    log = ExecLog()
    plan = make_plan(log, {"A": (0, None, "default"), "B": (0, None, "default")}, [("B", "A")], [("A", "B", 3)])
    SWPipeline(plan, device="cpu").run(range(2))
    assert [(task, it) for _, kind, task, it, _ in log.events if kind == "start"] == \
        [("A", 0), ("B", 0), ("A", 1), ("B", 1)]


def test_the_simulator_orders_each_unit_after_its_dependency_at_a_distance() -> None:
    plan = make_plan(ExecLog(), SPEC, INTRA, [("Forward", "Step", 2)])
    costs = {"Forward": 1e-3, "Backward": 2e-3, "Step": 1e-3}
    for kind, max_depth in (("clocked", None), ("dataflow", 3)):
        units = {(u.task, u.iteration): u for u in simulate(plan, costs, 10, kind, max_depth).units()}
        for i in range(2, 10):
            assert units[("Forward", i)].start >= units[("Step", i - 2)].end
        # and it overlaps: some Forward(i) starts before Step(i - 1) ends
        assert any(units[("Forward", i)].start < units[("Step", i - 1)].end for i in range(1, 10))


def test_a_traced_run_records_the_distance_and_the_wait_on_the_right_iteration() -> None:
    release = threading.Event()

    def step(ctx: IterContext) -> None:
        if ctx.iter_idx == 0:
            release.wait(timeout=10)  # Forward(2) must wait for this

    def backward(ctx: IterContext) -> None:
        if ctx.iter_idx == 1:
            release.set()

    plan = make_plan(ExecLog(), SPEC, INTRA, [("Forward", "Step", 2)], work={"Step": step, "Backward": backward})
    pipe = SWPipeline(plan, device="cpu", signal_timeout=10)
    pipe.run(range(4), trace=True)
    timeline = pipe.timeline
    assert timeline.inter_deps == (("Forward", "Step", 2),)
    waits = {(r.task, r.iteration): [(w.task, w.iteration) for w in r.waits] for r in timeline.records}
    assert all(dep_it == it - 2 for (task, it), found in waits.items() if task == "Forward" for _, dep_it in found)


def test_a_trace_carries_the_distance_and_the_plan_read_back_has_it(tmp_path: Any) -> None:
    from swpipeline.tuning.trace_read import declared_plan, plan_from_timeline, read_trace

    plan = make_plan(ExecLog(), SPEC, INTRA, [("Forward", "Step", 2), ("Backward", "Backward")])
    path = tmp_path / "run.json"
    SWPipeline(plan, device="cpu").run(range(5), trace=str(path))
    timeline, other = read_trace(path)
    declared = declared_plan(other, timeline.tasks, str(path))
    assert declared is not None and declared["inter"] == [["Forward", "Step", 2], ["Backward", "Backward"]]
    again, was_declared = plan_from_timeline(timeline, declared)
    assert was_declared and again.inter == {"Forward": [("Step", 2)], "Backward": [("Backward", 1)], "Step": []}
