"""autoplan: matches brute force on small problems, returns plans that validate and run, reports."""

from __future__ import annotations

import itertools
from typing import Any, Dict, Optional, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_helpers import ExecLog, check_dependencies
from swpipeline import DataFlowPipeline, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
from swpipeline.tuning.autoplan import autoplan, search_plan
from swpipeline.tuning.costs import TaskCost, TaskCosts
from swpipeline.tuning.overheads import EngineOverheads
from swpipeline.tuning.simulator import simulate

ZERO = EngineOverheads.zero()
Pair = Tuple[str, str]


def brute_force(names: Sequence[str], intra: Sequence[Pair], inter: Sequence[Pair], costs: Dict[str, Any],
                max_in_flight: int, groups: Sequence[str], engine: str, iterations: int) -> float:
    """The fastest simulated time over every stage, thread group and stream assignment (one stream per group)."""
    best = float("inf")
    for stages in itertools.product(range(max_in_flight), repeat=len(names)):
        if min(stages) != 0:
            continue
        for labels in itertools.product(groups, repeat=len(names)):
            schedule = {n: TaskSchedule(stage=s, stream=None if g == "default" else g, thread_group=g)
                        for n, s, g in zip(names, stages, labels)}
            try:
                plan = PipelinePlan(schedule, list(intra), list(inter))
                result = simulate(plan, costs, iterations, engine, None if engine == "clocked" else max_in_flight,
                                  overheads=ZERO)
            except ValueError:  # breaks a stage rule
                continue
            best = min(best, result.seconds)
    return best


@st.composite
def small_problems(draw: st.DrawFn) -> Dict[str, Any]:
    n = draw(st.integers(2, 3))
    names = [f"T{k}" for k in range(n)]
    intra = [(names[b], names[a]) for b in range(n) for a in range(b) if draw(st.booleans())]
    inter = [(names[a], names[b]) for a in range(n) for b in range(n) if draw(st.integers(0, 3)) == 0]
    costs = {name: draw(st.integers(0, 6)) for name in names}
    return {"names": names, "intra": intra, "inter": inter, "costs": costs,
            "max_in_flight": draw(st.integers(1, 3)), "engine": draw(st.sampled_from(["clocked", "dataflow"]))}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems())
def test_matches_brute_force_on_small_problems(p: Dict[str, Any]) -> None:
    groups = ["default", "g1", "g2"]
    found = search_plan(p["names"], p["intra"], p["inter"], p["costs"], max_in_flight=p["max_in_flight"],
                        thread_groups=groups, engine=p["engine"], num_iterations=8, tolerance=0.0,
                        overheads=ZERO)
    assert found.exhaustive
    expected = brute_force(p["names"], p["intra"], p["inter"], p["costs"], p["max_in_flight"], groups,
                           p["engine"], 8)
    assert found.result.seconds == expected


def test_matches_brute_force_on_four_tasks() -> None:
    names = ["Load", "Prep", "Fwd", "Bwd"]
    intra = [("Prep", "Load"), ("Fwd", "Prep"), ("Bwd", "Fwd")]
    inter = [("Fwd", "Bwd")]
    costs = {"Load": 2, "Prep": 3, "Fwd": 2, "Bwd": 3}
    found = search_plan(names, intra, inter, costs, max_in_flight=3, thread_groups=["default", "g1", "g2"],
                        num_iterations=10, tolerance=0.0, overheads=ZERO)
    assert found.result.seconds == brute_force(names, intra, inter, costs, 3, ["default", "g1", "g2"], "clocked",
                                               10) == 55
    assert found.simulated < found.candidates  # the lower bounds skipped some


DEMO_TASKS = ["PrepareBatch", "CopyToDevice", "Forward", "Backward", "OptimizerStep"]
DEMO_INTRA = [("CopyToDevice", "PrepareBatch"), ("Forward", "CopyToDevice"), ("Backward", "Forward"),
              ("OptimizerStep", "Backward")]
DEMO_INTER = [("Forward", "OptimizerStep")]
DEMO_HAND = PipelinePlan({"PrepareBatch": TaskSchedule(0, "prep", "prep"),
                          "CopyToDevice": TaskSchedule(1, "copy", "copy"), "Forward": TaskSchedule(2),
                          "Backward": TaskSchedule(2), "OptimizerStep": TaskSchedule(2)}, DEMO_INTRA, DEMO_INTER)


DEMO_COSTS = {"PrepareBatch": 10, "CopyToDevice": 0, "Forward": 3, "Backward": 5, "OptimizerStep": 2}
ONE_THREAD = PipelinePlan({n: TaskSchedule(s.stage, s.stream, "default") for n, s in DEMO_HAND.schedules.items()},
                          DEMO_INTRA, DEMO_INTER)


def demo_search(baseline: Optional[PipelinePlan]) -> Any:
    return search_plan(DEMO_TASKS, DEMO_INTRA, DEMO_INTER, DEMO_COSTS, max_in_flight=3, baseline=baseline,
                       num_iterations=20, overheads=ZERO)


def test_demo_shaped_problem_finds_the_overlap() -> None:
    found = demo_search(ONE_THREAD)
    assert found.baseline_result is not None and not found.kept_baseline
    assert (found.baseline_result.seconds, found.result.seconds) == (400, 210)  # 20 x 20 on one thread; 10 + 20 x 10
    assert found.speedup == 400 / 210
    assert (found.baseline_result.peak_live_contexts, found.result.peak_live_contexts) == (3, 2)
    assert {n: (s.stage, s.thread_group, s.stream) for n, s in found.plan.schedules.items()} == {
        "PrepareBatch": (0, "default", None), "CopyToDevice": (0, "default", None), "Forward": (1, "g1", "g1"),
        "Backward": (1, "g1", "g1"), "OptimizerStep": (1, "g1", "g1")}


def test_a_baseline_nothing_beats_is_kept() -> None:
    found = demo_search(DEMO_HAND)  # as fast as the fastest (210): no change is suggested
    assert found.kept_baseline and found.plan is DEMO_HAND
    assert found.result.seconds == 210
    assert "no plan is predicted faster than the baseline by more than the tolerance: keep it" in \
        found.format_report().splitlines()
    simplest = demo_search(None)  # without one, the simplest of the fastest: 2 iterations alive, 2 threads
    assert (simplest.plan.depth, simplest.result.seconds) == (2, 210)
    assert simplest.plan.schedules == demo_search(ONE_THREAD).plan.schedules


def test_report_compares_with_the_baseline() -> None:
    found = demo_search(ONE_THREAD)
    lines = found.format_report().splitlines()
    assert lines[:14] == [
        f"autoplan: clocked engine, at most 3 iterations alive; {found.simulated} of 572 candidate plans simulated "
        f"(exhaustive search), 20 iterations each",
        "",
        "                              baseline  suggested",
        "------------------------  ------------  ---------",
        "ms/iteration (whole run)     20000.000  10500.000",
        "ms/iteration (steady)        18750.000  10000.000",
        "iterations/s                       0.1        0.1",
        "live contexts (peak)                 3          2",
        "depth                                3          2",
        "thread groups                        1          2",
        "streams                              3          2",
        "critical path mostly      PrepareBatch   Backward",
        "predicted speedup                1.00x      1.90x",
        ""]
    assert lines[14:22] == [
        "orders of the baseline's placement kept: 1 of 1",  # PrepareBatch(i+1) after CopyToDevice(i), on one thread
        "",
        "suggested plan:",
        "task           thread   stream   stage  globally ordered",
        "-------------  -------  -------  -----  ----------------",
        "PrepareBatch   default  default      0",
        "CopyToDevice   default  default      0",
        "Forward        g1       g1           1"]


def test_returned_plans_validate_and_run_on_both_engines() -> None:
    log = ExecLog()
    names = ["Read", "Decode", "Augment", "Forward", "Backward", "Step"]
    tasks = [PipelineTask(n, log.task_fn(n)) for n in names]
    intra = [("Decode", "Read"), ("Augment", "Decode"), ("Forward", "Augment"), ("Backward", "Forward"),
             ("Step", "Backward")]
    inter = [("Forward", "Step")]
    costs = {"Read": 3e-3, "Decode": 2e-3, "Augment": 2e-3, "Forward": 2e-3, "Backward": 3e-3, "Step": 1e-3}
    plan = autoplan(tasks, intra, inter, costs, max_in_flight=3, thread_groups=["default", "io", "cpu"],
                    num_iterations=30)
    assert {s.thread_group for s in plan.schedules.values()} <= {"default", "io", "cpu"}
    assert plan.depth <= 3
    assert [t.fn for t in plan.tasks] == [t.fn for t in tasks]  # the plan runs the given tasks
    SWPipeline(plan, device="cpu").run(range(7))
    assert check_dependencies(log, plan, 7) > 0
    log.events.clear()
    DataFlowPipeline(plan, max_depth=3, device="cpu").run(range(7))
    assert check_dependencies(log, plan, 7) > 0


SPARSE_DIST = ["H2D", "InputDistStart", "InputDistWait", "ZeroGrad", "WaitBatch", "Forward", "Backward",
               "OptimizerStep"]
SPARSE_INTRA = [("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"), ("WaitBatch", "InputDistWait"),
                ("Forward", "InputDistWait"), ("WaitBatch", "ZeroGrad"), ("Forward", "WaitBatch"),
                ("Backward", "Forward"), ("OptimizerStep", "Backward")]
SPARSE_INTER = [("Forward", "OptimizerStep"), ("InputDistWait", "WaitBatch")]
SPARSE_HAND = PipelinePlan(
    {"H2D": TaskSchedule(0, "memcpy", "io"), "InputDistStart": TaskSchedule(1, "data_dist", "dist", True),
     "InputDistWait": TaskSchedule(1, "data_dist", "dist"), **{n: TaskSchedule(2) for n in SPARSE_DIST[3:]}},
    SPARSE_INTRA, SPARSE_INTER)


def test_larger_problems_use_a_deterministic_local_search() -> None:
    costs = {"H2D": 4, "InputDistStart": 1, "InputDistWait": 2, "ZeroGrad": 1, "WaitBatch": 1, "Forward": 3,
             "Backward": 5, "OptimizerStep": 1}
    runs = [search_plan(SPARSE_DIST, SPARSE_INTRA, SPARSE_INTER, costs, max_in_flight=3, baseline=SPARSE_HAND,
                        num_iterations=12, overheads=ZERO, exhaustive_limit=1000, budget=400) for _ in range(2)]
    first, second = runs
    assert not first.exhaustive and first.simulated <= 400
    assert first.plan.schedules == second.plan.schedules
    assert first.baseline_result is not None and first.result.seconds <= first.baseline_result.seconds
    assert first.plan.schedules["InputDistStart"].globally_ordered  # kept from the baseline
    SWPipeline(first.plan, device="cpu")  # valid


def test_pinned_tasks_stay_on_their_thread_and_cores_are_shared() -> None:
    costs = {"H2D": 4, "InputDistStart": 1, "InputDistWait": 2, "ZeroGrad": 1, "WaitBatch": 1, "Forward": 3,
             "Backward": 5, "OptimizerStep": 1}
    pinned = {n: "default" for n in SPARSE_DIST if n != "H2D"}
    # TorchRec's SparseDist runs every task on the thread that calls progress()
    one_thread = PipelinePlan({n: TaskSchedule(s.stage, s.stream, "default", s.globally_ordered)
                               for n, s in SPARSE_HAND.schedules.items()}, SPARSE_INTRA, SPARSE_INTER)
    free = search_plan(SPARSE_DIST, SPARSE_INTRA, SPARSE_INTER, costs, max_in_flight=3, baseline=one_thread,
                       thread_groups=["default", "prep"], pinned=pinned, caller_thread_group="default",
                       num_iterations=12, overheads=ZERO)
    # H2D on either thread, 22 stage vectors that keep the orders the one thread gave (ZeroGrad(i) after
    # InputDistWait(i), ...): H2D moves to the other thread all the same
    assert (free.candidates, free.exhaustive) == (2 * 22, True)
    assert {n: s.thread_group for n, s in free.plan.schedules.items()} == {**pinned, "H2D": "prep"}
    assert free.baseline_result is not None
    assert (free.baseline_result.seconds, free.result.seconds) == (12 * 18, 172)  # the rest: 14 per iteration
    one_core = search_plan(SPARSE_DIST, SPARSE_INTRA, SPARSE_INTER, costs, max_in_flight=3, baseline=one_thread,
                           thread_groups=["default", "prep"], pinned=pinned, caller_thread_group="default",
                           num_iterations=12, overheads=ZERO, cores=1)
    assert one_core.kept_baseline and one_core.plan is one_thread  # a second thread buys nothing on one core
    assert one_core.result.seconds == 12 * 18


def test_device_times_search_streams() -> None:
    names = ["H2D", "Fwd"]
    costs = TaskCosts({"H2D": TaskCost(0.1, device=3), "Fwd": TaskCost(0.1, device=3)})
    found = search_plan(names, [("Fwd", "H2D")], [], costs, max_in_flight=2, thread_groups=["default"],
                        num_iterations=10, overheads=ZERO)
    streams = {n: s.stream for n, s in found.plan.schedules.items()}
    assert streams["H2D"] != streams["Fwd"]  # on two streams the copy overlaps the compute
    assert found.result.seconds == pytest.approx(3 + 10 * 3, abs=0.3)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(max_in_flight=0), ValueError, "max_in_flight must be >= 1, got 0"),
    (dict(engine="serial"), ValueError, "engine must be 'clocked' or 'dataflow', got 'serial'"),
    (dict(thread_groups=["a", "a"]), ValueError, r"thread_groups lists a name twice: \['a', 'a'\]"),
    (dict(thread_groups="abc"), TypeError, "thread_groups must be None or a non-empty list of names"),
    (dict(globally_ordered=["X"]), ValueError, r"globally_ordered names unknown task\(s\) \['X'\]"),
    (dict(tolerance=1.5), ValueError, "tolerance must be a number in"),
    (dict(costs={"A": 1}), ValueError, r"autoplan: no cost for task\(s\) \['B'\]"),
    (dict(baseline=PipelinePlan({"A": TaskSchedule()})), ValueError, "the baseline plan's tasks"),
    (dict(pinned={"A": "prep"}, thread_groups=["default"]), ValueError,
     r"pinned\['A'\] = 'prep' is not one of thread_groups \['default'\]; add it there"),
    (dict(pinned={"Z": "default"}), ValueError, r"pinned names unknown task\(s\) \['Z'\]"),
    (dict(cores=0), ValueError, "cores must be >= 1, got 0"),
])
def test_autoplan_refuses_bad_arguments(kwargs: Dict[str, Any], error: type, message: str) -> None:
    args: Dict[str, Any] = dict(costs={"A": 1, "B": 1}, max_in_flight=2)
    args.update(kwargs)
    costs = args.pop("costs")
    with pytest.raises(error, match=message):
        autoplan(["A", "B"], [("B", "A")], [], costs, **args)


def test_unknown_dependency_is_refused_as_a_plan_would() -> None:
    with pytest.raises(ValueError, match="unknown task 'C'"):
        autoplan(["A", "B"], [("B", "C")], [], {"A": 1, "B": 1}, max_in_flight=2)
