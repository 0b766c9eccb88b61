"""The space ``autoplan`` searches: every valid way to give a task set stages, threads and streams.

A *candidate* is three tuples over the tasks (in declaration order): stage, thread
group block and stream block. Blocks are numbered in order of first appearance (a
restricted growth string), so that renaming groups never makes a second candidate::

    tasks      Prep  Copy  Fwd  Bwd  Opt
    stages     0     1     1    1    1        every dependency rule holds, min stage 0
    groups     0     1     1    1    1        two thread groups
    streams    0     1     1    1    1        (on the CPU: one stream per thread group)

Valid stages follow the engine's rules: an intra-iteration dependency at the same or
an earlier stage, an inter-iteration one at most one stage later; the depth (largest
stage + 1) is at most ``max_in_flight``. On the CPU a stream only orders work (tasks
never overlap on it anyway), so each thread group gets a stream of its own; with
device times, streams are searched too.

``Bounds`` gives each candidate a lower bound on its simulated wall time, so that the
exhaustive search can skip the candidates that cannot beat the best one found:

* a thread group runs its units one after the other: ``sum of its costs (+ per-unit cost)``;
* a stream likewise runs its device work one piece after the other;
* at most ``D`` iterations are alive, and each takes at least its longest dependency chain
  from release to retirement: iterations ``r, r + D, r + 2D, ...`` run one after another;
* with ``cores``, all the tasks' work shares that many cores;
* an inter-iteration dependency closing a chain of intra ones (``F(i)`` needs ``O(i-1)``, and
  ``O`` comes after ``F``) repeats that chain once per iteration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Hashable, Iterator, List, Optional, Sequence, Tuple

__all__: List[str] = []

Candidate = Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]  # (stages, group blocks, stream blocks)


@dataclass(frozen=True)
class TaskGraph:
    """The tasks (declaration order) and their dependencies, as indices."""

    names: Tuple[str, ...]
    intra: Tuple[Tuple[int, int], ...]  # (task, depends_on), same iteration
    inter: Tuple[Tuple[int, int, int], ...]  # (task, depends_on at i - d, d)

    @property
    def n(self) -> int:
        return len(self.names)

    def intra_names(self) -> Dict[str, List[str]]:
        """Task -> the tasks it depends on in its iteration, by name."""
        found: Dict[str, List[str]] = {name: [] for name in self.names}
        for task, dep in self.intra:
            found[self.names[task]].append(self.names[dep])
        return found

    def inter_names(self) -> Dict[str, List[Tuple[str, int]]]:
        """Task -> ``(depends_on, d)``: it depends on that task at iteration ``i - d``, by name."""
        found: Dict[str, List[Tuple[str, int]]] = {name: [] for name in self.names}
        for task, dep, back in self.inter:
            found[self.names[task]].append((self.names[dep], back))
        return found

    def topological(self) -> List[int]:
        """The tasks in an order where every intra-iteration dependency comes first (ties: declaration order)."""
        deps: Dict[int, List[int]] = {t: [] for t in range(self.n)}
        for task, dep in self.intra:
            deps[task].append(dep)
        order: List[int] = []
        placed = set()
        while len(order) < self.n:
            task = next(t for t in range(self.n) if t not in placed and all(d in placed for d in deps[t]))
            order.append(task)
            placed.add(task)
        return order


def stage_vectors(graph: TaskGraph, max_in_flight: int) -> List[Tuple[int, ...]]:
    """Every stage assignment that follows the stage rules, with stages 0 .. max_in_flight-1 and a task at 0."""
    order = graph.topological()
    intra_deps: Dict[int, List[int]] = {t: [] for t in range(graph.n)}
    inter_pairs: Dict[int, List[Tuple[int, int, int]]] = {t: [] for t in range(graph.n)}
    for task, dep in graph.intra:
        intra_deps[task].append(dep)
    for task, dep, back in graph.inter:  # stage[dep] <= stage[task] + back, checked once both are placed
        inter_pairs[task].append((task, dep, back))
        inter_pairs[dep].append((task, dep, back))
    out: List[Tuple[int, ...]] = []
    stages = [-1] * graph.n

    def place(k: int) -> None:
        if k == graph.n:
            if min(stages) == 0:
                out.append(tuple(stages))
            return
        task = order[k]
        low = max((stages[d] for d in intra_deps[task]), default=0)  # placed already: topological order
        for stage in range(low, max_in_flight):
            stages[task] = stage
            if all(stages[t] < 0 or stages[d] < 0 or stages[d] <= stages[t] + back
                   for t, d, back in inter_pairs[task]):
                place(k + 1)
        stages[task] = -1

    place(0)
    return sorted(out)


def partitions(n: int, max_blocks: int) -> Iterator[Tuple[int, ...]]:
    """Every partition of ``n`` items into at most ``max_blocks`` blocks, as restricted growth strings."""
    blocks = [0] * n

    def grow(k: int, used: int) -> Iterator[Tuple[int, ...]]:
        if k == n:
            yield tuple(blocks)
            return
        for b in range(min(used + 1, max_blocks)):
            blocks[k] = b
            yield from grow(k + 1, max(used, b + 1))

    if n:
        yield from grow(0, 0)


def normalized(blocks: Sequence[Hashable]) -> Tuple[int, ...]:
    """``blocks`` (any labels) renumbered in order of first appearance."""
    seen: Dict[Hashable, int] = {}
    return tuple(seen.setdefault(b, len(seen)) for b in blocks)


class Bounds:
    """Lower bounds on a candidate's simulated wall time (see the module docstring).

    Args:
        graph: the tasks and dependencies.
        thread_costs: per task, its thread time in each simulated iteration.
        device_costs: per task, its device time in each iteration, or None.
        unit: the engine's cost per unit (added to every unit on its thread).
        live: the data-flow engine's max_depth, or None for the clocked engine (the depth then bounds).
        cores: at most this many task functions at once, or None.
    """

    def __init__(self, graph: TaskGraph, thread_costs: Sequence[Sequence[float]],
                 device_costs: Sequence[Optional[Sequence[float]]], unit: float, live: Optional[int],
                 cores: Optional[int] = None) -> None:
        self.graph, self.live = graph, live
        self.load = [sum(c) + unit * len(c) for c in thread_costs]  # each task's total thread time
        self.shared = sum(sum(c) for c in thread_costs) / cores if cores else 0.0  # all work on the cores
        self.device_load = [sum(c) if c is not None else 0.0 for c in device_costs]
        num_iterations = len(thread_costs[0]) if thread_costs else 0
        chains = [self._longest_chain([c[i] for c in thread_costs]) for i in range(num_iterations)]
        self.chains = chains
        self.recurrence = self._recurrence(thread_costs)

    def _longest_chain(self, cost: Sequence[float]) -> float:
        finish: Dict[int, float] = {}
        deps: Dict[int, List[int]] = {t: [] for t in range(self.graph.n)}
        for task, dep in self.graph.intra:
            deps[task].append(dep)
        for task in self.graph.topological():
            finish[task] = cost[task] + max((finish[d] for d in deps[task]), default=0.0)
        return max(finish.values(), default=0.0)

    def _recurrence(self, thread_costs: Sequence[Sequence[float]]) -> float:
        """The largest chain ``t -> ... -> d`` (intra) closed by ``t(i)`` needing ``d(i-k)``, over all iterations,
        per iteration it spans (divided by ``k``)."""
        graph, best = self.graph, 0.0
        deps: Dict[int, List[int]] = {t: [] for t in range(graph.n)}
        for task, dep in graph.intra:
            deps[task].append(dep)
        order = graph.topological()
        for task, dep, back in graph.inter:
            total = 0.0
            for i in range(len(thread_costs[0]) if thread_costs else 0):
                reach: Dict[int, float] = {}
                for t in order:  # longest path from `task` to each t, through intra dependencies
                    via = [reach[d] for d in deps[t] if d in reach]
                    if t == task:
                        reach[t] = thread_costs[t][i]
                    elif via:
                        reach[t] = max(via) + thread_costs[t][i]
                if dep not in reach:
                    total = 0.0
                    break
                total += reach[dep]
            best = max(best, total / back)
        return best

    def of_groups(self, groups: Sequence[int]) -> float:
        """The busiest thread group's total time."""
        per: Dict[int, float] = {}
        for task, block in enumerate(groups):
            per[block] = per.get(block, 0.0) + self.load[task]
        return max(max(per.values(), default=0.0), self.recurrence, self.shared)

    def of_streams(self, streams: Sequence[int]) -> float:
        """The busiest stream's total device time."""
        per: Dict[int, float] = {}
        for task, block in enumerate(streams):
            per[block] = per.get(block, 0.0) + self.device_load[task]
        return max(per.values(), default=0.0)

    def of_depth(self, depth: int) -> float:
        """Iterations ``r, r + D, ...`` one after another, each at least its longest chain (D: iterations alive)."""
        alive = self.live if self.live is not None else depth
        return max((sum(self.chains[r::alive]) for r in range(min(alive, len(self.chains)))), default=0.0)
