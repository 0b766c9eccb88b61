"""Schedule.check runs a schedule on paper under an engine's release rule, and rejects one that would get stuck."""

from __future__ import annotations

import dataclasses

import pytest

from swpipeline import DataFlowPipeline, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
from swpipeline.engine.release import ALL, ClockRule, DataFlowRule, Entries
from swpipeline.engine.schedule import Schedule, ScheduleError


def noop(ctx: object) -> None:
    return None


def caller_plan() -> PipelinePlan:
    # Worker group "w": A (stage 0) and B (stage 1) on streams of their own, so A comes first in a period;
    # the caller's group "c": S (stage 1), which needs B of its iteration.
    a, b, s = PipelineTask("A", noop), PipelineTask("B", noop), PipelineTask("S", noop)
    return PipelinePlan({a: TaskSchedule(stage=0, thread_group="w", stream="a"),
                         b: TaskSchedule(stage=1, thread_group="w", stream="b"),
                         s: TaskSchedule(stage=1, thread_group="c", stream="c")}, intra_iter_deps=[(s, b)])


class NoCallerLimit(DataFlowRule):
    """The data-flow rule without the caller's limit: the caller's group runs all it was handed."""

    def caller_through(self, entries: Entries[object]) -> int:
        return ALL


def test_the_callers_limit_is_what_keeps_the_data_flow_engine_from_getting_stuck() -> None:
    # With 2 live iterations, w's order is A(0) | A(1) B(0) | A(2) B(1) ...: B(1) sits behind A(2), whose
    # iteration is drawn only once iteration 0 retired. S(1) (period 2) is handed to the caller at once;
    # run before retiring iteration 0, it would wait for B(1), which waits for the caller: stuck.
    schedule = SWPipeline(caller_plan(), device="cpu")._schedule
    for batches in (1, 2, 5):
        schedule.check(DataFlowRule(2, 2), batches, caller_group="c")
    with pytest.raises(ScheduleError) as stuck:
        schedule.check(NoCallerLimit(2, 2), 5, caller_group="c")
    assert stuck.value.blocked == ("thread group 'w' waits to run A of iteration 2; thread group 'c' waits to run "
                                   "S of iteration 1")
    DataFlowPipeline(caller_plan(), max_depth=2, device="cpu", caller_thread_group="c").run(range(5))


def test_an_order_that_puts_a_consumer_before_its_producer_is_rejected() -> None:
    a, b = PipelineTask("A", noop), PipelineTask("B", noop)
    plan = PipelinePlan({a: TaskSchedule(stage=0), b: TaskSchedule(stage=0)}, intra_iter_deps=[(b, a)])
    good = SWPipeline(plan, device="cpu")._schedule
    good.check(ClockRule(1), 3)
    reversed_lanes = {group: tuple(reversed(slots)) for group, slots in good.lanes.items()}
    bad = dataclasses.replace(good, lanes=reversed_lanes)  # thread group 'default' would run B before A
    with pytest.raises(ScheduleError) as stuck:
        bad.check(ClockRule(1), 3)
    assert stuck.value.blocked == "thread group 'default' waits to run B of iteration 0"
    assert str(stuck.value).startswith("with 3 batches the schedule gets stuck after retiring 0 iteration(s): "
                                       "thread group 'default' waits to run B of iteration 0\nP0: default[B(i0) A(i0)]")


def test_a_max_depth_too_small_is_found_on_paper_for_the_exact_batch_count() -> None:
    # A, B, C at stages 0, 1, 2 on one group: with one live iteration the group's order reaches A(1) before
    # C(0), and with one batch the engine only learns that no iteration 1 exists by drawing it: stuck too.
    tasks = [PipelineTask(n, noop) for n in "ABC"]
    plan = PipelinePlan({t: TaskSchedule(stage=k, thread_group="g") for k, t in enumerate(tasks)},
                        intra_iter_deps=[(tasks[1], tasks[0]), (tasks[2], tasks[1])])
    schedule: Schedule = SWPipeline(plan, device="cpu")._schedule
    for batches in (1, 3):
        with pytest.raises(ScheduleError, match="thread group 'g' waits to run A of iteration 1"):
            schedule.check(DataFlowRule(3, 1), batches)
    schedule.check(DataFlowRule(3, 2), 3)
