"""Why a paper run of the schedule got stuck, in words: each thread group, the unit it waits to run, and what for.

``paper.py`` runs schedules on paper and, when nothing can move, hands this module the
interpreter and where each schedule's engine stands (``Standstill``). Each thread group
with work left is in one of two places, and each has its reasons, every one named::

    handed out, at the head of its lane     the interpreter's wait (``Interpreter.blocker``): a dependency
                                            (intra: this iteration's unit; inter: an older one's; cross:
                                            another schedule's), its turn on a stream shared by thread
                                            groups or in the global order (the unit whose turn it is), a
                                            turn not numbered yet, a partner to run with; or else the
                                            caller's next progress() call
    not handed out (the release rule        its iteration has not started; or its turn (stream or
    holds it back)                          global order) is fixed only once the iteration entering
                                            in its period has started; or the clock is not there

A group held back at a slot without an iteration (one before the first) names the next
unit of its order, and the slot it is queued behind. On paper iteration ``i`` enters in
period ``i``; a unit of an iteration past the last batch may be named, since the engine
learns that there is none only by drawing it. With several schedules each group and each
unit of another schedule is named with its schedule (``thread group 'g' of rank 1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

from .interpreter import Interpreter, Wait
from .release import Released
from .schedule import Position, Schedule, Slot, Unit

__all__: List[str] = []


@dataclass(frozen=True)
class Standstill:
    """Where one schedule's engine stands on paper when nothing can move (the rest is the interpreter's)."""

    schedule: int  # its index in the interpreter
    positions: Mapping[str, Position]  # where each group's walk stands: its first unit not handed out
    released: Released  # how far the release rule lets the orders go
    horizon: int  # the last period any unit can have
    caller_group: Optional[str]
    caller_through: int  # the last period the caller's group runs in this progress() call


def blocked(interpreter: Interpreter, states: Sequence[Standstill]) -> str:
    """Each thread group with work left: the unit it waits to run and what that unit waits for."""
    waits = []
    for state in states:
        schedule = interpreter.schedules[state.schedule]
        of = _of(interpreter, state.schedule)
        for group in schedule.lanes:
            lane = interpreter.lane_of[(state.schedule, group)]
            head = interpreter.head(lane)
            if head is not None:
                period, slot, it = head
                why = _why_queued(interpreter, state, group, head)
            else:
                found = _next_unit(schedule, state, group)
                if found is None:
                    continue
                (period, slot, it), held = found
                why = _why_held(schedule, state, period, slot, held)
            waits.append(f"thread group {group!r}{of} waits to run {slot.task} of iteration {it}{why}")
    return "; ".join(waits)


def _of(interpreter: Interpreter, schedule: int) -> str:
    """How a schedule is named after a group or a unit: nothing with only one."""
    return f" of {interpreter.names[schedule]}" if len(interpreter.schedules) > 1 else ""


def _where(slot: Slot, lines: Sequence[object]) -> str:
    """A unit's turn lines in words: "on stream 's'", "in the global order", or both."""
    return " and ".join("in the global order" if line == "sequencer" else f"on stream {slot.stream!r}"
                        for line in lines)


def _why_queued(interpreter: Interpreter, state: Standstill, group: str, head: Unit[int]) -> str:
    """What a unit handed out, at the head of its group's lane, waits for."""
    period, slot, _ = head
    wait: Optional[Wait] = interpreter.blocker(interpreter.lane_of[(state.schedule, group)])
    if wait is not None:
        unit = f"{wait.task} of iteration {wait.iteration}"
        if wait.schedule != state.schedule:
            unit += _of(interpreter, wait.schedule)
        if wait.kind == "dependency":
            return f", which waits for {unit}"
        if wait.kind == "not numbered":
            return f", whose turn {_where(slot, [wait.line])} is not fixed yet"
        if wait.kind == "turn":
            return f", which waits for its turn {_where(slot, [wait.line])}, where {unit} goes first"
        return f", which runs together with {unit}, which cannot run yet"
    if group == state.caller_group:
        return ", which the caller's thread runs in a later progress() call"
    return ""  # never: a unit with none of these waits runs


def _held(state: Standstill, period: int, slot: Slot) -> bool:
    """Whether the release rule holds back the group's order at this slot of this period (``Schedule.walk``)."""
    through, decided = state.released
    return (period > min(through, state.horizon) or slot.entry(period) > decided
            or (period > decided and slot.takes_turns))


def _next_unit(schedule: Schedule, state: Standstill, group: str) -> Optional[Tuple[Unit[int], Tuple[int, Slot]]]:
    """A group's first unit not handed out (before the first iteration no slot has one), and the slot its walk is
    held at; None past the last period any unit can have."""
    lane = schedule.lanes[group]
    period, k = state.positions[group]
    held = (period, lane[k]) if k < len(lane) else (period + 1, lane[0])
    while period <= state.horizon:  # (not for long: every slot has a unit from its stage's period on)
        for slot in lane[k:]:
            if slot.entry(period) >= 0:
                return (period, slot, slot.entry(period)), held
        period, k = period + 1, 0
    return None


def _why_held(schedule: Schedule, state: Standstill, period: int, slot: Slot, held: Tuple[int, Slot]) -> str:
    """Why the release rule has not handed out a group's next unit: it is held back itself, or queued behind the
    slot the group's order is held at."""
    behind = ""
    if not _held(state, period, slot):
        period, slot = held
        behind = f", queued behind {slot.task} of period {period}"
    through, decided = state.released
    if period > min(through, state.horizon):
        return f"{behind}, and the clock has not reached period {period}"
    if slot.entry(period) > decided:
        return f"{behind}, and iteration {slot.entry(period)} has not started" if behind else ", which has not started"
    return (f"{behind}, whose turn {_where(slot, schedule.turn_lines(slot))} is fixed only once iteration {period} "
            f"has started")
