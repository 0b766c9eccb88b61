"""When a paper run of the schedule gets stuck, the error names, for each thread group, the unit it waits to run and
what that unit waits for: a dependency, a turn on a stream or in the global order (and whose turn it is), an
iteration not started, a turn not yet fixed, the caller, the clock.

``DataFlowPipeline(plan, max_depth=...)`` quotes it to say why a smaller ``max_depth`` cannot work; it
once came out empty (``needs 3 iterations alive at once ()``) for a group whose order was held at a slot
without an iteration, before the first.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, given, settings

from engine_helpers import ExecLog, make_plan, valid_plans
from swpipeline import DataFlowPipeline, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
from swpipeline.engine.release import ALL, ClockRule, DataFlowRule, Entries, Released
from swpipeline.engine.paper import ScheduleError, check
from swpipeline.engine.schedule import Schedule
from swpipeline.engine.interpreter import Interpreter
from swpipeline.engine.stuck import Standstill, blocked

pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")

# every reason a unit can wait, after "thread group 'g' waits to run T of iteration i"
REASONS = {
    "dependency": r", which waits for \w+ of iteration \d+",
    "turn": r", which waits for its turn (on stream '[^']*'|in the global order), where \w+ of iteration \d+ goes "
            r"first",
    "turn not fixed": r", whose turn (on stream '[^']*'|in the global order) is not fixed yet",
    "caller": r", which the caller's thread runs in a later progress\(\) call",
    "not started": r", which has not started",
    "turn fixed later": r", whose turn (on stream '[^']*'|in the global order) is fixed only once iteration \d+ has "
                        r"started",
    "clock": r", and the clock has not reached period \d+",
    "behind": r", queued behind \w+ of period \d+(, and iteration \d+ has not started|, whose turn (on stream "
              r"'[^']*'|in the global order) is fixed only once iteration \d+ has started|, and the clock has not "
              r"reached period \d+)",
}
CLAUSE = re.compile(r"thread group '[^']+' waits to run \w+ of iteration \d+(?P<why>.*)")


def kinds_of(text: str) -> List[str]:
    """The reason of each clause of a ``blocked`` text; fails on a clause without a known one."""
    kinds = []
    for clause in text.split("; "):
        match = CLAUSE.fullmatch(clause)
        assert match is not None, clause
        kind = [k for k, pattern in REASONS.items() if re.fullmatch(pattern, match["why"])]
        assert len(kind) == 1, clause
        kinds.append(kind[0])
    return kinds


def schedule_of(spec: Dict[str, Tuple[int, Any, str]], intra: Sequence[Tuple[str, str]] = (),
                inter: Sequence[Any] = ()) -> Schedule:
    return SWPipeline(make_plan(ExecLog(), spec, intra, inter), device="cpu")._schedule


def stuck_text(schedule: Schedule, rule: Any, num_batches: int, caller_group: Optional[str] = None) -> str:
    with pytest.raises(ScheduleError) as stuck:
        check(schedule, rule, num_batches, caller_group)
    assert str(stuck.value).startswith(f"with {num_batches} batches the schedule gets stuck after retiring ")
    assert f": {stuck.value.blocked}\nP0: " in str(stuck.value)
    return stuck.value.blocked


# the plan of the report: stages 2,1,2,2,2 on streams s1,s2,s1,s1,s2 and groups g2,g2,g2,default,g1
ISSUE_SPEC = {"t0": (2, "s1", "g2"), "t1": (1, "s2", "g2"), "t2": (2, "s1", "g2"), "t3": (2, "s1", "default"),
              "t4": (2, "s2", "g1")}
ISSUE_INTRA = [("t3", "t2"), ("t4", "t0")]


def test_a_max_depth_too_small_names_the_stream_each_group_waits_on() -> None:
    with pytest.raises(ValueError) as refused:
        DataFlowPipeline(make_plan(ExecLog(), ISSUE_SPEC, ISSUE_INTRA), max_depth=1, device="cpu")
    assert str(refused.value) == (
        "max_depth=1 is too small for this plan: each thread group runs its units in the order SWPipeline runs "
        "them (on a stream, older iterations first; the stages set how iterations interleave), and that order "
        "needs 3 iterations alive at once (thread group 'g2' waits to run t1 of iteration 0, whose turn on stream "
        "'s2' is fixed only once iteration 1 has started; thread group 'default' waits to run t3 of iteration 0, "
        "whose turn on stream 's1' is fixed only once iteration 2 has started; thread group 'g1' waits to run t4 "
        "of iteration 0, whose turn on stream 's2' is fixed only once iteration 2 has started); use max_depth >= 3, "
        "or lower the stages")


# The waits a valid plan can get stuck on with too few live iterations, each on a plan where it does.
VALID_PLAN_WAITS = {
    "not started": ({"A": (0, None, "g"), "B": (1, None, "g"), "C": (2, None, "g")}, [("B", "A"), ("C", "B")], [],
                    1, 1, "thread group 'g' waits to run A of iteration 1, which has not started"),
    "turn fixed later": (ISSUE_SPEC, ISSUE_INTRA, [], 2, 3,
                         "thread group 'g2' waits to run t0 of iteration 0, whose turn on stream 's1' is fixed only "
                         "once iteration 2 has started; thread group 'default' waits to run t3 of iteration 0, whose "
                         "turn on stream 's1' is fixed only once iteration 2 has started; thread group 'g1' waits to "
                         "run t4 of iteration 0, whose turn on stream 's2' is fixed only once iteration 2 has started"),
    # g1's order holds at T2's turn of period 1 (no iteration yet: -2); T1 of iteration 0 is queued behind it
    "behind": ({"T0": (3, "s1", "g1"), "T1": (3, "s2", "g2"), "T2": (3, "s1", "g2")}, [], [], 1, 1,
               "thread group 'g1' waits to run T0 of iteration 0, whose turn on stream 's1' is fixed only once "
               "iteration 3 has started; thread group 'g2' waits to run T1 of iteration 0, queued behind T2 of "
               "period 1, whose turn on stream 's1' is fixed only once iteration 1 has started"),
    # T1 (stage 1, stream of its own) is handed out and waits for T0, whose turn on s2 is not fixed
    "dependency": ({"T0": (1, "s2", "g2"), "T1": (1, None, "g1"), "T3": (0, "s2", "g3")}, [("T1", "T0")], [], 1, 1,
                   "thread group 'g2' waits to run T0 of iteration 0, whose turn on stream 's2' is fixed only once "
                   "iteration 1 has started; thread group 'g3' waits to run T3 of iteration 1, which has not started; "
                   "thread group 'g1' waits to run T1 of iteration 0, which waits for T0 of iteration 0"),
}


@pytest.mark.parametrize("kind", list(VALID_PLAN_WAITS))
def test_each_wait_of_a_valid_plan_is_named(kind: str) -> None:
    spec, intra, inter, live, num_batches, expected = VALID_PLAN_WAITS[kind]
    schedule = schedule_of(spec, intra, inter)
    text = stuck_text(schedule, DataFlowRule(schedule.depth, live), num_batches)
    assert text == expected
    assert kind in kinds_of(text)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=valid_plans())
def test_every_stuck_order_of_a_random_plan_says_what_each_group_waits_for(shape: Dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        schedule = schedule_of(shape["spec"], shape["intra"], shape["inter"])
    for live in range(1, schedule.depth):
        for num_batches in sorted({1, schedule.depth, 2 * schedule.depth + live + 1}):
            try:
                check(schedule, DataFlowRule(schedule.depth, live), num_batches)
            except ScheduleError as stuck:
                assert stuck.blocked  # every clause names a group, a unit and a known reason
                assert set(kinds_of(stuck.blocked)) <= {"dependency", "not started", "turn fixed later", "behind"}


# The waits only a broken order or rule can get stuck on: each still names what it waits for.

def test_a_turn_wait_names_the_unit_whose_turn_it_is() -> None:
    # A and B take turns on stream s (A first); X, on A's group, waits for B. Run before A, X never gets B.
    for ordered in (False, True):
        a, b, x = PipelineTask("A", print), PipelineTask("B", print), PipelineTask("X", print)
        plan = PipelinePlan({a: TaskSchedule(thread_group="g", stream="s", globally_ordered=ordered),
                             b: TaskSchedule(thread_group="h", stream="s" if not ordered else "t",
                                             globally_ordered=ordered),
                             x: TaskSchedule(thread_group="g", stream="x")}, intra_iter_deps=[(x, b)])
        good = SWPipeline(plan, device="cpu")._schedule
        bad = dataclasses.replace(good, lanes={g: tuple(reversed(v)) for g, v in good.lanes.items()})
        where = "in the global order" if ordered else "on stream 's'"
        assert stuck_text(bad, ClockRule(1), 2) == (
            f"thread group 'g' waits to run X of iteration 0, which waits for B of iteration 0; thread group 'h' "
            f"waits to run B of iteration 0, which waits for its turn {where}, where A of iteration 0 goes first")


class CallerNeverRuns(DataFlowRule):
    """A broken rule: the caller's group never gets to run anything."""

    def caller_through(self, entries: Entries[object]) -> int:
        return -1


class ClockStops(ClockRule):
    """A broken rule: the clock never passes period 0."""

    def released(self, entries: Entries[Any]) -> Released:
        return 0, 0

    def retired(self, entries: Entries[Any], oldest: Optional[int], fetch: Any) -> Released:
        super().retired(entries, oldest, fetch)
        return 0, 0


def test_a_caller_or_clock_wait_is_named() -> None:
    schedule = schedule_of({"A": (0, "a", "w"), "B": (1, "b", "c")}, [("B", "A")])
    assert stuck_text(schedule, CallerNeverRuns(2, 2), 2, caller_group="c") == (
        "thread group 'w' waits to run A of iteration 2, which has not started; thread group 'c' waits to run B of "
        "iteration 0, which the caller's thread runs in a later progress() call")
    assert stuck_text(schedule, ClockStops(2), 2) == (
        "thread group 'w' waits to run A of iteration 1, and the clock has not reached period 1; thread group 'c' "
        "waits to run B of iteration 0, and the clock has not reached period 1")


def test_a_turn_not_fixed_is_named() -> None:
    # a standstill no rule of ours reaches: B handed out before its turn was numbered; g's order is held by the
    # clock at A of period 0 (no iteration), and A of iteration 0, in period 1, is past the clock too
    schedule = schedule_of({"A": (1, "s", "g"), "B": (0, "s", "h"), "C": (1, None, "h")})
    slot = {s.task: s for s in schedule.slots}
    interpreter = Interpreter([schedule])
    interpreter.hand_out(interpreter.lane_of[(0, "h")], [(0, slot["B"], 0)])
    state = Standstill(0, positions={"g": (0, 0), "h": (1, 0)}, released=(0, ALL), horizon=ALL, caller_group=None,
                       caller_through=ALL)
    assert blocked(interpreter, [state]) == (
        "thread group 'g' waits to run A of iteration 0, and the clock has not reached period 1; thread group 'h' "
        "waits to run B of iteration 0, whose turn on stream 's' is not fixed yet")
