"""Races: what orders two units of work, and the words a race is reported in.

**Happens-before.** Unit ``A(j)`` (task A on iteration j) happens before ``B(i)`` when a
chain of these edges leads from ``B(i)`` back to ``A(j)``:

* a declared intra-iteration pair ``(B, A)``: ``B(i)`` after ``A(i)``;
* a declared inter-iteration pair ``(B, A)``: ``B(i)`` after ``A(i-1)``; a triple ``(B, A, d)``:
  ``B(i)`` after ``A(i-d)``;
* a task's own iterations: ``T(i)`` after ``T(i-1)`` (a task runs on one thread group and
  one stream, and completes its iterations in order, on both engines).

Nothing else: thread groups and streams also order work (a thread group runs its units
in order; a stream runs older iterations first), but that order belongs to a placement,
not to the plan's dependencies — move a task to another thread group or stream and it is
gone. :class:`Placement` says when it holds; ``analyze`` reports a conflict ordered only by
it as a warning, and the race checker (``checker.py``) logs it (raises with ``strict=True``).

The rest of this module is the words: ``RaceError``, the conflict in a clause, and the
dependency (or stage move, or generator, or weight versions) that fixes it.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple, Union

from ..plan import ordering
from .access import DELETE, DRAW, MUTATE, READ
from ..plan.model import PipelinePlan

__all__: List[str] = []



InterDeps = Mapping[str, Iterable[Union[str, Tuple[str, int]]]]  # task -> names (i - 1) or (name, d) (i - d)


class HappensBefore:
    """The happens-before relation of a set of dependencies (see the module docstring).

    Args:
        names: the tasks.
        intra: task -> the tasks it depends on in the same iteration (a DAG).
        inter: task -> the tasks it depends on in earlier iterations: ``(name, d)`` for iteration
            ``i - d``, or a name for the previous iteration.
    """

    def __init__(self, names: Iterable[str], intra: Mapping[str, Iterable[str]],
                 inter: InterDeps) -> None:
        self.names = list(names)
        self._closure: Dict[str, Set[str]] = {}
        deps = {n: list(intra.get(n, ())) for n in self.names}
        for name in self.names:
            self._close(name, deps)
        backs: Dict[str, Set[Tuple[str, int]]] = {n: {(n, 1)} for n in self.names}  # a task's own previous one
        for name in self.names:
            backs[name] |= {(dep, 1) if isinstance(dep, str) else dep for dep in inter.get(name, ())}
        # reach[d][b]: the tasks a with b(i) after a(i - d): back through intra chains, then one inter edge
        # of distance e <= d, then what that task reaches at distance d - e. It only grows with d (a task's
        # own iterations are ordered), so once ``furthest`` layers in a row are equal every later one is too.
        reach: List[Dict[str, Set[str]]] = [{b: self._closure[b] | {b} for b in self.names}]
        furthest = max(e for found in backs.values() for _, e in found)
        while True:
            d = len(reach)
            step = {b: set().union(*(reach[d - e][y] for x in reach[0][b] for y, e in backs[x] if e <= d))
                    for b in self.names}
            reach.append(step)
            if d >= furthest and step == reach[d - furthest]:
                break
        self._back: List[Dict[str, Set[str]]] = reach[1:]  # [d - 1]: what B(i) reaches at iteration i - d

    @classmethod
    def of_plan(cls, plan: PipelinePlan) -> "HappensBefore":
        """The relation a plan's declared dependencies give."""
        return cls(plan.task_names, plan.intra, plan.inter)

    def _close(self, name: str, intra: Dict[str, List[str]]) -> Set[str]:
        found = self._closure.get(name)
        if found is None:
            found = set()
            for dep in intra[name]:
                found |= {dep} | self._close(dep, intra)
            self._closure[name] = found
        return found

    def before(self, first: str, second: str, distance: int = 0) -> bool:
        """Whether ``first`` at iteration ``i - distance`` happens before ``second`` at iteration ``i``."""
        if distance == 0:
            return first in self._closure[second]
        return first in self._back[min(distance, len(self._back)) - 1][second]


class Placement:
    """The order a plan's placement (thread groups, streams, stages) gives two units, on both engines.

    A thread group runs its units, and a stream its work, in the schedule's order: by period
    (iteration + stage), then by position in the period's submission order. Two tasks
    that share neither run in no fixed order.
    """

    def __init__(self, plan: PipelinePlan) -> None:
        self.stage = {n: plan.stage(n) for n in plan.task_names}
        self.group = {n: plan.schedules[n].thread_group for n in plan.task_names}
        self.stream: Dict[str, Any] = {n: _stream_key(plan.schedules[n].stream) for n in plan.task_names}
        self.position = {n: k for k, n in enumerate(ordering.enqueue_order(plan, self.stream))}

    def shared(self, a: str, b: str) -> Optional[str]:
        """What ``a`` and ``b`` share, in words (None: neither thread group nor stream)."""
        group, stream = self.group[a] == self.group[b], self.stream[a] == self.stream[b]
        where = stream_label(self.stream[a])
        if group and stream:
            return f"thread group {self.group[a]!r} and {where}"
        if group:
            return (f"thread group {self.group[a]!r} (not the stream: on an accelerator their kernels on "
                    f"{where} and {stream_label(self.stream[b])} are not ordered)")
        if stream:
            return f"{where} (from thread groups {self.group[a]!r} and {self.group[b]!r})"
        return None

    def before(self, first: str, second: str, distance: int = 0) -> Optional[bool]:
        """Whether the placement runs ``first(i - distance)`` before ``second(i)`` (None: it does not order them)."""
        if self.shared(first, second) is None:
            return None
        return (self.stage[first] - distance, self.position[first]) < (self.stage[second], self.position[second])


def _stream_key(spec: Any) -> Any:
    return "default" if spec is None or (isinstance(spec, str) and spec == "default") else spec


def stream_label(key: Any) -> str:
    """A stream in words: ``the default stream``, ``stream 'copy'``."""
    if isinstance(key, str):
        return "the default stream" if key == "default" else f"stream {key!r}"
    return f"stream {getattr(key, 'swp_name', None) or repr(key)!r}"


class RaceError(RuntimeError):
    """Two tasks touched one context attribute, at least one writing, or drew from one random generator, with no
    dependency ordering them.

    ``attribute`` is what they touched (``ctx.x``, ``torch.default_generator``); ``first`` and
    ``second`` are the two ``(task, iteration)`` in the order a serial run runs them.
    """

    def __init__(self, message: str, attribute: str, first: Tuple[str, int], second: Tuple[str, int]) -> None:
        super().__init__(message)
        self.attribute = attribute
        self.first = first  # (task, iteration) that a serial run runs first
        self.second = second


def stage_fix(stage: Mapping[str, int], task: str, dep: str, distance: int) -> Optional[str]:
    """How to move the stages so that ``task`` may depend on ``dep`` of ``distance`` iterations back (None: it may)."""
    if stage[dep] - distance <= stage[task]:
        return None
    limit = "the task's stage" if distance == 0 else f"the task's stage + {distance}"
    return (f"move {task} to stage {stage[dep] - distance} or later, or {dep} to stage {stage[task] + distance} or "
            f"earlier (a dependency's stage may be at most {limit})")


def dependency_fix(stage: Mapping[str, int], task: str, dep: str, distance: int) -> str:
    """The dependency to declare so that ``task(i)`` follows ``dep(i - distance)``, in words."""
    where = "intra_iter_deps" if distance == 0 else "inter_iter_deps"
    entry = f'("{task}", "{dep}")' if distance <= 1 else f'("{task}", "{dep}", {distance})'
    moves = stage_fix(stage, task, dep, distance)
    return f"add {entry} to {where}" + (f" and {moves}" if moves else "")


_DOES = {READ: "reads {}", DELETE: "deletes {}", MUTATE: "changes {} in place", DRAW: "draws from {}"}
_DID = {READ: "reads", DELETE: "deletes", MUTATE: "changes in place", DRAW: "draws from"}


def conflict_clause(first: str, first_kind: str, second: str, second_kind: str, attribute: str) -> str:
    """``'B' (iteration i) reads ctx.x, which 'A' (iteration j) writes``, from the access kinds."""
    did_a = _DID.get(first_kind, "writes")
    does_b = _DOES.get(second_kind, "writes {}").format(attribute)
    if second_kind == READ:
        return f"{second} {does_b}, which {first} {did_a}"
    if first_kind == READ:
        return f"{second} {does_b}, which {first} reads"
    return f"{second} {does_b}, which {first} also {did_a}"


def draw_hint(generator: str) -> str:
    """The other way out of a conflict on a generator: a generator of one task's own."""
    return (f"; or keep their random numbers apart: let one of the two draw from a generator of its own "
            f"(swpipeline.task_generator) instead of {generator}")


def staleness_hint(task: str, dep: str, gap: int) -> str:
    """What a placement that lets ``task`` (reading a module's weights) overlap ``dep`` (updating them) means,
    ``gap >= 1`` being ``dep``'s stage minus ``task``'s, and the way to overlap them on purpose."""
    steps = f"{gap} step{'s' if gap > 1 else ''}"
    newer = "the serial loop's" if gap == 1 else f"{gap - 1} step{'s' if gap > 2 else ''} old"
    return (f". These are a module's weights: this placement runs {task}(i+{gap}) in the same period as {dep}(i) "
            f"({dep} is {steps.replace('step', 'stage')} later), so {task}(i+{gap}) would train on weights "
            f"{steps} old, or {newer} if {dep}(i) finished first, or a mix of both if it is halfway, by "
            f"timing. The dependency gives the serial loop's answer and makes {task} wait for the step; "
            f"to overlap them on purpose, train on weights exactly {gap} step{'s' if gap > 1 else ''} old, one "
            f"version per iteration: versions = swpipeline.WeightVersions(model, staleness={gap}), the model "
            f"run under `with versions.use(ctx):` in {task}, versions.step(ctx, optimizer) in {dep}, and "
            f'versions.deps({task}, {dep}), which is ("{task}", "{dep}", {gap + 1}), in inter_iter_deps')
