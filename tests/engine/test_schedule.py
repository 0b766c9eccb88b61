"""paper.check runs a schedule on paper under an engine's release rule, and rejects one that would get stuck."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

import pytest

from swpipeline import DataFlowPipeline, PipelinePlan, PipelineTask, SharedStreamWarning, SWPipeline, TaskSchedule
from swpipeline.engine.release import ALL, ClockRule, DataFlowRule, Entries
from swpipeline.engine.paper import ScheduleError, check
from swpipeline.engine.schedule import Schedule


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
        check(schedule, DataFlowRule(2, 2), batches, caller_group="c")
    with pytest.raises(ScheduleError) as stuck:
        check(schedule, NoCallerLimit(2, 2), 5, caller_group="c")
    assert stuck.value.blocked == ("thread group 'w' waits to run A of iteration 2, which has not started; thread "
                                   "group 'c' waits to run S of iteration 1, which waits for B of iteration 1")
    DataFlowPipeline(caller_plan(), max_depth=2, device="cpu", caller_thread_group="c").run(range(5))


def test_an_order_that_puts_a_consumer_before_its_producer_is_rejected() -> None:
    a, b = PipelineTask("A", noop), PipelineTask("B", noop)
    plan = PipelinePlan({a: TaskSchedule(stage=0), b: TaskSchedule(stage=0)}, intra_iter_deps=[(b, a)])
    good = SWPipeline(plan, device="cpu")._schedule
    check(good, ClockRule(1), 3)
    reversed_lanes = {group: tuple(reversed(slots)) for group, slots in good.lanes.items()}
    bad = dataclasses.replace(good, lanes=reversed_lanes)  # thread group 'default' would run B before A
    with pytest.raises(ScheduleError) as stuck:
        check(bad, ClockRule(1), 3)
    assert stuck.value.blocked == ("thread group 'default' waits to run B of iteration 0, which waits for A of "
                                   "iteration 0")
    assert str(stuck.value).startswith("with 3 batches the schedule gets stuck after retiring 0 iteration(s): "
                                       "thread group 'default' waits to run B of iteration 0, which waits for A of "
                                       "iteration 0\nP0: default[B(i0) A(i0)]")


def test_a_max_depth_too_small_is_found_on_paper_for_the_exact_batch_count() -> None:
    # A, B, C at stages 0, 1, 2 on one group: with one live iteration the group's order reaches A(1) before
    # C(0), and with one batch the engine only learns that no iteration 1 exists by drawing it: stuck too.
    tasks = [PipelineTask(n, noop) for n in "ABC"]
    plan = PipelinePlan({t: TaskSchedule(stage=k, thread_group="g") for k, t in enumerate(tasks)},
                        intra_iter_deps=[(tasks[1], tasks[0]), (tasks[2], tasks[1])])
    schedule: Schedule = SWPipeline(plan, device="cpu")._schedule
    for batches in (1, 3):
        with pytest.raises(ScheduleError, match="'g' waits to run A of iteration 1, which has not started"):
            check(schedule, DataFlowRule(3, 1), batches)
    check(schedule, DataFlowRule(3, 2), 3)


def test_a_unit_that_takes_turns_is_handed_out_only_once_its_period_is_decided() -> None:
    # Dist (stage 1, group "w") shares stream "s" with the caller's Step (stage 2), so both take turns. With
    # entries 0 and 1 decided, period 2's Dist (iteration 1) has its batch, but period 2's turns are numbered
    # only once period 2 is decided: handed out now, Dist would wait in its turn, under the turn's timeout,
    # for a batch the caller draws later. The walk stops at it (and at Step, also in period 2).
    def plan(dist_stream: str) -> PipelinePlan:
        load, dist, step = PipelineTask("Load", noop), PipelineTask("Dist", noop), PipelineTask("Step", noop)
        return PipelinePlan({load: TaskSchedule(stage=0, thread_group="l", stream="a"),
                             dist: TaskSchedule(stage=1, thread_group="w", stream=dist_stream),
                             step: TaskSchedule(stage=2, thread_group="c", stream="s")},
                            intra_iter_deps=[(dist, load), (step, dist)])

    def walk(schedule: Schedule, through: int) -> Dict[str, Tuple[List[Tuple[int, str, str]], Tuple[int, int]]]:
        positions = {group: (0, 0) for group in schedule.lanes}
        units = schedule.walk_all(positions, {0: "i0", 1: "i1"}, (through, 1))  # entries 0 and 1 decided
        return {group: ([(period, slot.task, item) for period, slot, item in of_group], positions[group])
                for group, of_group in zip(schedule.lanes, units)}

    with pytest.warns(SharedStreamWarning):
        shared = SWPipeline(plan("s"), device="cpu")._schedule
    for through in (ALL, 5):  # the data-flow rule releases every period; a bound past the decided ones
        assert walk(shared, through) == {"l": ([(0, "Load", "i0"), (1, "Load", "i1")], (2, 0)),
                                         "w": ([(1, "Dist", "i0")], (2, 0)),
                                         "c": ([], (2, 0))}
    # with Dist on a stream of its own nothing takes turns: every unit whose entry is decided goes out
    own = SWPipeline(plan("d"), device="cpu")._schedule
    assert walk(own, ALL) == {"l": ([(0, "Load", "i0"), (1, "Load", "i1")], (2, 0)),
                              "w": ([(1, "Dist", "i0"), (2, "Dist", "i1")], (3, 0)),
                              "c": ([(2, "Step", "i0"), (3, "Step", "i1")], (4, 0))}
