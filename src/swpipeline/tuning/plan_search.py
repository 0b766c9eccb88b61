"""How ``autoplan`` searches: score candidates by simulation, exhaustively or by local search.

``Scorer`` turns a candidate (``plan_space``) into a named ``PipelinePlan`` and simulates
it (cached). Two searches share it, and both are deterministic:

* ``exhaustive``: every candidate whose lower bound could still be within ``tolerance`` of
  the best, in increasing order of the bound; exact (it returns what trying every
  candidate would).
* ``local``: from a few starting points (the baseline, everything serial, balanced thread groups),
  steepest descent over single moves (one task to another stage, thread group or
  stream; two tasks swapping thread groups) until no move helps or the budget is spent.

Among the candidates within ``tolerance`` of the fastest, the baseline wins if it is one
of them (a change is suggested only where it is predicted to pay off); else the
simplest: fewest iterations alive, then fewest thread groups, then fewest streams, then
fewest stages within thread groups (a thread group's tasks all at one stage, where that is as
fast), then the fastest, then the first in candidate order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .overheads import EngineOverheads
from ..plan.model import PipelinePlan, PipelineTask, TaskSchedule
from .plan_space import Bounds, Candidate, TaskGraph, normalized, partitions, stage_vectors
from .sim_core import Simulation
from .sim_model import compile_plan, run_caller_group

__all__: List[str] = []


@dataclass(frozen=True)
class Space:
    """What may vary, and how names are given to thread group and stream blocks."""

    graph: TaskGraph
    tasks: Tuple[PipelineTask, ...]  # schedule keys, declaration order
    max_in_flight: int
    group_names: Tuple[str, ...]
    stream_names: Optional[Tuple[Optional[str], ...]]  # None: automatic
    search_streams: bool  # device times: streams are searched; else one stream per thread group
    ordered: Tuple[bool, ...]  # globally_ordered per task
    pinned: Tuple[Optional[str], ...] = ()  # per task: the thread group it must stay on, or None
    caller_group: Optional[str] = None  # a thread group run by the caller (clocked engine); "auto": the last stage's
    cores: Optional[int] = None  # at most this many task functions at once (see simulate)

    def groups_allowed(self, groups: Sequence[int]) -> bool:
        """Whether a thread group partition keeps every pinned task on its own group (one name per block)."""
        if not self.pinned:
            return True
        named: Dict[int, str] = {}
        for task, block in enumerate(groups):
            name = self.pinned[task]
            if name is not None and named.setdefault(block, name) != name:
                return False
        return len(set(named.values())) == len(named)


class Scorer:
    """Simulated wall time of candidates, cached; builds their plans."""

    def __init__(self, space: Space, thread_costs: Sequence[Sequence[float]],
                 device_costs: Sequence[Optional[Sequence[float]]], engine: str, overheads: EngineOverheads,
                 data_seconds: float) -> None:
        self.space, self.engine, self.overheads, self.data_seconds = space, engine, overheads, data_seconds
        self.thread_costs, self.device_costs = thread_costs, device_costs
        self.num_iterations = len(thread_costs[0])
        self.cache: Dict[Candidate, float] = {}
        self.tolerance = 0.0
        self.best = float("inf")
        group_load = [sum(c) for c in thread_costs]
        self.group_load, self.device_load = group_load, [sum(c) if c else 0.0 for c in device_costs]

    def plan(self, cand: Candidate) -> PipelinePlan:
        """The candidate as a PipelinePlan (blocks named by load, heaviest first)."""
        space = self.space
        stages, groups, streams = cand
        group_name = self._group_names(groups)
        stream_name: Dict[int, Optional[str]]
        if space.search_streams:
            pool = space.stream_names or (None,) + tuple(f"s{k}" for k in range(1, space.graph.n))
            stream_name = _names(streams, self.device_load, pool)
        else:  # one stream per thread group
            stream_name = {block: self._group_stream(name) for block, name in group_name.items()}
        schedule = {task: TaskSchedule(stage=stages[k], thread_group=group_name[groups[k]],
                                       stream=stream_name[streams[k]], globally_ordered=space.ordered[k])
                    for k, task in enumerate(space.tasks)}
        names = space.graph.names
        return PipelinePlan(schedule, [(names[t], names[d]) for t, d in space.graph.intra],
                            [(names[t], names[d], back) for t, d, back in space.graph.inter])

    def _group_names(self, groups: Sequence[int]) -> Dict[int, str]:
        """Blocks holding a pinned task get its group; the others the remaining names, heaviest first."""
        space = self.space
        names = {block: name for block, name in zip(groups, space.pinned) if name is not None}
        load: Dict[int, float] = {}
        for task, block in enumerate(groups):
            if block not in names:
                load[block] = load.get(block, 0.0) + self.group_load[task]
        pool = [name for name in space.group_names if name not in names.values()]
        for k, block in enumerate(sorted(load, key=lambda b: (-load[b], b))):
            names[block] = pool[k]
        return names

    def _group_stream(self, group: str) -> Optional[str]:
        """On the CPU: the default stream for "default", else the group's name; or the k-th allowed stream."""
        pool = self.space.stream_names
        if pool is None:
            return None if group == "default" else group
        return pool[self.space.group_names.index(group) % len(pool)]

    def seconds(self, cand: Candidate) -> float:
        found = self.cache.get(cand)
        if found is None:
            plan = self.plan(cand)
            compiled = compile_plan(plan)
            depth = max(cand[0]) + 1
            live = depth if self.engine == "clocked" else self.space.max_in_flight
            caller = run_caller_group(plan, self.engine, live, self.space.caller_group)
            caller_index = compiled.groups.index(caller) if caller in compiled.groups else None
            sim = Simulation(compiled, self.thread_costs, self.device_costs, self.num_iterations, self.engine, live,
                             self.overheads, self.data_seconds, caller_index)
            sim.run(self.space.cores, self.best * (1 + self.tolerance))  # past that it cannot be picked
            found = self.cache[cand] = sim.total
            self.best = min(self.best, found)
        return found

    def pick(self, tolerance: float, keep: Optional[Candidate] = None) -> Candidate:
        """``keep`` (the baseline) if it is within ``tolerance`` of the fastest scored so far, else the simplest
        candidate that is: a change is suggested only where it is predicted to pay off."""
        fastest = min(self.cache.values())
        if keep is not None and self.seconds(keep) <= fastest * (1 + tolerance):
            return keep
        near = [cand for cand, seconds in self.cache.items() if seconds <= fastest * (1 + tolerance)]
        return min(near, key=lambda c: (max(c[0]) + 1, max(c[1]) + 1, max(c[2]) + 1, len(set(zip(c[0], c[1]))),
                                        self.cache[c], c))


def _names(blocks: Sequence[int], load: Sequence[float], pool: Sequence[Optional[str]]) -> Dict[int, Optional[str]]:
    """Block -> name: the heaviest block gets ``pool[0]``, the next ``pool[1]``, ... (ties: first block first)."""
    per: Dict[int, float] = {}
    for task, block in enumerate(blocks):
        per[block] = per.get(block, 0.0) + load[task]
    ranked = sorted(per, key=lambda b: (-per[b], b))
    return {block: pool[k] for k, block in enumerate(ranked)}


def count_candidates(space: Space) -> int:
    """How many candidates the space holds (stopping early past 10**7)."""
    stages = len(stage_vectors(space.graph, space.max_in_flight))
    if any(name is not None for name in space.pinned) and space.graph.n <= 10:
        groups = sum(1 for g in partitions(space.graph.n, len(space.group_names)) if space.groups_allowed(g))
    else:
        groups = _count_partitions(space.graph.n, len(space.group_names))
    streams = _count_partitions(space.graph.n, len(space.stream_names or range(space.graph.n))) \
        if space.search_streams else 1
    return min(10**7, stages * groups * streams)


def _count_partitions(n: int, max_blocks: int) -> int:
    """Partitions of n items into at most max_blocks blocks (sum of Stirling numbers of the second kind)."""
    table = [[0] * (max_blocks + 1) for _ in range(n + 1)]
    table[0][0] = 1
    for i in range(1, n + 1):
        for k in range(1, max_blocks + 1):
            table[i][k] = k * table[i - 1][k] + table[i - 1][k - 1]
    return sum(table[n][1:])


def exhaustive(scorer: Scorer, bounds: Bounds, tolerance: float) -> int:
    """Score every candidate that could be within ``tolerance`` of the best; returns how many were simulated."""
    space = scorer.space
    by_depth: Dict[int, List[Tuple[int, ...]]] = {}
    for vec in stage_vectors(space.graph, space.max_in_flight):
        by_depth.setdefault(max(vec) + 1, []).append(vec)
    stream_sets: List[Tuple[int, ...]] = list(partitions(space.graph.n, len(space.stream_names or
                                                                           range(space.graph.n)))) \
        if space.search_streams else [()]
    work: List[Tuple[float, Tuple[int, ...], Tuple[int, ...], int]] = []
    for groups in partitions(space.graph.n, len(space.group_names)):
        if not space.groups_allowed(groups):
            continue
        group_bound = bounds.of_groups(groups)
        for streams in stream_sets:
            pair_bound = max(group_bound, bounds.of_streams(streams)) if streams else group_bound
            for depth in by_depth:
                work.append((max(pair_bound, bounds.of_depth(depth)), groups, streams, depth))
    work.sort()
    for bound, groups, streams, depth in work:
        if bound > scorer.best * (1 + tolerance):
            break
        for vec in by_depth[depth]:
            scorer.seconds((vec, groups, streams or groups))
    return len(scorer.cache)


def local(scorer: Scorer, starts: Sequence[Candidate], budget: int) -> int:
    """Steepest descent from each starting point over single moves; returns how many candidates were simulated."""
    for start in starts:
        current, current_s = start, scorer.seconds(start)
        while len(scorer.cache) < budget:
            best_move: Optional[Tuple[float, Candidate]] = None
            for cand in _moves(scorer.space, current):
                if len(scorer.cache) >= budget:
                    break
                seconds = scorer.seconds(cand)
                if seconds < current_s and (best_move is None or seconds < best_move[0]):
                    best_move = (seconds, cand)
            if best_move is None:
                break
            current_s, current = best_move
    return len(scorer.cache)


def _moves(space: Space, cand: Candidate) -> List[Candidate]:
    """Every candidate one move away (see the module docstring) that follows the stage rules, deduplicated."""
    stages, groups, streams = cand
    n, out = space.graph.n, []
    for k in range(n):
        for delta in (-1, 1):
            moved = list(stages)
            moved[k] += delta
            shift = min(moved)
            vec = tuple(s - shift for s in moved)
            if valid_stages(space, vec):
                out.append((vec, groups, streams))
        for block in range(min(max(groups) + 2, len(space.group_names))):
            if block != groups[k]:
                regrouped = normalized(groups[:k] + (block,) + groups[k + 1:])
                out.append((stages, regrouped, streams if space.search_streams else regrouped))
        if space.search_streams:
            for block in range(min(max(streams) + 2, len(space.stream_names or range(n)))):
                if block != streams[k]:
                    out.append((stages, groups, normalized(streams[:k] + (block,) + streams[k + 1:])))
    for a in range(n):
        for b in range(a + 1, n):
            if groups[a] != groups[b]:
                swapped = list(groups)
                swapped[a], swapped[b] = swapped[b], swapped[a]
                regrouped = normalized(swapped)
                out.append((stages, regrouped, streams if space.search_streams else regrouped))
    return [c for c in dict.fromkeys(out) if space.groups_allowed(c[1])]


def valid_stages(space: Space, stages: Tuple[int, ...]) -> bool:
    """Whether ``stages`` fit the space (0 .. max_in_flight - 1) and follow the stage rules of its dependencies."""
    if max(stages) >= space.max_in_flight or min(stages) < 0:
        return False
    g = space.graph
    return all(stages[d] <= stages[t] for t, d in g.intra) and \
        all(stages[d] <= stages[t] + back for t, d, back in g.inter)


def starting_points(space: Space, scorer: Scorer, baseline: Optional[Candidate]) -> List[Candidate]:
    """Starting points of the local search: the baseline, everything on one thread at stage 0, balanced groups."""
    n = space.graph.n
    zero = tuple(0 for _ in range(n))
    out = [baseline] if baseline is not None else []
    out.append((zero, zero, zero))
    levels = _levels(space)
    groups = _balanced(scorer.group_load, len(space.group_names))
    if valid_stages(space, levels):
        out.append((levels, groups, groups))
    out.append((zero, groups, groups))
    return [c for c in dict.fromkeys(out) if space.groups_allowed(c[1])]


def _levels(space: Space) -> Tuple[int, ...]:
    """Each task's longest chain of intra-iteration dependencies, capped at max_in_flight - 1."""
    level = [0] * space.graph.n
    for task in space.graph.topological():
        for t, d in space.graph.intra:
            if t == task:
                level[task] = max(level[task], level[d] + 1)
    return tuple(min(v, space.max_in_flight - 1) for v in level)


def _balanced(load: Sequence[float], max_groups: int) -> Tuple[int, ...]:
    """Tasks spread over at most ``max_groups`` blocks, heaviest first onto the lightest block."""
    blocks = [0.0] * max(1, min(max_groups, len(load)))
    assign = [0] * len(load)
    for task in sorted(range(len(load)), key=lambda t: (-load[t], t)):
        block = min(range(len(blocks)), key=lambda b: (blocks[b], b))
        assign[task] = block
        blocks[block] += load[task]
    return normalized(assign)
