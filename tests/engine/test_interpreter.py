"""The one interpreter of the schedule's units, over one schedule and over several (one per rank) whose units wait on
each other: readiness (dependencies, turns), turn numbering, retirement, and what a stuck unit waits for."""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import pytest

from swpipeline import PipelinePlan, PipelineTask, TaskSchedule
from swpipeline.engine.interpreter import Interpreter, UnitRef, Wait
from swpipeline.engine.paper import OnPaper, ScheduleError, check, check_together, schedule_of
from swpipeline.engine.release import ClockRule, DataFlowRule
from swpipeline.engine.schedule import Schedule

pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")


def noop(ctx: object) -> None:
    return None


def rank_plan(first: str, then: str, stream_of_first: str = "default") -> Schedule:
    """One rank's step: ``first`` then ``then`` on one thread group, stage 0 (``then`` depends on ``first``)."""
    a, b = PipelineTask(first, noop), PipelineTask(then, noop)
    return schedule_of(PipelinePlan({a: TaskSchedule(stage=0, stream=stream_of_first), b: TaskSchedule(stage=0)},
                                    intra_iter_deps=[(b, a)]))


def ranks(*schedules: Schedule) -> List[OnPaper]:
    return [OnPaper(s, ClockRule(s.depth), name=f"rank {k}") for k, s in enumerate(schedules)]


def sends_to_receives(batches: int, waits: Sequence[Tuple[int, int]]) -> List[Tuple[UnitRef, UnitRef]]:
    """Recv of rank r on iteration i waits for Send of rank s on iteration i, for each (r, s) of ``waits``."""
    return [((r, "Recv", i), (s, "Send", i)) for i in range(batches) for r, s in waits]


def test_one_schedule_run_by_hand() -> None:
    # A (stage 0) and B (stage 1, depends on A) on one thread group; two iterations handed out whole.
    a, b = PipelineTask("A", noop), PipelineTask("B", noop)
    schedule = schedule_of(PipelinePlan({a: TaskSchedule(stage=0), b: TaskSchedule(stage=1)}, intra_iter_deps=[(b, a)]))
    interpreter = Interpreter([schedule])
    lane = interpreter.lane_of[(0, "default")]
    units = schedule.walk("default", (0, 0), {0: 0, 1: 1}, (2, 1))[0]
    assert [(period, slot.task, it) for period, slot, it in units] == [(0, "A", 0), (1, "B", 0), (1, "A", 1),
                                                                       (2, "B", 1)]
    interpreter.hand_out(lane, units)
    assert interpreter.run() == 4
    assert interpreter.iteration_done(0, 0) and interpreter.iteration_done(0, 1)
    assert interpreter.is_done(0, 1, 1) and not interpreter.is_done(0, 1, 2)
    assert interpreter.head(lane) is None and interpreter.blocker(lane) is None


def test_units_of_two_ranks_that_wait_on_each_other_run_on_paper() -> None:
    # rank 0 sends on each iteration, rank 1 receives what it sent: the receive waits for the send
    send_first, receive_first = rank_plan("Fwd", "Send"), rank_plan("Recv", "Fwd")
    check_together(ranks(send_first, receive_first), 3, cross=sends_to_receives(3, [(1, 0)]))


def test_two_ranks_that_both_receive_first_get_stuck_and_each_is_named() -> None:
    both = rank_plan("Recv", "Send")
    with pytest.raises(ScheduleError) as stuck:
        check_together(ranks(both, both), 2, cross=sends_to_receives(2, [(0, 1), (1, 0)]))
    assert stuck.value.blocked == (
        "thread group 'default' of rank 0 waits to run Recv of iteration 0, which waits for Send of iteration 0 of "
        "rank 1; thread group 'default' of rank 1 waits to run Recv of iteration 0, which waits for Send of "
        "iteration 0 of rank 0")
    assert str(stuck.value).startswith("with 2 batches the schedules get stuck after retiring 0 on rank 0, 0 on "
                                       "rank 1 iteration(s): ")
    assert "\nrank 0:\nP0: default[Recv(i0) Send(i0)]" in str(stuck.value)


def test_blocking_sends_that_cross_get_stuck_and_one_receive_first_unsticks_them() -> None:
    # A blocking send runs together with its receive. Both ranks sending first: each send waits for a receive
    # queued behind the other rank's send. Rank 1 receiving first: the pairs meet.
    send_first, receive_first = rank_plan("Send", "Recv"), rank_plan("Recv", "Send")
    pairs = [((0, "Send", i), (1, "Recv", i)) for i in range(3)] + [((1, "Send", i), (0, "Recv", i))
                                                                   for i in range(3)]
    with pytest.raises(ScheduleError) as stuck:
        check_together(ranks(send_first, send_first), 3, together=pairs)
    assert stuck.value.blocked == (
        "thread group 'default' of rank 0 waits to run Send of iteration 0, which runs together with Recv of "
        "iteration 0 of rank 1, which cannot run yet; thread group 'default' of rank 1 waits to run Send of "
        "iteration 0, which runs together with Recv of iteration 0 of rank 0, which cannot run yet")
    check_together(ranks(send_first, receive_first), 3, together=pairs)


def test_a_pair_runs_at_once_and_counts_for_both_iterations() -> None:
    send_first, receive_first = rank_plan("Send", "Recv"), rank_plan("Recv", "Send")
    interpreter = Interpreter([send_first, receive_first], together=[((0, "Send", 0), (1, "Recv", 0)),
                                                                     ((1, "Send", 0), (0, "Recv", 0))])
    for k, schedule in enumerate((send_first, receive_first)):
        interpreter.hand_out(interpreter.lane_of[(k, "default")], schedule.walk("default", (0, 0), {0: 0}, (0, 0))[0])
    assert interpreter.blocker(interpreter.lane_of[(1, "default")]) is None
    assert interpreter.run() == 4
    assert all(interpreter.iteration_done(k, 0) for k in (0, 1))


def test_turns_are_numbered_period_by_period_and_taken_in_that_order() -> None:
    # A (group g) and B (group h) share stream s: each unit takes its turn, A first in a period
    a, b = PipelineTask("A", noop), PipelineTask("B", noop)
    schedule = schedule_of(PipelinePlan({a: TaskSchedule(thread_group="g", stream="s"),
                                         b: TaskSchedule(thread_group="h", stream="s")}, intra_iter_deps=[(b, a)]))
    interpreter = Interpreter([schedule])
    g, h = interpreter.lane_of[(0, "g")], interpreter.lane_of[(0, "h")]
    for group, lane in (("g", g), ("h", h)):
        interpreter.hand_out(lane, schedule.walk(group, (0, 0), {0: 0, 1: 1}, (1, 1))[0])
    line = Schedule.turn_lines(schedule.slots[0])[0]
    assert interpreter.blocker(g) == Wait("not numbered", 0, "A", 0, line)
    interpreter.number(0, 0, {0: 0})
    assert interpreter.run() == 2  # A(0), B(0); period 1 is not numbered
    assert interpreter.blocker(g) == Wait("not numbered", 0, "A", 1, line)
    interpreter.number(0, 1, {1: 1})
    assert interpreter.run() == 2


def test_units_named_outside_a_schedule_are_refused() -> None:
    schedule = rank_plan("Recv", "Send")
    with pytest.raises(ValueError, match=r"unit \(0, 'Sned', 0\): schedule 0 has no task 'Sned' \(its tasks: "
                                         r"\['Recv', 'Send'\]\)"):
        Interpreter([schedule], cross=[((0, "Sned", 0), (0, "Recv", 0))])
    with pytest.raises(ValueError, match=r"unit \(1, 'Send', 0\): there is no schedule 1 \(there are 1\)"):
        Interpreter([schedule], cross=[((1, "Send", 0), (0, "Recv", 0))])
    with pytest.raises(ValueError, match=r"the iteration must be an int >= 0, got -1"):
        Interpreter([schedule], together=[((0, "Send", -1), (0, "Recv", 0))])
    with pytest.raises(ValueError, match="a unit runs together with one other unit at most"):
        Interpreter([schedule], together=[((0, "Send", 0), (0, "Recv", 0)), ((0, "Send", 0), (0, "Recv", 1))])


def test_one_schedule_checked_alone_or_as_the_only_one_of_several_is_the_same_check() -> None:
    tasks = [PipelineTask(n, noop) for n in "ABC"]
    schedule = schedule_of(PipelinePlan({t: TaskSchedule(stage=k, thread_group="g") for k, t in enumerate(tasks)},
                                        intra_iter_deps=[(tasks[1], tasks[0]), (tasks[2], tasks[1])]))
    texts: Dict[str, str] = {}
    for how in ("alone", "together"):
        with pytest.raises(ScheduleError) as stuck:
            if how == "alone":
                check(schedule, DataFlowRule(3, 1), 3)
            else:
                check_together([OnPaper(schedule, DataFlowRule(3, 1))], 3)
        texts[how] = str(stuck.value)
    assert texts["alone"] == texts["together"]
    assert texts["alone"].startswith("with 3 batches the schedule gets stuck after retiring 0 iteration(s): thread "
                                     "group 'g' waits to run A of iteration 1, which has not started\n")


def test_a_paper_run_tells_each_unit_as_it_runs_and_what_it_waited_for() -> None:
    # rank 0: Fwd then Send; rank 1: Recv (waits for rank 0's Send) then Fwd. Each unit is told once, after all it
    # waited for: its dependencies, its cross waits, the unit before it in its lane, each once
    send_first, receive_first = rank_plan("Fwd", "Send"), rank_plan("Recv", "Fwd")
    told: List[Tuple[UnitRef, Tuple[UnitRef, ...]]] = []
    check_together(ranks(send_first, receive_first), 2, cross=sends_to_receives(2, [(1, 0)]),
                   ran=lambda unit, after: told.append((unit, after)))
    assert told == [((0, "Fwd", 0), ()), ((0, "Send", 0), ((0, "Fwd", 0),)),
                    ((1, "Recv", 0), ((0, "Send", 0),)), ((1, "Fwd", 0), ((1, "Recv", 0),)),
                    ((0, "Fwd", 1), ((0, "Send", 0),)), ((0, "Send", 1), ((0, "Fwd", 1),)),
                    ((1, "Recv", 1), ((0, "Send", 1), (1, "Fwd", 0))), ((1, "Fwd", 1), ((1, "Recv", 1),))]


def test_a_pair_that_runs_together_is_told_of_what_either_waited_for() -> None:
    send_first, receive_first = rank_plan("Fwd", "Send"), rank_plan("Recv", "Fwd")
    told: Dict[UnitRef, Tuple[UnitRef, ...]] = {}
    check_together(ranks(send_first, receive_first), 1, together=[((0, "Send", 0), (1, "Recv", 0))],
                   ran=lambda unit, after: told.update({unit: after}))
    assert told[(0, "Send", 0)] == told[(1, "Recv", 0)] == ((0, "Fwd", 0),)
    assert told[(1, "Fwd", 0)] == ((1, "Recv", 0),)
