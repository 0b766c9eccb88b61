"""Races on the context: what orders two units of work, and a checker that raises on what does not.

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
gone. :class:`Placement` says when it holds; :mod:`analysis` reports a conflict ordered
only by it as a warning, and :class:`RaceChecker` logs it (raises with ``strict=True``).

**The checker** wraps task functions: each call runs on a recording view of its context
that notes every attribute read, write and delete with the (task, iteration) making it,
every value read that the call changed in place (``inplace.py``: a write), a look at
every attribute at once (``vars(ctx)`` iterated or copied: a read of each), and, through a
dispatch mode on the calling thread only, every generator a random operator drew from
(``generators.py``). Two accesses to one attribute conflict when one of them writes (or
deletes); two draws from one generator always conflict, in any two iterations. A
conflict that no happens-before chain orders raises :class:`RaceError` in the task making
the second access, naming both tasks, the attribute or generator and both iterations.

**The verdict does not depend on timing.** Each access is first appended to its log, then
compared with everything already there (appends are atomic under the GIL), so of two
conflicting accesses the later one always sees the earlier, whichever it is: a missing
dependency on an attribute is reported on the first iteration in which both tasks touch
it, even when the run happened to order them correctly. A generator's log keeps, per
task, its last few iterations; comparing a draw with another task's latest one is enough
to find a race, since that task's earlier draws happen before its latest. A context for
an iteration number the checker has already seen starts a new run, which empties the
generator logs.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Set, Tuple, Union


from ..plan import ordering
from .access import DELETE, DRAW, MUTATE, READ, pop, push
from .checked_call import EVERY, Access, CheckedJournal, CheckedView, Log, Unit, new_view, set_journal
from .generators import GeneratorKey, generator_name, named_generators
from .naming import find_roots
from ..plan.model import IterContext, PipelinePlan, PipelineTask

__all__: List[str] = []

logger = logging.getLogger("swpipeline")

_DRAWS_KEPT = 8  # iterations of draws kept per task and generator (the latest alone would find every race)



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


class RaceChecker:
    """Checks every context access and every draw of the wrapped task functions against a plan's dependencies.

    Args:
        plan: the plan whose tasks are wrapped; its dependencies define happens-before.
        strict: also raise for a conflict that only the placement orders (the same thread
            group or stream), instead of logging it once as a warning.

    Raises:
        TypeError: ``plan`` is not a PipelinePlan.
        ValueError: the plan breaks a stage rule.

    What it sees: context attributes read, written, deleted or changed in place (a tensor's
    version counter, a container's items), and draws from the default generators and from
    explicit generators the task functions reach. Overhead: a recording view and a
    dispatch mode per task call, a few microseconds per context access, and a Python call
    per torch operator while a task runs: for tests.
    """

    def __init__(self, plan: PipelinePlan, *, strict: bool = False) -> None:
        if not isinstance(plan, PipelinePlan):
            raise TypeError(f"RaceChecker: plan must be a PipelinePlan, got {type(plan).__name__}")
        ordering.validate_stages(plan)
        self.plan = plan
        self.strict = strict
        self._names = plan.task_names
        self._index = {name: k for k, name in enumerate(self._names)}
        self._serial = {name: k for k, name in enumerate(ordering.serial_order(plan))}
        self._happens_before = HappensBefore.of_plan(plan)
        self._placement = Placement(plan)
        self._logs: Dict[int, Tuple["weakref.ref[IterContext]", Log]] = {}  # by id(ctx)
        self._lock = threading.RLock()  # _draw reports (and may warn) while holding it
        self._sweep_at = 64  # the number of logs at which those of dead contexts are dropped
        self._warned: Set[Tuple[str, str, int, str]] = set()
        self._verdicts: Dict[Tuple[int, int, int], bool] = {}
        self._newest = -1  # the highest iteration a context was first seen for: a lower one starts a new run
        self._draws: Dict[str, Dict[int, Dict[int, None]]] = {}  # generator -> task -> its last iterations
        self._generators: Optional[Dict[int, str]] = None  # explicit generators the task functions reach, by address
        self._kept: List[Any] = []  # those generators, alive, so that their addresses stay theirs
        self.warnings: List[str] = []  # conflicts only the placement orders, once each

    def wrap(self, task: Union[PipelineTask, str],
             fn: Optional[Callable[[IterContext], Any]] = None) -> Callable[[IterContext], Any]:
        """``fn`` (by default the task's own function) with every context access and draw checked.

        Args:
            task: the plan's task (or its name) the accesses are attributed to.
            fn: what to call instead of ``task.fn``, e.g. the engine's shortcut executor.

        Returns:
            A function of the IterContext that calls ``fn`` on a recording view of it.

        Raises:
            ValueError: ``task`` is not in the plan.
            TypeError: ``fn`` is not callable.
        """
        name = task.name if isinstance(task, PipelineTask) else task
        if name not in self._index:
            raise ValueError(f"RaceChecker.wrap: unknown task {name!r}; the plan's tasks are {self._names}")
        run = fn if fn is not None else self.plan.task(name).fn
        if not callable(run):
            raise TypeError(f"RaceChecker.wrap: fn for {name!r} must be callable, got {type(run).__name__}")
        index = self._index[name]

        def checked(ctx: IterContext) -> Any:
            found = self._logs.get(id(ctx))
            log = found[1] if found is not None and found[0]() is ctx else self._log_of(ctx)
            journal = CheckedJournal(ctx, self, log, (index, ctx.iter_idx))
            view = new_view(CheckedView)
            set_journal(view, journal)  # CheckedView(journal), without a Python call
            push(journal)  # it sees the draws of this call, on this thread
            try:
                result = run(view)
            finally:
                pop(None)
            if journal.values is not None:
                journal.finish()
            return result

        checked.__name__ = f"race_checked_{name}"
        return checked

    def _log_of(self, ctx: IterContext) -> Log:
        """The access log of one context, made when the context is first seen; it goes some time after the context
        does (dead contexts are swept whenever the number of logs has doubled)."""
        with self._lock:
            found = self._logs.get(id(ctx))
            if found is None or found[0]() is not ctx:
                if len(self._logs) >= self._sweep_at:
                    self._logs = {k: v for k, v in self._logs.items() if v[0]() is not None}
                    self._sweep_at = max(64, 2 * len(self._logs))
                found = self._logs[id(ctx)] = (weakref.ref(ctx), {})
                if ctx.iter_idx <= self._newest:  # contexts are first seen in iteration order within a run
                    self._draws.clear()
                self._newest = ctx.iter_idx
            return found[1]

    def _compare(self, log: Log, attr: Any, entries: List[Access], access: Access) -> None:
        """Raise (or warn) for each logged access that conflicts with ``access`` and is not ordered with it.

        ``entries`` is the log of ``attr`` (``access`` is in it); a write is also compared with
        the looks at every attribute (``EVERY``), and such a look with every write.
        """
        if attr is EVERY:
            for name, others in list(log.items()):
                if name is not EVERY:
                    self._compare(log, name, others, (access[0], READ))
            return
        unit, kind = access
        verdicts = self._verdicts
        for other, other_kind in entries:
            if other == unit or (kind == READ and other_kind == READ):
                continue
            verdict = verdicts.get((other[0], unit[0], unit[1] - other[1]))
            if verdict is None:
                verdict = self._ordered(other, unit)
            if not verdict:
                first, second = (other, other_kind), access
                if self._raises(other, unit):
                    first, second = self._earliest((a, b) for k, a in enumerate(entries) for b in entries[k + 1:]
                                                   if a[0] != b[0] and (a[1] != READ or b[1] != READ))
                self._report(f"ctx.{attr}", first, second)
        if kind != READ and EVERY in log:
            for other, _ in log[EVERY]:
                if other != unit and not self._ordered(other, unit):
                    self._report(f"ctx.{attr}", (other, READ), access)

    def _draw(self, key: GeneratorKey, unit: Unit) -> None:
        """Log a draw from a generator; compare it with every other task's draws in the iterations around it."""
        if isinstance(key, int) and self._generators is None:
            found = named_generators(find_roots([t.fn for t in self.plan.tasks], {}))
            self._kept = [g for _, g in found.values()]
            self._generators = {k: name for k, (name, _) in found.items()}
        generator = generator_name(key, self._generators or {})
        if generator is None:
            return
        task, iteration = unit
        with self._lock:
            by_task = self._draws.setdefault(generator, {})
            mine = by_task.setdefault(task, {})
            if iteration in mine:
                return
            mine[iteration] = None
            if len(mine) > _DRAWS_KEPT:
                del mine[next(iter(mine))]
            for other, seen in list(by_task.items()):
                if other == task:
                    continue
                for j in (iteration, iteration - 1, iteration + 1, next(reversed(seen))):
                    if j in seen and not self._ordered((other, j), unit):
                        pair = ((other, j), DRAW), (unit, DRAW)
                        if self._raises((other, j), unit):
                            pair = self._earliest((((other, k), DRAW), ((task, i), DRAW)) for i in mine for k in seen)
                        self._report(generator, *pair)

    def _serial_rank(self, unit: Unit) -> Tuple[int, int]:
        """Where a serial run reaches ``unit``: its iteration, then its task's place in the serial order."""
        return unit[1], self._serial[self._names[unit[0]]]

    def _raises(self, one: Unit, other: Unit) -> bool:
        """Whether ``_report`` raises for two unordered units (not: only the placement orders them)."""
        first, second = sorted((one, other), key=self._serial_rank)
        placed = self._placement.before(self._names[first[0]], self._names[second[0]], second[1] - first[1])
        return self.strict or not placed

    def _earliest(self, pairs: Iterable[Tuple[Access, Access]]) -> Tuple[Access, Access]:
        """Of ``pairs`` of conflicting accesses logged so far (one of which races), the racing pair a serial run
        reaches first. A race found at one access is reported as this pair: two threads that find races on one
        attribute or generator at about the same time (one task's draw of iteration i against the other's of
        i + 1, and a draw of i + 2 against i) then report the same one, whichever reports first."""
        racing = [(a, b) for a, b in pairs if not self._ordered(a[0], b[0]) and self._raises(a[0], b[0])]
        return min(racing, key=lambda pair: sorted(map(self._serial_rank, (pair[0][0], pair[1][0]))))

    def _ordered(self, one: Unit, other: Unit) -> bool:
        """Whether happens-before orders two units (either way); remembered per (task, task, iteration distance)."""
        key = (one[0], other[0], other[1] - one[1])
        verdict = self._verdicts.get(key)
        if verdict is None:
            first, second = sorted((one, other), key=self._serial_rank)
            verdict = self._verdicts[key] = self._happens_before.before(
                self._names[first[0]], self._names[second[0]], second[1] - first[1])
        return verdict

    def _report(self, attribute: str, one: Access, other: Access) -> None:
        """Raise for two conflicting accesses that happens-before does not order (or warn, see the class)."""
        (first, first_kind), (second, second_kind) = sorted((one, other), key=lambda a: self._serial_rank(a[0]))
        a, b = self._names[first[0]], self._names[second[0]]
        distance = second[1] - first[1]
        clause = conflict_clause(f"{a!r} (iteration {first[1]})", first_kind, f"{b!r} (iteration {second[1]})",
                                 second_kind, attribute)
        fix = dependency_fix(self._placement.stage, b, a, distance) + (
            draw_hint(attribute) if first_kind == DRAW else "")
        placed = self._placement.before(a, b, distance)
        if placed and not self.strict:
            key = (a, b, min(distance, 2), attribute)
            with self._lock:
                if key in self._warned:
                    return
                self._warned.add(key)
                shared = self._placement.shared(a, b)
                message = (f"{clause}; only the placement orders the two (both on {shared}), so another thread "
                           f"group or stream would race: {fix}")
                self.warnings.append(message)
            logger.warning("swpipeline race check: %s", message)
            return
        runs_first = f"; this placement runs {b!r} first" if placed is False else ""
        raise RaceError(f"race on {attribute}: {clause}, and no declared dependency orders the two (a serial run "
                        f"runs {a!r} first{runs_first}): {fix}", attribute, (a, first[1]), (b, second[1]))

