"""Orders derived from a plan: stage rules, the ready-first enqueue order, row and serial orders.

Everything here is a pure function of a :class:`PipelinePlan`; the engines compute
the orders once at construction.

Period, stage and iteration (clock-driven engine)::

    iter_idx = period - stage            stage 0 works on the newest batch

    period:   0     1     2     3        (depth 3: stages 0, 1, 2)
    stage 0:  i0    i1    i2    i3
    stage 1:  --    i0    i1    i2
    stage 2:  --    --    i0    i1

A dependency is *period-local* when producer and consumer of it run in the same
period: an intra-iteration pair with equal stages, or an inter-iteration one at
distance ``d`` whose producer's stage is the consumer's plus ``d`` (iteration ``i - d``
at stage ``s + d`` runs in period ``i + s``). Only those edges constrain the order
inside a period; every other dependency was produced in an earlier period.
"""

from __future__ import annotations

import bisect
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .model import PipelinePlan

__all__: List[str] = []


def validate_stages(plan: PipelinePlan) -> None:
    """Check the two stage rules, which make every valid plan deadlock-free.

    * An intra-iteration dependency is at the same or an earlier stage than its task
      (a later stage would run in a later period: the task would wait for it forever).
    * An inter-iteration dependency at distance ``d`` (its task at iteration ``i`` needs it
      at iteration ``i - d``) is at most ``d`` stages later than its task: it then runs in
      the same period as the task, or earlier.

    Raises:
        ValueError: a dependency that breaks one of the rules, naming both tasks and the fix.
    """
    for task, deps in plan.intra.items():
        for dep in deps:
            if plan.stage(dep) > plan.stage(task):
                raise ValueError(
                    f"intra_iter_deps: {task!r} (stage {plan.stage(task)}) depends on {dep!r} "
                    f"(stage {plan.stage(dep)}); a dependency's stage must be <= the task's stage "
                    f"(a later stage runs in a later period: {task!r} would wait for it forever). Raise "
                    f"{task!r}'s stage, lower {dep!r}'s, or use inter_iter_deps if {task!r} needs iteration i-1"
                )
    for task, backs in plan.inter.items():
        for dep, distance in backs:
            gap = plan.stage(dep) - plan.stage(task)
            if gap > distance:
                of = "the previous iteration" if distance == 1 else f"iteration i-{distance}"
                raise ValueError(
                    f"inter_iter_deps: {task!r} (stage {plan.stage(task)}) depends on {dep!r} "
                    f"(stage {plan.stage(dep)}) of {of}; the stage gap is {gap} > {distance}, so {dep!r} of "
                    f"iteration i-{distance} would run in a later period than {task!r} of iteration i, which "
                    f"would wait for it forever. A dependency at distance d may be at most d stages later than "
                    f"its task: reduce the gap to <= {distance}, or, if {task!r} may use an older result of "
                    f"{dep!r}, declare ({task!r}, {dep!r}, {gap}) in inter_iter_deps (for a module's weights: "
                    f"versions.deps({task!r}, {dep!r}) of a WeightVersions made with staleness={gap - 1} gives "
                    f"that triple)"
                )


def period_local_edges(plan: PipelinePlan) -> List[Tuple[str, str]]:
    """``(producer, consumer)`` pairs whose two ends run in the same period."""
    edges: List[Tuple[str, str]] = []
    for task in plan.task_names:
        for dep in plan.intra[task]:
            if plan.stage(dep) == plan.stage(task):
                edges.append((dep, task))
        for dep, distance in plan.inter[task]:
            if plan.stage(dep) == plan.stage(task) + distance:
                edges.append((dep, task))
    return edges


def stall_costs(plan: PipelinePlan, stream_of: Mapping[str, object]) -> Dict[str, int]:
    """Number of period-local in-edges coming from another stream, per task."""
    cost = {name: 0 for name in plan.task_names}
    for dep, task in period_local_edges(plan):
        if stream_of[dep] != stream_of[task]:
            cost[task] += 1
    return cost


def _levels(names: Sequence[str], edges: Sequence[Tuple[str, str]]) -> Dict[str, int]:
    """Generation of each node in Kahn's algorithm: the longest path reaching it from a source."""
    level = {n: 0 for n in names}
    for name in _priority_topo_sort(names, edges, {n: () for n in names}):
        for src, dst in edges:
            if src == name:
                level[dst] = max(level[dst], level[src] + 1)
    return level


def _priority_topo_sort(
    names: Sequence[str], edges: Sequence[Tuple[str, str]], key: Mapping[str, Tuple[int, ...]]
) -> List[str]:
    """Kahn's algorithm, always taking the ready task with the smallest ``(key, name)``."""
    successors: Dict[str, List[str]] = {n: [] for n in names}
    in_degree = {n: 0 for n in names}
    for src, dst in edges:
        successors[src].append(dst)
        in_degree[dst] += 1
    ready = sorted((key[n], n) for n in names if in_degree[n] == 0)
    order: List[str] = []
    while ready:
        _, name = ready.pop(0)
        order.append(name)
        for succ in successors[name]:
            in_degree[succ] -= 1
            if in_degree[succ] == 0:
                bisect.insort(ready, (key[succ], succ))
    if len(order) != len(names):  # unreachable for validated plans; kept as a guard
        stuck = sorted(set(names) - set(order))
        raise ValueError(f"dependency graph has a cycle through {stuck}")
    return order


def stream_orders(plan: PipelinePlan, stream_of: Mapping[str, object]) -> Dict[object, List[str]]:
    """Each stream's tasks in the order they run within a period: older iterations first.

    Stage-descending (a higher stage works on an older iteration), and within one stage
    in one linear extension of that stage's intra-iteration dependencies that takes, among
    the tasks free to go, first the one with the fewest cross-stream period-local waits
    (it cannot stall its stream), then the one declared first. Task names play no part:
    renaming tasks never changes what runs on a stream.
    """
    index = {name: k for k, name in enumerate(plan.task_names)}
    cost = stall_costs(plan, stream_of)
    orders: Dict[object, List[str]] = {}
    for stage in sorted(_stages(plan), reverse=True):
        names = [n for n in plan.task_names if plan.stage(n) == stage]
        members = set(names)
        edges = [(dep, task) for task in names for dep in plan.intra[task] if dep in members]
        key = {n: (cost[n], index[n]) for n in names}
        for name in _priority_topo_sort(names, edges, key):
            orders.setdefault(stream_of[name], []).append(name)
    return orders


def enqueue_order(plan: PipelinePlan, stream_of: Mapping[str, object]) -> List[str]:
    """The submission order of one period.

    A topological order of the period-local graph plus, for every stream, the chain of
    its tasks in ``stream_orders``: on one stream a period's older iterations always run
    first, whatever the tasks are called. Between streams only dependencies order the
    tasks; among the tasks free to go (at most one per stream), the one of the earliest
    generation (its Kahn level in the period-local graph, so that independent chains
    interleave) goes first, then the one with the fewest cross-stream period-local waits
    (the ready-first preference), then by name, so that every rank computes the same
    order. This gives the orders the tests check for the worked examples (e.g. SparseDist's
    H2D, InputDistStart, ZeroGrad, InputDistWait, WaitBatch, ...; P, Q, R, A), and never
    queues a task behind a cross-stream wait on its own stream when a task it need not
    wait for could go first.

    Why the stream chains add no cycle: every chain edge, like every period-local edge,
    goes from a higher stage to a lower one or, within a stage, along one linear extension
    of that stage's dependencies; so all edges follow the order (stage descending, position
    in that extension).
    """
    edges = period_local_edges(plan)
    chains = [(a, b) for order in stream_orders(plan, stream_of).values() for a, b in zip(order, order[1:])]
    generation = _levels(plan.task_names, edges)
    cost = stall_costs(plan, stream_of)
    key = {n: (generation[n], cost[n]) for n in plan.task_names}
    return _priority_topo_sort(plan.task_names, edges + chains, key)


def serial_order(plan: PipelinePlan) -> List[str]:
    """One iteration's tasks in a topological order of all intra deps, ties by (stage, name)."""
    edges = [(dep, task) for task in plan.task_names for dep in plan.intra[task]]
    key = {n: (plan.stage(n),) for n in plan.task_names}
    return _priority_topo_sort(plan.task_names, edges, key)


def last_stage_group(plan: PipelinePlan) -> str:
    """The thread group a pipelined ``run()`` runs on the caller's thread by default.

    It is the group of the plan's highest stage, whose units end every iteration: run by
    the caller, who retires iterations, they need no hand-off back. With several groups at
    that stage, the group of the one that comes last in the serial order.
    """
    top = max(_stages(plan))
    return [plan.schedules[n].thread_group for n in serial_order(plan) if plan.stage(n) == top][-1]


def _stages(plan: PipelinePlan) -> List[int]:
    return sorted({plan.stage(n) for n in plan.task_names})


def longest_stage_chain(plan: PipelinePlan, order: Optional[List[str]] = None) -> List[str]:
    """The longest dependency chain, read consumer to producer, whose stages strictly decrease.

    This is the "LDS" of ``print_stage_analysis``: a chain ``t_k <- ... <- t_1`` of
    intra-iteration dependencies (transitive) with ``stage(t_k) > ... > stage(t_1)``.
    Its length is the number of stage boundaries a batch really crosses in order.
    By Mirsky's theorem (the dual of Dilworth's), it is also the fewest stages into
    which the plan's "must come in a strictly later stage" relation can be layered.
    When it equals the depth, every stage boundary separates a producer from a
    consumer that needs it; when it is shorter, some stage holds a batch in flight
    without separating any dependent pair, and the depth could be reduced.
    """
    order = order if order is not None else serial_order(plan)
    best: Dict[str, List[str]] = {}
    reach = _transitive_deps(plan)

    for name in order:  # producers come first in a topological order
        direct = set(plan.intra[name])

        def rank(chain: List[str]) -> Tuple[int, bool, List[List[int]]]:
            # longer first, then through a direct dependency, then smaller names
            return len(chain), chain[0] in direct, [[-ord(ch) for ch in n] for n in chain]

        below = [best[d] for d in reach[name] if plan.stage(d) < plan.stage(name)]
        best[name] = [name] + (max(below, key=rank) if below else [])
    longest = max(len(c) for c in best.values())
    return next(best[n] for n in order if len(best[n]) == longest)  # the consumer earliest in serial order


def _transitive_deps(plan: PipelinePlan) -> Dict[str, List[str]]:
    reach: Dict[str, List[str]] = {}
    for name in serial_order(plan):
        seen: Dict[str, None] = {}
        for dep in plan.intra[name]:
            seen[dep] = None
            for d in reach[dep]:
                seen[d] = None
        reach[name] = list(seen)
    return reach
