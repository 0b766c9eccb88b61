"""The race checker: every access of the wrapped task functions, checked against a plan's dependencies.

**What it sees.** Each call of a wrapped task runs on a recording view of its context
(``checked_call.py``) that notes every attribute read, write and delete with the (task,
iteration) making it, a look at every attribute at once (``vars(ctx)`` iterated or copied:
a read of each), and, through a dispatch mode on the calling thread only, what the call's
torch operators touch:

* memory they write is a write of every context attribute covering it, whatever name the
  task wrote it through (``inplace.py``, ``memory.py``), and a container read and changed
  in place is a write of its attribute;
* the named state the task functions reach (parameters, buffers, gradients, optimizer
  state, tensors: ``naming.state_index``, rebuilt for each new iteration), read or written
  by an operator, and every generator a random operator draws from, are logged in a
  ``SharedLog``: shared by every iteration, they conflict across iterations.

Two accesses conflict when one of them writes (or deletes, or draws). A conflict that no
happens-before chain orders (``races.HappensBefore``) raises :class:`RaceError` in the
task making the second access, naming both tasks, what they touched and both iterations;
one only the placement orders is logged once as a warning (raised with ``strict=True``).

**The verdict does not depend on timing.** Each access is first appended to its log, then
compared with everything already there (appends are atomic under the GIL), so of two
conflicting accesses the later one always sees the earlier, whichever it is: a missing
dependency is reported on the first iteration in which both tasks touch the same thing,
even when the run happened to order them correctly. A read of an attribute the context
lacks is the one access that cannot wait to be compared later: the task that sets it may
not have run yet. ``early_read`` then waits, once per task and attribute (again only when
another iteration showed a task setting it), for the tasks that could set it in this
iteration and can run meanwhile (those a serial run runs first, that no dependency orders
first and that the placement does not put after the reader), at most ``EARLY_READ_WAIT_S``
seconds and not after a checked call failed; if one of them set it, the read is that race,
reported in the same words as when the write comes first; otherwise the read fails as it
would without the check. A context for an iteration number the checker has already seen
starts a new run, which empties the shared log.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple, Union

import torch

from ..plan import ordering
from ..plan.context import IterContext
from ..plan.model import PipelinePlan, PipelineTask
from .access import DRAW, READ, WRITE
from .checked_call import EVERY, FINISHED, Access, CheckedJournal, CheckedView, Log, Unit, new_view, set_journal
from .generators import GeneratorKey, generator_name, named_generators
from .memory import Region, RegionIndex, regions_of
from .naming import find_roots, names_its_tensors, state_index
from .operators import pop, push
from .races import HappensBefore, Placement, RaceError, conflict_clause, dependency_fix, draw_hint
from .shared_log import SharedLog

__all__: List[str] = []

logger = logging.getLogger("swpipeline")

_STATE = (torch.nn.Module, torch.optim.Optimizer, torch.Tensor)  # roots whose tensors are named state
EARLY_READ_WAIT_S = 5.0  # the longest a read of a missing attribute waits for the tasks that could set it
_Logged = Tuple["weakref.ref[IterContext]", Log, List[Any]]  # a context, its log, the log's FINISHED list


class RaceChecker:
    """Checks every context access and every draw of the wrapped task functions against a plan's dependencies.

    Args:
        plan: the plan whose tasks are wrapped; its dependencies define happens-before.
        strict: also raise for a conflict that only the placement orders (the same thread
            group or stream), instead of logging it once as a warning.

    Raises:
        TypeError: ``plan`` is not a PipelinePlan.
        ValueError: the plan breaks a stage rule.

    What it sees: context attributes read, written, deleted or changed in place (memory an
    operator wrote, through any name or view; a container's items); the parameters,
    buffers, gradients, optimizer state and tensors the task functions reach, read or
    written by an operator; draws from the default generators and from explicit generators
    the task functions reach (see the module docstring for what each is compared with).
    Overhead: a recording view and a dispatch mode per task call, a few microseconds per
    context access, and a Python call per torch operator while a task runs: for tests.
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
        self._logs: Dict[int, _Logged] = {}  # by id(ctx)
        self._lock = threading.RLock()  # _draw reports (and may warn) while holding it
        self._sweep_at = 64  # the number of logs at which those of dead contexts are dropped
        self._warned: Set[Tuple[str, str, int, str]] = set()
        self._verdicts: Dict[Tuple[int, int, int], bool] = {}
        self._newest = -1  # the highest iteration a context was first seen for: a lower one starts a new run
        self._shared = SharedLog(self)  # named tensors and generators: shared by every iteration
        self._roots: Optional[Dict[str, Any]] = None  # what the task functions reach, found at the first context
        self._refresh = True  # whether a new context names the state again (not once the roots hold none)
        self._generators: Dict[int, str] = {}  # explicit generators the task functions reach, by address
        self._kept: List[Any] = []  # those generators, alive, so that their addresses stay theirs
        self._named: RegionIndex[str] = RegionIndex()  # the named tensors now, by memory (rebuilt per iteration)
        self._named_storages: FrozenSet[int] = frozenset()
        self._setters: Dict[int, List[int]] = {}  # task -> the tasks that could set what it finds missing
        self._settled: Set[Tuple[int, str]] = set()  # (task, attribute): a missing read waited for once
        self._failures = 0  # checked calls that raised (a reader waiting at a missing attribute stops)
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
        awaited = index in self._awaitable()  # a reader may wait for this task's calls to return

        def checked(ctx: IterContext) -> Any:
            found = self._logs.get(id(ctx))
            if found is None or found[0]() is not ctx:
                found = self._log_of(ctx)
            journal = CheckedJournal(ctx, self, found[1], (index, ctx.iter_idx))
            view = new_view(CheckedView)
            set_journal(view, journal)  # CheckedView(journal), without a Python call
            push(journal)  # it sees the operators of this call, on this thread
            try:
                result = run(view)
                if journal.raced is not None:  # raised inside an operator, and caught by the code around it
                    raise journal.raced
            except BaseException as error:
                self._failures += 1
                raise journal.failure(error)
            finally:
                pop(None)
                if awaited:  # (finish() logs no assignment: a reader waiting for this task has all it needs now)
                    found[2].append(index)  # the log's FINISHED list
            if journal.to_finish:
                journal.finish()
            return result

        checked.__name__ = f"race_checked_{name}"
        return checked

    def _log_of(self, ctx: IterContext) -> _Logged:
        """The access log of one context (and its list of finished tasks), made when the context is first seen; it
        goes some time after the context does (dead contexts are swept whenever the number of logs has doubled)."""
        with self._lock:
            found = self._logs.get(id(ctx))
            if found is None or found[0]() is not ctx:
                if len(self._logs) >= self._sweep_at:
                    self._logs = {k: v for k, v in self._logs.items() if v[0]() is not None}
                    self._sweep_at = max(64, 2 * len(self._logs))
                if ctx.iter_idx <= self._newest:  # contexts are first seen in iteration order within a run
                    self._shared.clear()
                self._newest = ctx.iter_idx
                if self._refresh:
                    self._refresh_state()
                finished: List[Any] = []
                found = self._logs[id(ctx)] = (weakref.ref(ctx), {FINISHED: finished}, finished)
            return found

    def _refresh_state(self) -> None:
        """Name the state the task functions reach as it is now (``.grad`` and optimizer state appear lazily)."""
        if self._roots is None:
            self._roots = find_roots([t.fn for t in self.plan.tasks], {})
            found = named_generators(self._roots)
            self._kept = [g for _, g in found.values()]
            self._generators = {k: name for k, (name, _) in found.items()}
            self._refresh = any(isinstance(obj, _STATE) or names_its_tensors(obj) for obj in self._roots.values())
        if self._refresh:
            index = state_index(self._roots)
            self._named, self._named_storages = index, frozenset(index.storages())

    def _compare(self, log: Log, attr: Any, entries: List[Access], access: Access) -> None:
        """Raise (or warn) for each logged access that conflicts with ``access`` and is not ordered with it.

        ``entries`` is the log of ``attr`` (``access`` is in it); a write is also compared with
        the looks at every attribute (``EVERY``), and such a look with every write.
        """
        if attr is EVERY:
            for name, others in list(log.items()):
                if name is not EVERY and name is not FINISHED:
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
                    pool = entries if access in entries else [*entries, access]  # a look at every attribute
                    first, second = self._earliest((a, b) for k, a in enumerate(pool) for b in pool[k + 1:]
                                                   if a[0] != b[0] and (a[1] != READ or b[1] != READ))
                self._report(f"ctx.{attr}", first, second)
        if kind != READ and EVERY in log:
            for other, _ in log[EVERY]:
                if other != unit and not self._ordered(other, unit):
                    self._report(f"ctx.{attr}", (other, READ), access)

    def _draw(self, key: GeneratorKey, unit: Unit) -> None:
        """Log a draw from a generator; compare it with every other task's draws in the iterations around it."""
        generator = generator_name(key, self._generators)
        if generator is not None:
            with self._lock:
                self._shared.add(generator, unit, DRAW)

    def _state(self, unit: Unit, reads: List[torch.Tensor], written: List[Region]) -> None:
        """Log what one call's operators read and wrote of the named state (in the order of the names)."""
        index = self._named
        if not index:
            return
        kinds: Dict[str, str] = {}
        for region in written:
            for name in index.meeting(region):
                kinds[name] = WRITE
        for region in regions_of(reads):
            for name in index.meeting(region):
                kinds.setdefault(name, READ)
        if kinds:
            with self._lock:
                for name in sorted(kinds):
                    self._shared.add(name, unit, kinds[name])

    def early_read(self, log: Log, name: str, unit: Unit) -> Optional[RaceError]:
        """A read of ``name``, which ``unit``'s context lacks: the race with the task that sets it, if one of the
        tasks that could set it does (see the module docstring); None: the read fails as it would unchecked."""
        setters = self._could_set(unit[0])
        if not setters:
            return None
        known = self._known_setter(name, setters)
        if (unit[0], name) not in self._settled or known is not None:
            self._settled.add((unit[0], name))
            self._await(log, setters)
        read = (unit, READ)
        for other, kind in list(log.get(name, ())):
            if other[0] in setters and other[1] == unit[1] and kind != READ:
                return self._race(f"ctx.{name}", (other, kind), read)
        if known is not None:
            return self._race(f"ctx.{name}", ((known, unit[1]), WRITE), read)
        return None

    def _could_set(self, task: int) -> List[int]:
        """The tasks that could set what ``task`` finds missing and run meanwhile: a serial run runs them first,
        no dependency orders them first, and neither they nor what they wait for run after ``task`` by the
        placement or the dependencies."""
        found = self._setters.get(task)
        if found is None:
            reader = self._names[task]
            relation, placement = self._happens_before, self._placement
            after = [n for n in self._names if n != reader and (
                relation.before(reader, n) or placement.before(n, reader) is False)]
            found = self._setters[task] = [
                self._index[n] for n in self._names
                if self._serial[n] < self._serial[reader] and not relation.before(n, reader) and n not in after
                and not any(relation.before(a, n) for a in after)]
        return found

    def _awaitable(self) -> Set[int]:
        """The tasks some reader of a missing attribute may wait for (``_could_set`` of any task)."""
        return {setter for task in range(len(self._names)) for setter in self._could_set(task)}

    def _known_setter(self, name: str, setters: List[int]) -> Optional[int]:
        """One of ``setters`` seen setting ``name`` in another iteration's context, if any."""
        for _, other_log, _ in list(self._logs.values()):
            for (task, _), kind in list(other_log.get(name, ())):
                if task in setters and kind != READ:
                    return int(task)
        return None

    def _await(self, log: Log, setters: List[int]) -> None:
        """Until every task of ``setters`` has returned on this context, a checked call failed, or
        ``EARLY_READ_WAIT_S`` passed."""
        failures, deadline = self._failures, time.monotonic() + EARLY_READ_WAIT_S
        while not set(setters) <= set(log[FINISHED]) and self._failures == failures and time.monotonic() < deadline:
            time.sleep(0.001)

    def _race(self, attribute: str, one: Access, other: Access) -> Optional[RaceError]:
        """The RaceError ``_report`` raises for two accesses (None: it only warned)."""
        try:
            self._report(attribute, one, other)
        except RaceError as error:
            return error
        return None

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
            topic = attribute if attribute.startswith("ctx.") or first_kind == DRAW else "named state"
            key = (a, b, min(distance, 2), topic)  # one warning per pair for the state (every weight alike)
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

