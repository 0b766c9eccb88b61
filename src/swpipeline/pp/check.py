"""The whole pipeline's step, proved on paper before any rank sends: sends matched, no deadlock.

Every rank builds every rank's units (``units.py``) from the configuration, then
``prove`` runs the rule the engines run on one rank (``Schedule.check``: each thread group
a FIFO, a unit runs once the unit before it in its group and its dependencies are done)
over all ranks at once, with one more rule for what crosses ranks: a send and its
receive happen together, once both are at the head of their groups and the send's value
is made. Running a unit never stops another from running, so the step completes for
every timing if and only if it completes in one maximal run; that run is a topological
sort of the graph whose nodes are the units (a send and its receive one node) and whose
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

NodeId = Tuple[int, str]  # (rank, unit name); a matched send and receive are one node, named by the send


class Wait(NamedTuple):
    """One "waits for" edge, between the units it joins (a node may be two units: a send and its receive)."""

    node: NodeId  # the node waited for
    waiter: NodeId  # the unit that waits
    waited: NodeId  # the unit it waits for
    reason: str


class Graph(NamedTuple):
    units: Dict[NodeId, Unit]  # every unit, by (rank, name)
    node_of: Dict[NodeId, NodeId]  # unit -> its node
    waits: Dict[NodeId, List[Wait]]  # node -> what it waits for
    partner: Dict[NodeId, NodeId]  # a receive -> its send, a send -> its receive


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
    partner: Dict[NodeId, NodeId] = {}
    for key, found in sorted(ends.items()):
        if set(found) != {"send", "recv"}:
            raise ScheduleHangError(_unmatched(key, found, units), [found.get("send") or found["recv"]])
        partner[found["send"]], partner[found["recv"]] = found["recv"], found["send"]
    node_of = {uid: (partner[uid] if unit.role == "recv" else uid) for uid, unit in units.items()}
    waits: Dict[NodeId, List[Wait]] = {node: [] for node in set(node_of.values())}
    for rank, groups in schedules.items():
        for group, group_units in groups.items():
            for k, unit in enumerate(group_units):
                me = (rank, unit.name)
                if k:
                    before = (rank, group_units[k - 1].name)
                    waits[node_of[me]].append(Wait(node_of[before], me, before,
                                                   f"runs after it on rank {rank}'s {group} thread"))
                for dep in unit.deps:
                    waits[node_of[me]].append(Wait(node_of[(rank, dep)], me, (rank, dep), "needs it"))
    return Graph(units, node_of, waits, partner)


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
    waiting = {node: {w.node for w in ws} - {node} for node, ws in graph.waits.items()}
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
    return {uid: (end[node] - cost(graph.units[node]), end[node]) for uid, node in graph.node_of.items()}


def _hang(graph: Graph, stuck: Set[NodeId]) -> ScheduleHangError:
    """The error for a cycle among the ``stuck`` nodes (each of which waits for another stuck one)."""
    path: List[Wait] = []
    seen: Dict[NodeId, int] = {}
    node = min(stuck)
    while node not in seen:
        seen[node] = len(path)
        wait = next(w for w in graph.waits[node] if w.node in stuck and w.node != node)
        path.append(wait)
        node = wait.node
    cycle = path[seen[node]:]
    lines: List[str] = []
    for k, wait in enumerate(cycle):
        lines.append(_describe(graph, wait))
        following = cycle[(k + 1) % len(cycle)]
        if following.waiter != wait.waited:  # through a matched send and receive: say how they join
            lines.append(_joined(graph, wait.waited, following.waiter))
    members = [w.waiter for w in cycle]
    ranks = sorted({rank for rank, _ in members})
    microbatches = sorted({graph.units[m].action.microbatch for m in members  # type: ignore[union-attr]
                           if graph.units[m].action is not None})
    turns = [w for w in cycle if w.reason.startswith("runs after")]
    turn = next((w for w in turns if graph.units[w.waiter].action and graph.units[w.waited].action), None)
    turn = turn or (turns[0] if turns else cycle[0])
    fix = f"move {turn.waiter[1]} before {turn.waited[1]} on rank {turn.waiter[0]}"
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


def _describe(graph: Graph, wait: Wait) -> str:
    return f"{wait.waiter[1]} on rank {wait.waiter[0]} waits for {_label(graph, wait.waited)}: it {wait.reason}"


def _joined(graph: Graph, a: NodeId, b: NodeId) -> str:
    """How unit ``a`` (a send or a receive) and unit ``b`` (its partner) are one rendezvous."""
    send, recv = (a, b) if graph.units[a].role == "send" else (b, a)
    return (f"{recv[1]} on rank {recv[0]} happens only together with {send[1]} on rank {send[0]} (a message is "
            f"received as it is sent)")


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
