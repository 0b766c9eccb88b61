"""Why a paper run of the schedule got stuck, in words: each thread group, the unit it waits to run, and what for.

``Schedule.check`` runs the schedule on paper and, when nothing can move, hands this
module where it stands (``Standstill``). Each thread group with work left is in one of
two places, and each has its reasons, every one named::

    handed out, at the head of its queue    waits for a dependency (intra: this iteration's unit;
                                            inter: an older one's), for its turn on a stream shared
                                            by thread groups or in the global order (the unit whose
                                            turn it is), or for the caller's next progress() call
    not handed out (the release rule        its iteration has not started; or its turn (stream or
    holds it back)                          global order) is fixed only once the iteration entering
                                            in its period has started; or the clock is not there

A group held back at a slot without an iteration (one before the first) names the next
unit of its order, and the slot it is queued behind. On paper iteration ``i`` enters in
period ``i``; a unit of an iteration past the last batch may be named, since the engine
learns that there is none only by drawing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, AbstractSet, Dict, List, Mapping, Optional, Sequence, Tuple

from .release import Released

if TYPE_CHECKING:
    from .schedule import Position, Schedule, Slot, Unit

__all__: List[str] = []


@dataclass(frozen=True)
class Standstill:
    """Where a paper run stands when nothing can move (the state of ``Schedule.check``)."""

    queues: Mapping[str, Sequence["Unit[int]"]]  # each thread group's units handed out, in its order
    heads: Mapping[str, int]  # each queue's first unit not run
    positions: Mapping[str, "Position"]  # where each group's walk stands: its first unit not handed out
    done: AbstractSet[Tuple[int, int]]  # (task index, iteration) of the units run
    turn_orders: Mapping[object, Sequence[Tuple[int, int]]]  # each turn line's units, in turn order
    turn: Mapping[object, int]  # each turn line's turns taken
    released: Released  # how far the release rule lets the orders go
    horizon: int  # the last period any unit can have
    caller_group: Optional[str]
    caller_through: int  # the last period the caller's group runs in this progress() call


def blocked(schedule: "Schedule", state: Standstill) -> str:
    """Each thread group with work left: the unit it waits to run and what that unit waits for."""
    names = {slot.index: slot.task for slot in schedule.slots}
    waits = []
    for group in schedule.lanes:
        queue, head = state.queues[group], state.heads[group]
        if head < len(queue):
            period, slot, it = queue[head]
            why = _why_queued(schedule, state, names, group, period, slot, it)
        else:
            found = _next_unit(schedule, state, group)
            if found is None:
                continue
            (period, slot, it), held = found
            why = _why_held(schedule, state, period, slot, held)
        waits.append(f"thread group {group!r} waits to run {slot.task} of iteration {it}{why}")
    return "; ".join(waits)


def _where(slot: "Slot", lines: Sequence[object]) -> str:
    """A unit's turn lines in words: "on stream 's'", "in the global order", or both."""
    return " and ".join("in the global order" if line == "sequencer" else f"on stream {slot.stream!r}"
                        for line in lines)


def _why_queued(schedule: "Schedule", state: Standstill, names: Dict[int, str], group: str, period: int,
                slot: "Slot", it: int) -> str:
    """What a unit handed out, at the head of its group's queue, waits for."""
    for d in slot.intra:
        if (d, it) not in state.done:
            return f", which waits for {names[d]} of iteration {it}"
    for d, back in slot.inter:
        if it >= back and (d, it - back) not in state.done:
            return f", which waits for {names[d]} of iteration {it - back}"
    for line in schedule.turn_lines(slot):
        order, k = state.turn_orders.get(line, ()), state.turn.get(line, 0)
        if k >= len(order):
            return f", whose turn {_where(slot, [line])} is not fixed yet"
        if order[k] != (slot.index, it):
            first, first_it = order[k]
            return (f", which waits for its turn {_where(slot, [line])}, where {names[first]} of "
                    f"iteration {first_it} goes first")
    if group == state.caller_group and not schedule.runs_before_retire(period, slot, state.caller_through):
        return ", which the caller's thread runs in a later progress() call"
    return ""  # never: a unit with none of these waits runs


def _held(state: Standstill, period: int, slot: "Slot") -> bool:
    """Whether the release rule holds back the group's order at this slot of this period (``Schedule.walk``)."""
    through, decided = state.released
    return (period > min(through, state.horizon) or period - slot.stage > decided
            or (period > decided and slot.takes_turns))


def _next_unit(schedule: "Schedule", state: Standstill,
               group: str) -> Optional[Tuple["Unit[int]", Tuple[int, "Slot"]]]:
    """A group's first unit not handed out (before the first iteration no slot has one), and the slot its walk is
    held at; None past the last period any unit can have."""
    lane = schedule.lanes[group]
    period, k = state.positions[group]
    held = (period, lane[k]) if k < len(lane) else (period + 1, lane[0])
    while period <= state.horizon:  # (not for long: every slot has a unit from its stage's period on)
        for slot in lane[k:]:
            if period >= slot.stage:
                return (period, slot, period - slot.stage), held
        period, k = period + 1, 0
    return None


def _why_held(schedule: "Schedule", state: Standstill, period: int, slot: "Slot", held: Tuple[int, "Slot"]) -> str:
    """Why the release rule has not handed out a group's next unit: it is held back itself, or queued behind the
    slot the group's order is held at."""
    behind = ""
    if not _held(state, period, slot):
        period, slot = held
        behind = f", queued behind {slot.task} of period {period}"
    through, decided = state.released
    if period > min(through, state.horizon):
        return f"{behind}, and the clock has not reached period {period}"
    if period - slot.stage > decided:
        return f"{behind}, and iteration {period - slot.stage} has not started" if behind else ", which has not started"
    return (f"{behind}, whose turn {_where(slot, schedule.turn_lines(slot))} is fixed only once iteration {period} "
            f"has started")
