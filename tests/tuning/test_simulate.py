"""The simulator: exact timelines for hand-computable plans, the engines' own orders, invariants on random plans."""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_helpers import ExecLog, make_plan, valid_plans
from swpipeline import DataFlowPipeline, PipelinePlan, SWPipeline, TaskSchedule
from swpipeline.tuning.costs import TaskCost, TaskCosts
from swpipeline.tuning.overheads import EngineOverheads
from swpipeline.plan.ordering import last_stage_group
from swpipeline.tuning.profiler import ProfileResult
from swpipeline.observe.records import DependencyWait, TaskRecord
from swpipeline.tuning.sim_result import SimResult
from swpipeline.tuning.simulator import simulate
from swpipeline.observe.timeline import Timeline


# Plans here put several thread groups on one stream on purpose (the turns are what is tested).
pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")

ZERO = EngineOverheads.zero()
Span = Tuple[str, int, float, float]


def spans(result: SimResult) -> List[Span]:
    return [(u.task, u.iteration, u.start, u.end) for u in result.units()]


def chain(*layout: Tuple[str, int, Any, str]) -> PipelinePlan:
    """Tasks ``(name, stage, stream, thread group)``, each depending on the one before."""
    schedule = {name: TaskSchedule(stage=stage, stream=stream, thread_group=group) for name, stage, stream, group in
                layout}
    names = [row[0] for row in layout]
    return PipelinePlan(schedule, [(b, a) for a, b in zip(names, names[1:])])


TWO_STAGES = chain(("A", 0, "a", "a"), ("B", 1, "b", "b"))


# -- exact timelines -----------------------------------------------------------------------------------------


def test_clocked_two_stages_exact_timeline() -> None:
    #   a  [A0)[A1)  [A2)  [A3)          A(i+2) enters when iteration i retires (depth 2)
    #   b      [B0 )[B1 )[B2 )[B3 )      B (3) sets the pace
    result = simulate(TWO_STAGES, {"A": 2, "B": 3}, 4, overheads=ZERO)
    assert spans(result) == [("A", 0, 0, 2), ("A", 1, 2, 4), ("B", 0, 2, 5), ("A", 2, 5, 7), ("B", 1, 5, 8),
                             ("A", 3, 8, 10), ("B", 2, 8, 11), ("B", 3, 11, 14)]
    assert result.seconds == 14
    assert result.retire_times == (5, 8, 11, 14)
    assert result.steady_seconds_per_iteration == 3
    assert result.throughput == 4 / 14
    assert dict(result.thread_busy) == {"a": 8 / 14, "b": 12 / 14}
    assert dict(result.thread_bubbles) == {"a": 1 - 8 / 14, "b": 1 - 12 / 14}
    assert result.peak_live_contexts == 2
    assert [(s.kind, s.name, s.iteration, s.start, s.end) for s in result.critical_path] == [
        ("task", "A", 0, 0, 2), ("task", "B", 0, 2, 5), ("task", "B", 1, 5, 8), ("task", "B", 2, 8, 11),
        ("task", "B", 3, 11, 14), ("caller", "retire i3", 3, 14, 14)]
    assert dict(result.critical_share) == {"B": 12, "A": 2, "(caller)": 0}
    assert result.bottleneck == "B"


def test_dataflow_copy_runs_ahead_of_the_clock() -> None:
    plan = chain(("Copy", 0, "c", "c"), ("Compute", 1, "k", "k"))
    costs = {"Copy": 1, "Compute": 4}
    clocked = simulate(plan, costs, 5, overheads=ZERO)
    flow = simulate(plan, costs, 5, "dataflow", max_depth=4, overheads=ZERO)
    copies = lambda r: [u.start for u in r.units() if u.task == "Copy"]  # noqa: E731
    assert copies(clocked) == [0, 1, 5, 9, 13]  # iteration i + 2 waits for i to retire
    assert copies(flow) == [0, 1, 2, 3, 5]  # up to 4 iterations alive
    assert (clocked.seconds, flow.seconds) == (21, 21)
    assert (clocked.peak_live_contexts, flow.peak_live_contexts) == (2, 4)


def test_one_thread_runs_older_iterations_first() -> None:
    plan = chain(("A", 0, None, "default"), ("B", 1, None, "default"))
    result = simulate(plan, {"A": 1, "B": 2}, 3, overheads=ZERO)
    assert spans(result) == [("A", 0, 0, 1), ("B", 0, 1, 3), ("A", 1, 3, 4), ("B", 1, 4, 6), ("A", 2, 6, 7),
                             ("B", 2, 7, 9)]


def test_engine_overheads_are_added_where_the_engine_spends_them() -> None:
    plan = chain(("A", 0, "a", "a"), ("B", 0, "b", "b"))
    overheads = EngineOverheads(wake=1, unit=0, period=2, retire=1, thread_start=5, thread_stop=3, serial_unit=0)
    result = simulate(plan, {"A": 10, "B": 10}, 2, overheads=overheads, caller_thread_group=None)
    # every group on a worker: start 2 threads (10), hand out P0 (2), A wakes (1); B waits for A (+1); the caller
    # wakes and retires (+2)
    assert spans(result) == [("A", 0, 13, 23), ("B", 0, 24, 34), ("A", 1, 39, 49), ("B", 1, 50, 60)]
    assert result.seconds == 70  # ... hand out the empty P2 (2), stop 2 threads (6)
    assert [(s.kind, s.name, s.start, s.end) for s in result.critical_path] == [
        ("caller", "start threads", 0, 10), ("caller", "release period P0", 10, 12), ("engine", "(hand-offs)", 12, 13),
        ("task", "A", 13, 23), ("engine", "(hand-offs)", 23, 24), ("task", "B", 24, 34),
        ("caller", "retire i0", 34, 36), ("caller", "release period P1", 36, 38), ("engine", "(hand-offs)", 38, 39),
        ("task", "A", 39, 49), ("engine", "(hand-offs)", 49, 50), ("task", "B", 50, 60),
        ("caller", "retire i1", 60, 62), ("caller", "release period P2", 62, 64), ("caller", "stop threads", 64, 70)]
    assert list(result.critical_share.items()) == [("(caller)", 26), ("A", 20), ("B", 20), ("(hand-offs)", 4)]


def test_caller_thread_group_runs_on_the_caller() -> None:
    plan = chain(("A", 0, "a", "a"), ("B", 1, None, "default"))
    result = simulate(plan, {"A": 2, "B": 3}, 3, overheads=ZERO, caller_thread_group="default")
    assert spans(result) == [("A", 0, 0, 2), ("A", 1, 2, 4), ("B", 0, 2, 5), ("A", 2, 5, 7), ("B", 1, 5, 8),
                             ("B", 2, 8, 11)]
    assert result.seconds == 11


@pytest.mark.parametrize("engine", ["clocked", "dataflow"])
def test_the_caller_hands_out_the_next_period_once_the_oldest_iteration_is_done(engine: str) -> None:
    # The caller's period runs S(i - 2), then F(i - 1). Iteration 0 retires when S(0) ends (7), and L(3) is handed
    # out then, starting one wake-up later (8), while the caller goes on with F(1): not after it (10).
    plan = chain(("L", 0, "l", "load"), ("F", 1, None, "default"), ("S", 2, None, "default"))
    wake = EngineOverheads(wake=1, unit=0, period=0, retire=0, thread_start=0, thread_stop=0)
    result = simulate(plan, {"L": 2, "F": 2, "S": 2}, 4, engine, 3 if engine == "dataflow" else None,
                      overheads=wake, caller_thread_group="default")
    assert spans(result) == [("L", 0, 0, 2), ("L", 1, 2, 4), ("F", 0, 3, 5), ("L", 2, 4, 6), ("S", 0, 5, 7),
                             ("F", 1, 7, 9), ("L", 3, 8, 10), ("S", 1, 9, 11), ("F", 2, 11, 13), ("S", 2, 13, 15),
                             ("F", 3, 15, 17), ("S", 3, 17, 19)]


def test_device_work_queues_on_its_stream() -> None:
    plan = chain(("H2D", 0, "copy", "io"), ("Fwd", 1, None, "default"))
    costs = TaskCosts({"H2D": TaskCost(1, device=3), "Fwd": TaskCost(1, device=5)})
    result = simulate(plan, costs, 3, overheads=ZERO)
    device = [(u.task, u.iteration, u.device_start, u.device_end) for u in result.units()]
    assert device == [("H2D", 0, 0, 3), ("H2D", 1, 3, 6), ("Fwd", 0, 3, 8), ("H2D", 2, 6, 9), ("Fwd", 1, 8, 13),
                      ("Fwd", 2, 13, 18)]
    assert result.seconds == 18  # the run ends when the device is done
    assert dict(result.stream_busy) == {"copy": 9 / 18, "default": 15 / 18}


def test_shared_stream_takes_turns_in_schedule_order() -> None:
    plan = PipelinePlan({"A": TaskSchedule(0, "s", "a"), "B": TaskSchedule(0, "s", "b")}, [])
    result = simulate(plan, {"A": 2, "B": 3}, 2, overheads=ZERO)
    assert spans(result) == [("A", 0, 0, 2), ("B", 0, 2, 5), ("A", 1, 5, 7), ("B", 1, 7, 10)]


def test_globally_ordered_tasks_follow_the_sequencer() -> None:
    plan = PipelinePlan({"A": TaskSchedule(0, "x", "a", globally_ordered=True),
                         "B": TaskSchedule(0, "y", "b", globally_ordered=True)}, [])
    result = simulate(plan, {"A": 1, "B": 1}, 2, overheads=ZERO)
    assert spans(result) == [("A", 0, 0, 1), ("B", 0, 1, 2), ("A", 1, 2, 3), ("B", 1, 3, 4)]


def test_inter_iteration_dependency_serializes_the_recurrence() -> None:
    plan = PipelinePlan({"F": TaskSchedule(0, "f", "f"), "O": TaskSchedule(1, "o", "o")}, [("O", "F")], [("F", "O")])
    result = simulate(plan, {"F": 2, "O": 3}, 3, overheads=ZERO)
    assert spans(result) == [("F", 0, 0, 2), ("O", 0, 2, 5), ("F", 1, 5, 7), ("O", 1, 7, 10), ("F", 2, 10, 12),
                             ("O", 2, 12, 15)]


def test_cores_limit_how_many_tasks_run_at_once() -> None:
    one = simulate(TWO_STAGES, {"A": 2, "B": 3}, 4, overheads=ZERO, cores=1)
    assert spans(one) == [("A", 0, 0, 2), ("A", 1, 2, 4), ("B", 0, 4, 7), ("A", 2, 7, 9), ("B", 1, 9, 12),
                          ("A", 3, 12, 14), ("B", 2, 14, 17), ("B", 3, 17, 20)]
    assert [(s.kind, s.name, s.iteration) for s in one.critical_path][:3] == [("task", "A", 0), ("task", "A", 1),
                                                                             ("task", "B", 0)]
    two = simulate(TWO_STAGES, {"A": 2, "B": 3}, 4, overheads=ZERO, cores=2)
    assert spans(two) == spans(simulate(TWO_STAGES, {"A": 2, "B": 3}, 4, overheads=ZERO))
    plan = chain(("A", 0, "a", "a"), ("B", 1, None, "default"))
    inline = simulate(plan, {"A": 2, "B": 3}, 3, overheads=ZERO, caller_thread_group="default", cores=1)
    assert spans(inline) == [("A", 0, 0, 2), ("A", 1, 2, 4), ("B", 0, 4, 7), ("A", 2, 7, 9), ("B", 1, 9, 12),
                             ("B", 2, 12, 15)]


def test_serial_engine_runs_every_task_in_order() -> None:
    result = simulate(TWO_STAGES, {"A": 2, "B": 3}, 3, "serial", overheads=ZERO, data_seconds=1)
    assert spans(result) == [("A", 0, 1, 3), ("B", 0, 3, 6), ("A", 1, 7, 9), ("B", 1, 9, 12), ("A", 2, 13, 15),
                             ("B", 2, 15, 18)]
    assert (result.seconds, result.peak_live_contexts) == (18, 1)


def test_jitter_replays_samples_in_iteration_order() -> None:
    costs = TaskCosts({"A": TaskCost(1, samples=(1, 6, 1)), "B": 3})
    assert simulate(TWO_STAGES, costs, 4, overheads=ZERO).retire_times == (4, 10, 13, 16)
    assert simulate(TWO_STAGES, costs, 4, overheads=ZERO, jitter=False).retire_times == (4, 7, 10, 13)


def test_what_if_a_task_cost_nothing() -> None:
    costs = TaskCosts({"A": 2, "B": 3})
    base = simulate(TWO_STAGES, costs, 4, overheads=ZERO)
    assert simulate(TWO_STAGES, costs.replace(B=0), 4, overheads=ZERO).seconds == 8  # A alone: 4 x 2
    assert simulate(TWO_STAGES, costs.replace({"A": 0}), 4, overheads=ZERO).seconds == 12
    assert base.seconds == 14


def test_result_as_timeline() -> None:
    timeline = simulate(TWO_STAGES, {"A": 2, "B": 3}, 4, overheads=ZERO).timeline()
    assert [(r.task, r.iteration, r.thread_group, r.period, r.cpu_start, r.cpu_end) for r in timeline.records][:3] == [
        ("A", 0, "a", 0, 0, 2), ("A", 1, "a", 1, 2, 4), ("B", 0, "b", 1, 2, 5)]
    stats = timeline.stats()
    assert (stats.wall, dict(stats.thread_idle)) == (14, {"a": 1 - 8 / 14, "b": 1 - 12 / 14})
    assert TaskCosts.from_timeline(timeline).seconds() == {"A": 2, "B": 3}


# -- costs ---------------------------------------------------------------------------------------------------


def _record(task: str, it: int, start: float, end: float) -> TaskRecord:
    return TaskRecord(task=task, iteration=it, thread_group="g", stream="s", stage=0, period=it, ready=start,
                      cpu_start=start, cpu_end=end)


def test_costs_from_timeline_median_and_samples() -> None:
    records = (_record("A", 0, 0, 5), _record("A", 1, 5, 6), _record("A", 2, 6, 8), _record("B", 0, 8, 9))
    timeline = Timeline(engine="SWPipeline", device="cpu", origin=0, wall=9, records=records, tasks=("A", "B"),
                        thread_groups=("g",), streams=("s",))
    costs = TaskCosts.from_timeline(timeline)
    assert costs["A"] == TaskCost(2, samples=(5, 1, 2))
    assert costs["B"] == TaskCost(1, samples=(1,))
    assert TaskCosts.from_timeline(timeline, skip_first=1)["A"] == TaskCost(1.5, samples=(1, 2))
    assert costs["A"].p95 == 5 and costs["B"].spread == 0
    with pytest.raises(ValueError, match="no task ran at iteration >= 5"):
        TaskCosts.from_timeline(timeline, skip_first=5)


def test_costs_from_profile_and_by_hand() -> None:
    costs = TaskCosts.from_profile(ProfileResult(0.01, {"A": 0.004, "B": 0.006}))
    assert costs.seconds() == {"A": 0.004, "B": 0.006}
    assert costs.total == 0.01
    assert TaskCosts({"A": 1}, B=2).seconds() == {"A": 1.0, "B": 2.0}
    assert TaskCosts({"A": TaskCost(1, device=2)}).replace(A=0)["A"] == TaskCost(0, device=0)
    assert costs.scaled(2).seconds() == {"A": 0.008, "B": 0.012}


@pytest.mark.parametrize("bad, error, message", [
    ({"A": -1}, ValueError, "a cost must be a finite number of seconds >= 0, got -1"),
    ({"A": "1"}, TypeError, "a cost must be a number of seconds, got str '1'"),
    ({"A": float("nan")}, ValueError, "got nan"),
])
def test_costs_refuse_bad_values(bad: Dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        TaskCosts(bad)


def test_costs_replace_unknown_task() -> None:
    with pytest.raises(ValueError, match=r"replace: unknown task\(s\) \['C'\]; the costs know \['A', 'B'\]"):
        TaskCosts({"A": 1, "B": 1}).replace(C=0)


def test_overheads_measured_in_a_timeline() -> None:
    def rec(task: str, it: int, group: str, start: float, end: float, waits: Tuple[Any, ...] = ()) -> TaskRecord:
        return TaskRecord(task=task, iteration=it, thread_group=group, stream=group, stage=0, period=it, ready=start,
                          cpu_start=start, cpu_end=end, waits=waits)

    records = []
    for it in range(3):  # A (thread a) then B, C (thread b): B waits for A, C follows B on its thread
        t = it * 1.0
        waited = (DependencyWait("A", it, t, t + 0.5003),)
        records += [rec("A", it, "a", t, t + 0.5), rec("B", it, "b", t + 0.5003, t + 0.6, waited),
                    rec("C", it, "b", t + 0.60002, t + 0.7)]
    timeline = Timeline(engine="SWPipeline", device="cpu", origin=0, wall=3, records=tuple(records),
                        tasks=("A", "B", "C"), thread_groups=("a", "b"), streams=("a", "b"))
    measured = EngineOverheads.from_timeline(timeline, min_samples=3)
    assert measured.wake == pytest.approx(300e-6) and measured.unit == pytest.approx(20e-6)
    assert measured.period == EngineOverheads().period  # the caller is not in a trace
    assert EngineOverheads.from_timeline(timeline) == EngineOverheads()  # too few samples: the constants


def test_calibrate_measures_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    # The constants are what calibrate's docstring says, read off the timelines of its own probe runs.
    from swpipeline.tuning.calibrate import calibrate

    traced: Dict[Tuple[str, ...], Timeline] = {}
    real_run = SWPipeline.run

    def spy(self: SWPipeline, data: Any, *args: Any, **kwargs: Any) -> float:
        seconds = real_run(self, data, *args, **kwargs)
        if kwargs.get("trace") and self.timeline is not None:
            traced[tuple(self.plan.task_names)] = self.timeline
        return seconds

    monkeypatch.setattr(SWPipeline, "run", spy)
    measured = calibrate(iterations=40)
    hop, many = traced.pop(("A", "B")), traced.pop(tuple(f"T{j}" for j in range(16)))
    assert traced == {}
    a, b = hop.for_task("A"), hop.for_task("B")
    wake = max(0.0, statistics.median(y.cpu_start - x.cpu_end for x, y in zip(a, b)))  # B waits for A
    on_the_thread = sorted(many.records, key=lambda r: r.cpu_start)
    unit = max(0.0, statistics.median(y.cpu_start - x.cpu_end for x, y in zip(on_the_thread, on_the_thread[1:])
                                      if x.iteration == y.iteration))
    round_trip = statistics.median(a[k + 1].cpu_start - b[k].cpu_end for k in range(len(a) - 1))
    caller = max(0.0, round_trip - 2 * wake - unit)
    assert (measured.wake, measured.unit) == (wake, unit)
    assert (measured.period, measured.retire) == (caller * 2 / 3, caller / 3)
    with pytest.raises(ValueError, match="iterations must be an int >= 20, got 5"):
        calibrate(iterations=5)


# -- argument checks -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(costs={"A": 1}), ValueError, r"no cost for task\(s\) \['B'\]"),
    (dict(costs={"A": 1, "B": 1, "C": 1}), ValueError, r"cost\(s\) for task\(s\) \['C'\] that the plan does not"),
    (dict(engine="fast"), ValueError, "engine must be one of"),
    (dict(max_depth=3), ValueError, "max_depth is the data-flow engine's bound"),
    (dict(num_iterations=0), ValueError, "num_iterations must be >= 1, got 0"),
    (dict(num_iterations=2.0), TypeError, "num_iterations must be an int"),
    (dict(caller_thread_group="zz"), ValueError, r"caller_thread_group='zz' is not a thread group"),
    (dict(engine="serial", caller_thread_group="a"), ValueError, "run_serial runs every task on the calling thread"),
    (dict(costs=[1, 2]), TypeError, "costs must be a TaskCosts or a dict"),
    (dict(overheads=1), TypeError, "overheads must be an EngineOverheads"),
    (dict(cores=0), ValueError, "cores must be >= 1, got 0"),
])
def test_simulate_refuses_bad_arguments(kwargs: Dict[str, Any], error: type, message: str) -> None:
    args: Dict[str, Any] = dict(costs={"A": 1, "B": 1})
    args.update(kwargs)
    costs = args.pop("costs")
    with pytest.raises(error, match=message):
        simulate(TWO_STAGES, costs, **args)


def test_dataflow_max_depth_too_small_is_refused_as_the_engine_does() -> None:
    plan = PipelinePlan({"A": TaskSchedule(0, None, "g"), "B": TaskSchedule(1, None, "g"),
                         "C": TaskSchedule(2, None, "g")})
    with pytest.raises(ValueError, match="max_depth=1 is too small for this plan"):
        simulate(plan, {"A": 1, "B": 1, "C": 1}, 5, "dataflow", max_depth=1)
    assert simulate(plan, {"A": 1, "B": 1, "C": 1}, 5, "dataflow", max_depth=2, overheads=ZERO).seconds == 15


# -- the engines' own orders and the invariants, on random plans ----------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_plans(), st.integers(1, 7), st.sampled_from(["clocked", "dataflow"]), st.integers(0, 2))
def test_each_thread_runs_what_the_engine_runs_in_its_order(shape: Dict[str, Any], batches: int, engine: str,
                                                            extra: int) -> None:
    log = ExecLog()
    plan = make_plan(log, shape["spec"], shape["intra"], shape["inter"])
    max_depth = plan.depth + extra if engine == "dataflow" else None
    pipe = SWPipeline(plan, device="cpu") if max_depth is None else DataFlowPipeline(plan, max_depth, device="cpu")
    pipe.run(range(batches))
    result = simulate(plan, {n: 1 for n in plan.task_names}, batches, engine, max_depth, overheads=ZERO)
    caller = last_stage_group(plan)  # run() runs it on the calling thread; simulate() models the same
    for group in {s.thread_group for s in plan.schedules.values()}:
        simulated = [(u.task, u.iteration) for u in sorted(result.units(), key=lambda u: u.start)
                     if u.thread_group == group]
        assert log.starts_on("MainThread" if group == caller else f"swp-{group}") == simulated


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_plans(), st.integers(1, 9), st.sampled_from(["clocked", "dataflow"]), st.integers(0, 2),
       st.sampled_from([None, 1, 2]), st.data())
def test_simulated_runs_keep_every_rule(shape: Dict[str, Any], batches: int, engine: str, extra: int,
                                        cores: Any, data: st.DataObject) -> None:
    plan = make_plan(ExecLog(), shape["spec"], shape["intra"], shape["inter"])
    costs = {n: data.draw(st.integers(0, 5), label=n) for n in plan.task_names}
    max_depth = plan.depth + extra if engine == "dataflow" else None
    overheads = EngineOverheads(wake=1, unit=0, period=1, retire=0, thread_start=0, thread_stop=0)
    result = simulate(plan, costs, batches, engine, max_depth, overheads=overheads, cores=cores)
    units = {(u.task, u.iteration): u for u in result.units()}
    for (task, it), unit in units.items():
        assert unit.end - unit.start == costs[task]
        for dep in plan.intra[task]:
            assert units[(dep, it)].end <= unit.start
        for dep, back in plan.inter[task]:
            if it >= back:
                assert units[(dep, it - back)].end <= unit.start
    for lane in ("thread_group", "stream"):
        by_lane: Dict[str, List[Tuple[float, float]]] = {}
        for u in units.values():
            by_lane.setdefault(getattr(u, lane), []).append((u.start, u.end))
        for intervals in by_lane.values():
            intervals.sort()
            assert all(a[1] <= b[0] for a, b in zip(intervals, intervals[1:]))
    assert result.peak_live_contexts <= (max_depth or plan.depth)
    if cores is not None:  # never more than `cores` task functions at once
        edges = sorted([(u.start, 1) for u in units.values() if u.end > u.start] +
                       [(u.end, -1) for u in units.values() if u.end > u.start])
        running = 0
        for _, delta in edges:
            running += delta
            assert running <= cores
    path = result.critical_path
    assert path[0].start == 0 and path[-1].end == result.seconds
    assert all(a.end == b.start for a, b in zip(path, path[1:]))
    assert sum(result.critical_share.values()) == pytest.approx(result.seconds)


def test_ten_thousand_iterations_of_ten_tasks() -> None:
    # a chain of 10 tasks, two per stage and thread group: each group works on one iteration per period
    plan = chain(*[(f"T{k}", k // 2, f"s{k // 2}", f"g{k // 2}") for k in range(10)])
    costs = {f"T{k}": 1 + k % 3 for k in range(10)}  # group loads 3, 4, 5, 3, 4
    result = simulate(plan, costs, 10_000, overheads=ZERO)
    assert result.steady_seconds_per_iteration == 5
    # T0..T3 (7) reach g2, which then runs T4, T5 (5) without a gap 10,000 times; T6..T9 (7) finish the last
    assert result.seconds == 7 + 10_000 * 5 + 7
    assert result.critical_share["T4"] + result.critical_share["T5"] == 10_000 * 5


def test_an_absurd_number_of_iterations_is_refused_before_any_work() -> None:
    plan = PipelinePlan({"A": TaskSchedule()})
    with pytest.raises(ValueError, match=r"simulate: num_iterations=1000000000000 is more than 10,000,000"):
        simulate(plan, {"A": 1e-3}, num_iterations=10**12)
