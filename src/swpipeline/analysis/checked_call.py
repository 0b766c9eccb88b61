"""One race-checked task call: the journal that logs its accesses, and the recording view that is its hot path.

``RaceChecker.wrap`` (``races.py``) makes, per call of a checked task, a ``CheckedJournal``
and a ``CheckedView`` of the context (``view = new_view(CheckedView)`` then
``set_journal(view, journal)``: no Python call). Every access is appended to the context's log (``Log``: attribute ->
``[(unit, kind)]``) and then compared, by the checker, with what is already there:
appends are atomic under the GIL, so of two conflicting accesses the later one always
sees the earlier, with no lock. An access already logged for the same unit and kind is
not compared again.

The view's plain reads and assignments are logged in place (the common case of a checked
run: no Python call but the view's own), and the checker is called only when the log
holds another unit's access whose verdict is not already known to be "ordered".
Everything else (``vars(ctx)``, deletes, draws) goes through the journal's hooks.

The journal is also the call's ``OperatorObserver`` (``operators.py``): it keeps the tensors
the call's operators wrote, and those they read among the checker's named state; a write
of that state is judged before the operator runs (``writing``), so a race on the weights is
reported before it changes what another task computes. A race raised inside an operator is
kept (``raced``): the code around the operator may catch it (``load_state_dict`` turns it
into a ``RuntimeError`` of its own), and the call raises it when it ends. When the call
returns, ``finish`` writes every context attribute whose value covers memory written (as it
was before each operator: a copy writes only what it made) or holds a tensor pointed at
other memory
(``inplace.attributes_meeting``: an alias, a view, the batch under another name), every
attribute whose container the call changed, and hands the state's reads and writes to the
checker. A read of an attribute the context lacks goes to the checker first
(``early_read``): the task that sets it may not have run yet.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Dict, FrozenSet, List, Optional, Protocol, Tuple

import torch

from .access import DELETE, MUTATE, READ, WRITE
from .generators import GeneratorKey
from .inplace import WATCHED, ValueWatch, Written, attributes_meeting
from .memory import Region
from .operators import OperatorObserver
from .races import RaceError
from ..plan.context import IterContext
from ..shortcut.recording import JOURNAL_SLOT, Journal, RecordingView

__all__: List[str] = []

Unit = Tuple[int, int]  # (task index in the plan, iteration)
Access = Tuple[Unit, str]  # (unit, kind)
Log = Dict[Any, List[Any]]  # one context's accesses: attribute (or EVERY) -> [(unit, kind)]; FINISHED -> [task]

EVERY = object()  # the log key of a look at every attribute at once
FINISHED = object()  # the log key of the tasks whose call on this context has returned (or raised)
_WATCHED_TYPES = frozenset({list, dict, tuple, set})  # watched, at a glance (tensors: by the memory written)
_PLAIN_TYPES = frozenset({int, float, bool, str, bytes, complex, type(None), torch.Tensor, torch.nn.Parameter})
new_view, set_journal = object.__new__, JOURNAL_SLOT.__set__  # CheckedView(journal) is set_journal(new_view(...))


class Checker(Protocol):
    """What a checked call asks of its checker (``RaceChecker``): compare an access, log a draw or the state's
    accesses, settle a read of a missing attribute; and the verdicts it already knows."""

    _verdicts: Dict[Tuple[int, int, int], bool]  # (task, other task, iteration distance) -> ordered by happens-before
    _named_storages: FrozenSet[int]  # the storages of the named state the task functions reach

    def _compare(self, log: Log, attr: Any, entries: List[Access], access: Access) -> None: ...

    def _draw(self, key: GeneratorKey, unit: Unit) -> None: ...

    def _state(self, unit: Unit, reads: List[torch.Tensor], written: List[Region]) -> None: ...

    def early_read(self, log: Log, name: str, unit: Unit) -> Optional[BaseException]: ...


class CheckedJournal(Journal, OperatorObserver):
    """The recording view's journal for one call of a wrapped task: every access goes to the checker's log.

    It is also the dispatch mode that sees the call's operators (``OperatorObserver``: pushed
    on the calling thread for the length of the call), one object where two would cost a
    lookup and a hand-over per call on the checker's hot path.
    """

    watches = WATCHED
    to_finish = False  # whether finish() has anything to look at (set by watch, wrote, read_tensor)
    values: Optional[ValueWatch] = None  # the containers read, once one could be changed in place
    written: Optional[List[Tuple[torch.Tensor, Optional[Region]]]] = None  # what this call's operators wrote
    # (on its thread): each tensor, kept alive so that its memory stays its own, with the memory it covered before
    state_reads: Optional[List[torch.Tensor]] = None  # the tensors of the checker's state they read
    raced: Optional[BaseException] = None  # the first race raised inside an operator (the code around may catch it)

    def __init__(self, target: IterContext, checker: Checker, log: Log,
                 unit: Unit) -> None:  # (no super().__init__:) the journal's own records are not kept
        self.target = target
        self.checker = checker
        self.log = log
        self.unit = unit

    @property
    def reads_of(self) -> Collection[int]:
        """The storages of the checker's named state now: the reads the call's operators hand on."""
        return self.checker._named_storages

    def _log(self, name: Any, kind: str) -> None:
        """Log one access, then compare it with the log (see the module docstring: no lock, never a miss)."""
        entries = self.log.get(name)
        if entries is None:
            entries = self.log.setdefault(name, [])
        access = (self.unit, kind)
        if access not in entries:
            entries.append(access)
            self.checker._compare(self.log, name, entries, access)

    def read(self, name: str) -> None:
        self._log(name, READ)

    def read_all(self) -> None:
        self._log(EVERY, READ)

    def watch(self, name: str, value: Any) -> None:
        if self.values is None:
            self.values = ValueWatch()
            self.to_finish = True
        self.values.watch(name, value)

    def touch(self, name: str) -> None:
        return None

    def write(self, name: str, value: Any) -> None:
        self._log(name, WRITE)

    def delete(self, name: str) -> None:
        self._log(name, DELETE)

    def drew(self, key: GeneratorKey) -> None:
        """A draw by an operator of this call: log it with the checker."""
        try:
            self.checker._draw(key, self.unit)
        except RaceError as race:
            self.raced = self.raced or race  # the first
            raise

    warns_before_writes = True

    def writing(self, regions: List[Optional[Region]]) -> None:
        """Before an operator writes the memory ``regions`` (None: a tensor object only): a write of the named
        state (the weights, their gradients, the optimizer's state) is judged now, not when the call returns, so
        that a race on it raises before the write lands: were it judged after, another task that reads those
        weights (a backward whose graph saved them) could fail first with a message about the symptom."""
        storages = self.checker._named_storages
        if storages:
            named = [region for region in regions if region is not None and region.storage in storages]
            if named:
                try:
                    self.checker._state(self.unit, [], named)
                except RaceError as race:
                    self.raced = self.raced or race  # the first
                    raise

    def failure(self, error: BaseException) -> BaseException:
        """What the call raises when it raised ``error``: the first race raised inside one of its operators, if
        any (``error`` its cause: what the code around the operator made of it), else ``error``."""
        race = self.raced
        if race is None or race is error:
            return error
        race.__cause__ = error
        return race

    def wrote(self, tensor: torch.Tensor, region: Optional[Region]) -> None:
        if self.written is None:
            self.written = []
            self.to_finish = True
        self.written.append((tensor, region))

    def read_tensor(self, tensor: torch.Tensor) -> None:
        if self.state_reads is None:
            self.state_reads = []
            self.to_finish = True
        self.state_reads.append(tensor)

    def finish(self) -> None:
        """After the call: memory its operators wrote is a write of every attribute covering it; a container
        it read and changed is a write of its attribute; the state it read and wrote goes to the checker."""
        written = Written.of(self.written or ())
        changed = attributes_meeting({"batch": self.target.batch, **vars(self.target)},
                                     written) if self.written else []
        if self.values is not None:
            changed += self.values.changed()
        for name in dict.fromkeys(changed):
            self._log(name, MUTATE)
        if written.regions or self.state_reads:
            self.checker._state(self.unit, self.state_reads or [], written.regions)


class CheckedView(RecordingView):
    """The recording view of a checked call: plain attribute reads and assignments logged in place.

    The hot path of a checked run. It logs an access as ``CheckedJournal._log`` does, and
    calls the checker only when the attribute's log holds another unit's access whose
    verdict is not known to be "ordered"; everything else is ``RecordingView``'s.
    """

    __slots__ = ()

    def __getattribute__(self, name: str) -> Any:
        journal = _checked_journal_of(self)
        if name == "iter_idx":
            return journal.target.iter_idx
        if name[:1] == "_":
            return RecordingView.__getattribute__(self, name)
        log = journal.log
        entries = log.get(name)
        if entries is None:
            entries = log.setdefault(name, [])
        unit = journal.unit
        access = (unit, READ)
        if access not in entries:
            entries.append(access)
            verdicts = journal.checker._verdicts
            for other, other_kind in entries:
                if other_kind != READ and other != unit and not verdicts.get((other[0], unit[0], unit[1] - other[1])):
                    journal.checker._compare(log, name, entries, access)
                    break
        value = getattr(journal.target, name)  # a missing attribute: __getattr__ below
        kind = type(value)
        if kind not in _PLAIN_TYPES and (kind in _WATCHED_TYPES or isinstance(value, WATCHED)):
            journal.watch(name, value)
        return value

    def __getattr__(self, name: str) -> Any:
        """Python calls it after ``__getattribute__`` found the attribute missing: the task that sets it may not have
        run yet (``early_read``); else the context's own error."""
        journal = _checked_journal_of(self)
        error = journal.checker.early_read(journal.log, name, journal.unit)
        if error is not None:
            raise error from None
        return getattr(journal.target, name)

    def __setattr__(self, name: str, value: Any) -> None:
        journal = _checked_journal_of(self)
        setattr(journal.target, name, value if value is not self else journal.target)  # ctx.me = ctx: the context
        log = journal.log
        entries = log.get(name)
        if entries is None:
            entries = log.setdefault(name, [])
        access = (journal.unit, WRITE)
        if access not in entries:
            entries.append(access)
            if len(entries) > 1 or EVERY in log:
                journal.checker._compare(log, name, entries, access)
        if journal.mirror is not None:
            journal.mirror._mirror_one(name)


_checked_journal_of: Callable[[CheckedView], CheckedJournal] = JOURNAL_SLOT.__get__  # a checked view's journal
