"""The whole pipeline's step, proved on paper before any rank sends: sends matched, no deadlock.

Every rank builds every rank's units (``units.py``) from the configuration, then
``prove`` runs the rule the engines run on one rank (``Schedule.check``: each thread group
a FIFO, a unit runs once the unit before it in its group and its dependencies are done)
over all ranks at once, with one more dependency for what crosses ranks: a receive waits
for its send (a send is posted and never waits). Running a unit never stops another from
running, so the step completes for every timing if and only if it completes in one maximal
run; that run is a topological sort of the graph whose nodes are the units and whose
edges are "waits for". A cycle is a hang: the error names it, unit by unit, with the
ranks, the microbatches and what each unit waits for.

The same graph, with a cost per unit, gives each unit's start and end on paper
(``paper_times``): the side-by-side table of ``print_schedule`` (every compute action one
tick) and, with measured costs, the step time of ``simulate``.

This module proves several ranks' schedules with a rule of its own. The engine is being
given one interpreter for several schedules with dependencies between them; once it
lands, ``prove`` should hand the ranks' plans to it instead (its signature stays).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Set, Tuple

from .actions import Action
from .errors import ScheduleHangError
from .units import ChannelKey, RankUnits, Unit

__all__: List[str] = []

NodeId = Tuple[int, str]  # (rank, unit name)


class Wait(NamedTuple):
    """One "waits for" edge."""

    node: NodeId  # the unit waited for
    reason: str


class Graph(NamedTuple):
    units: Dict[NodeId, Unit]  # every unit, by (rank, name)
    waits: Dict[NodeId, List[Wait]]  # unit -> what it waits for


def build_graph(schedules: Mapping[int, RankUnits]) -> Graph:
    """The "waits for" graph of every rank's units; raises ScheduleHangError for an unmatched send or receive."""
    units: Dict[NodeId, Unit] = {}
    ends: Dict[ChannelKey, Dict[str, NodeId]] = {}
    for rank, groups in schedules.items():
        for group_units in groups.values():
            for unit in group_units:
                units[(rank, unit.name)] = unit
                if unit.channel is not None:
                    ends.setdefault(unit.channel, {})[unit.role] = (rank, unit.name)
    waits: Dict[NodeId, List[Wait]] = {uid: [] for uid in units}
    for key, found in sorted(ends.items()):
        if set(found) != {"send", "recv"}:
            raise ScheduleHangError(_unmatched(key, found, units), [found.get("send") or found["recv"]])
        waits[found["recv"]].append(Wait(found["send"], f"is received once rank {found['send'][0]} sends it"))
    for rank, groups in schedules.items():
        for group, group_units in groups.items():
            for k, unit in enumerate(group_units):
                me = (rank, unit.name)
                waits[me] += [Wait((rank, dep), "needs it") for dep in unit.deps]
                if k:  # listed last: where it also needs the unit before it, "needs it" is what the error says
                    waits[me].append(Wait((rank, group_units[k - 1].name),
                                          f"runs after it on rank {rank}'s {group} thread"))
    return Graph(units, waits)


def _unmatched(key: ChannelKey, found: Mapping[str, NodeId], units: Mapping[NodeId, Unit]) -> str:
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


Times = Dict[NodeId, Tuple[float, float]]  # unit -> (start, end) on paper


def paper_times(schedules: Mapping[int, RankUnits], cost: Callable[[Unit], float]) -> Times:
    """Each unit's start and end when every unit starts as soon as all it waits for has ended.

    Raises:
        ScheduleHangError: as ``prove``.
    """
    graph = build_graph(schedules)
    waiting = {node: {w.node for w in ws} for node, ws in graph.waits.items()}
    users: Dict[NodeId, List[NodeId]] = {node: [] for node in graph.waits}
    for node, deps in waiting.items():
        for dep in deps:
            users[dep].append(node)
    left = {node: len(deps) for node, deps in waiting.items()}
    ready = sorted(node for node, count in left.items() if count == 0)
    end: Dict[NodeId, float] = {}
    while ready:
        node = ready.pop()
        start = max((end[dep] for dep in waiting[node]), default=0.0)
        end[node] = start + cost(graph.units[node])
        for user in users[node]:
            left[user] -= 1
            if left[user] == 0:
                ready.append(user)
    if len(end) < len(waiting):
        raise _hang(graph, {node for node in waiting if node not in end})
    return {node: (end[node] - cost(graph.units[node]), end_time) for node, end_time in end.items()}


def _hang(graph: Graph, stuck: Set[NodeId]) -> ScheduleHangError:
    """The error for a cycle among the ``stuck`` units (each of which waits for another stuck one)."""
    path: List[Tuple[NodeId, Wait]] = []
    seen: Dict[NodeId, int] = {}
    node = min(stuck)
    while node not in seen:
        seen[node] = len(path)
        wait = next(w for w in graph.waits[node] if w.node in stuck)
        path.append((node, wait))
        node = wait.node
    cycle = path[seen[node]:]
    lines = [f"{waiter[1]} on rank {waiter[0]} waits for {_label(graph, wait.node)}: it {wait.reason}"
             for waiter, wait in cycle]
    members = [waiter for waiter, _ in cycle]
    ranks = sorted({rank for rank, _ in members})
    microbatches = sorted({unit.action.microbatch for unit in (graph.units[m] for m in members)
                           if unit.action is not None})
    turns = [(waiter, wait) for waiter, wait in cycle if wait.reason.startswith("runs after")]
    turn = next(((a, w) for a, w in turns if graph.units[a].action and graph.units[w.node].action), None)
    waiter, wait = turn or (turns[0] if turns else cycle[0])
    fix = f"move {waiter[1]} before {wait.node[1]} on rank {waiter[0]}"
    message = (f"the schedule would hang: ranks {', '.join(map(str, ranks))} wait on each other in a cycle "
               f"(microbatches {', '.join(map(str, microbatches)) or '-'}):\n  "
               + "\n  ".join(lines)
               + f"\nno rank can go on, so no rank would finish its step. Reorder the actions so that each comes "
                 f"after all it waits for (here: {fix}, or break the cycle elsewhere), or use a built-in schedule")
    return ScheduleHangError(message, members)


def _label(graph: Graph, uid: NodeId) -> str:
    unit = graph.units[uid]
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
