"""The whole pipeline's step, proved on paper by the engine's own interpreter before any rank sends.

Every rank builds every rank's units (``units.py``) from the configuration and turns each
rank's into the ``PipelinePlan`` that rank runs (``plan_of_rank.py``). ``prove`` hands all
of them to the engine's interpreter at once (``engine.paper.check_together``: one schedule
per rank, each run on paper as ``SWPipeline`` runs it, under its release rule, the compute
group on the caller's thread), with one more wait per message: a receive waits for its
send. So the rule that decides when a unit may run is the engines' own, over several ranks;
nothing here restates it.

Why a message is a one-way wait (``cross``) and not a meeting of send and receive
(``together``): a send only posts its message (``Transport.send``: ``isend``, its handle
kept) and returns at once, whether or not the receiver is there; its completion is awaited
only after the step's plan has run, once every peer's DONE showed it took every message
(``Transport.finish_step``). A receive waits for its message. Modelled as meetings, the
sends of 1F1B, which cross on every step (rank 0 sends a forward while rank 1 sends a
gradient back), would be refused; as posted, they pass, as they run.

Running a unit never stops another from running, so one maximal paper run decides for
every timing whether the step completes (``engine/interpreter.py``). When it gets stuck,
every unit that did not run waits, directly or not, for another that did not: the error
names one cycle of them, unit by unit, with the ranks, the microbatches and what each waits
for. The same run, told of each unit as it runs and of what it waited for, puts times on
the units (``paper_times``): the side-by-side table of ``print_schedule`` (every compute
action one tick) and, with measured costs, the step time of ``simulate``.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Set, Tuple

from ..engine.interpreter import UnitRef
from ..engine.paper import OnPaper, ScheduleError, check_together, schedule_of
from ..engine.release import ClockRule
from .actions import Action
from .errors import ScheduleHangError
from .plan_of_rank import TaskFn, plan_of_rank
from .units import COMPUTE, ChannelKey, RankUnits, Unit

__all__: List[str] = []

NodeId = Tuple[int, str]  # (rank, unit name)
Times = Dict[NodeId, Tuple[float, float]]  # unit -> (start, end) on paper


class Wait(NamedTuple):
    """One "waits for" of a unit, in words (for the error that names a cycle)."""

    node: NodeId  # the unit waited for
    reason: str


class RankPlans(NamedTuple):
    """Every rank's plan as the engine runs it on paper, and the messages as waits between them."""

    engines: List[OnPaper]  # one per rank, in rank order
    ranks: List[int]  # the rank of each
    messages: List[Tuple[NodeId, NodeId]]  # (receive, send) of every message


def rank_plans(schedules: Mapping[int, RankUnits]) -> RankPlans:
    """Each rank's plan on paper (``SWPipeline``'s rule, the compute group on the caller's thread), and every
    receive paired with its send.

    Raises:
        ScheduleHangError: a send or a receive without its partner on the other rank.
    """
    ends: Dict[ChannelKey, Dict[str, NodeId]] = {}
    for rank, groups in schedules.items():
        for group_units in groups.values():
            for unit in group_units:
                if unit.channel is not None:
                    ends.setdefault(unit.channel, {})[unit.role] = (rank, unit.name)
    messages: List[Tuple[NodeId, NodeId]] = []
    for key, found in sorted(ends.items()):
        if set(found) != {"send", "recv"}:
            raise ScheduleHangError(_unmatched(key, found), [found.get("send") or found["recv"]])
        messages.append((found["recv"], found["send"]))
    engines, ranks = [], sorted(schedules)
    for rank in ranks:
        schedule = schedule_of(plan_of_rank(schedules[rank], _on_paper))
        engines.append(OnPaper(schedule, ClockRule(schedule.depth), COMPUTE, f"rank {rank}"))
    return RankPlans(engines, ranks, messages)


def _on_paper(unit: Unit) -> TaskFn:
    return lambda ctx: None  # (a plan only looked at, never run)


def _unmatched(key: ChannelKey, found: Mapping[str, NodeId]) -> str:
    src, dst, index = key
    if "send" in found:
        name = found["send"][1]
        return (f"rank {src} sends {name} to rank {dst} (message {index} from rank {src} to rank {dst}) but rank {dst} "
                f"never receives it: every send needs its receive on the other rank")
    name = found["recv"][1]
    return (f"rank {dst} receives {name} from rank {src} (message {index} from rank {src} to rank {dst}) but rank "
            f"{src} never sends it: every receive needs its send on the other rank")


def prove(schedules: Mapping[int, RankUnits]) -> None:
    """Prove that every rank's step completes: every send matched, no set of units waiting on each other.

    Raises:
        ScheduleHangError: a send or receive without its partner, or a cycle of waits (named unit by unit).
    """
    paper_times(schedules, lambda unit: 0.0)


def paper_times(schedules: Mapping[int, RankUnits], cost: Callable[[Unit], float]) -> Times:
    """Each unit's start and end on the engine's paper run of every rank at once, a unit starting once all it
    waited for has ended and taking ``cost(unit)``.

    Raises:
        ScheduleHangError: as ``prove``.
    """
    plans = rank_plans(schedules)
    rank_of = dict(enumerate(plans.ranks))
    index_of = {rank: k for k, rank in rank_of.items()}
    units = {(rank, unit.name): unit for rank, groups in schedules.items()
             for group_units in groups.values() for unit in group_units}
    times: Times = {}

    def ran(unit: UnitRef, after: Tuple[UnitRef, ...]) -> None:
        start = max((times[(rank_of[k], name)][1] for k, name, _ in after), default=0.0)
        node = (rank_of[unit[0]], unit[1])
        times[node] = (start, start + cost(units[node]))

    cross = [((index_of[recv[0]], recv[1], 0), (index_of[send[0]], send[1], 0)) for recv, send in plans.messages]
    try:
        check_together(plans.engines, 1, cross=cross, ran=ran)
    except ScheduleError as stuck:
        raise _hang(schedules, set(units) - set(times)) from stuck
    return times


def _waits(schedules: Mapping[int, RankUnits], node: NodeId, stuck: Set[NodeId]) -> Optional[Wait]:
    """What a unit that did not run waits for among the others that did not, in words: the unit before it in its
    thread group, or (the first in its group not run) a unit of its own rank it needs, or its message's send."""
    rank, name = node
    for group, group_units in schedules[rank].items():
        names = [u.name for u in group_units]
        if name not in names:
            continue
        k = names.index(name)
        unit = group_units[k]
        if k and (rank, names[k - 1]) in stuck:
            reason = "needs it" if names[k - 1] in unit.deps else f"runs after it on rank {rank}'s {group} thread"
            return Wait((rank, names[k - 1]), reason)
        for dep in unit.deps:
            if (rank, dep) in stuck:
                return Wait((rank, dep), "needs it")
        if unit.role == "recv" and unit.channel is not None:
            src = unit.channel[0]
            send = next(u.name for u in _all(schedules[src]) if u.channel == unit.channel and u.role == "send")
            if (src, send) in stuck:
                return Wait((src, send), f"is received once rank {src} sends it")
    return None


def _all(groups: RankUnits) -> List[Unit]:
    return [unit for group_units in groups.values() for unit in group_units]


def _hang(schedules: Mapping[int, RankUnits], stuck: Set[NodeId]) -> ScheduleHangError:
    """The error for the units the paper run left ``stuck``: one cycle of them, unit by unit, and a fix."""
    units = {(rank, unit.name): unit for rank, groups in schedules.items() for unit in _all(groups)}
    path: List[Tuple[NodeId, Wait]] = []
    seen: Dict[NodeId, int] = {}
    node = min(stuck)
    while node not in seen:
        seen[node] = len(path)
        wait = _waits(schedules, node, stuck)
        if wait is None:  # never: a unit the run left waits for another it left
            return ScheduleHangError(f"the schedule would hang: {node[1]} on rank {node[0]} never runs; reorder "
                                     f"the actions, or use a built-in schedule", [node])
        path.append((node, wait))
        node = wait.node
    cycle = path[seen[node]:]
    first = min(range(len(cycle)), key=lambda k: cycle[k][0])  # the same cycle is named the same way
    cycle = cycle[first:] + cycle[:first]
    lines = [f"{waiter[1]} on rank {waiter[0]} waits for {_label(units, wait.node)}: it {wait.reason}"
             for waiter, wait in cycle]
    members = [waiter for waiter, _ in cycle]
    ranks = sorted({rank for rank, _ in members})
    microbatches = sorted({unit.action.microbatch for unit in (units[m] for m in members) if unit.action is not None})
    turns = [(waiter, wait) for waiter, wait in cycle if wait.reason.startswith("runs after")]
    turn = next(((a, w) for a, w in turns if units[a].action and units[w.node].action), None)
    waiter, wait = turn or (turns[0] if turns else cycle[0])
    fix = f"move {waiter[1]} before {wait.node[1]} on rank {waiter[0]}"
    message = (f"the schedule would hang: ranks {', '.join(map(str, ranks))} wait on each other in a cycle "
               f"(microbatches {', '.join(map(str, microbatches)) or '-'}):\n  "
               + "\n  ".join(lines)
               + f"\nno rank can go on, so no rank would finish its step. Reorder the actions so that each comes "
                 f"after all it waits for (here: {fix}, or break the cycle elsewhere), or use a built-in schedule")
    return ScheduleHangError(message, members)


def _label(units: Mapping[NodeId, Unit], uid: NodeId) -> str:
    unit = units[uid]
    what = f" ({unit.message.describe()})" if unit.message is not None else ""
    return f"rank {uid[0]} {uid[1]}{what}"


def aligned_orders(schedules: Mapping[int, RankUnits], compute_group: str) -> Dict[int, List[Optional[Action]]]:
    """Every rank's compute actions on paper, one tick each (messages take none): None where a rank idles."""
    times = paper_times(schedules, lambda unit: 1.0 if unit.action is not None else 0.0)
    aligned: Dict[int, List[Optional[Action]]] = {}
    for rank, groups in schedules.items():
        row: List[Optional[Action]] = []
        for unit in groups[compute_group]:
            if unit.action is None:  # a send or a marker on the compute thread: it takes no tick
                continue
            row += [None] * (int(times[(rank, unit.name)][0]) - len(row))
            row.append(unit.action)
        aligned[rank] = row
    return aligned
