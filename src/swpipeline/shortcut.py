"""Task shortcut: run a task once, then replay what it left on the context instead of running it.

Three ways a task executes (``ShortcutTable.executor`` picks once, when shortcut
settings change, so a normal task costs nothing extra):

* normal: ``fn(ctx)``;
* caching (first execution after ``enable_shortcut``): ``fn`` runs on a *recording view*
  of the context, a stand-in that forwards every read, write and delete to the context
  and notes them. The cache then holds exactly what this task wrote (a snapshot of the
  last value it assigned to each attribute, see ``snapshot.py``) and deleted, each
  ``DeclaredIO.capture()`` result, and the attributes it read. What other tasks do to the
  same context meanwhile, on other threads, is not in it; the context itself is never
  modified beyond what the task does (its class stays as it is).
* replay: ``fn`` is skipped; the task's deletions are repeated, its attributes restored
  as fresh values, each ``DeclaredIO.restore`` called, and a gradient bridge
  (``GraftGrad``) connects restored tensors that require grad to the tensors the task
  read, so ``loss.backward()`` still reaches the parameters upstream of the shortcut
  task (with zero gradients: the task's real dependence is gone), while the parameters
  downstream get exactly the gradients the cached values give.

A value a replay cannot reproduce (an iterator, a reference cycle) fails the caching
execution with a TypeError/ValueError naming the task and the attribute.
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Dict, Iterator, List, Optional, Set, Tuple

import torch

from .plan import IterContext, PipelineTask
from .scoped import Scoped
from .snapshot import Cached, Restorer, Snapshot, Unreplayable

if TYPE_CHECKING:
    from .analysis.races import RaceChecker

__all__: List[str] = []


def _flat_tensors(value: Any, out: List[torch.Tensor], depth: int = 0) -> None:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif depth < 4 and isinstance(value, (list, tuple)):
        for v in value:
            _flat_tensors(v, out, depth + 1)
    elif depth < 4 and isinstance(value, dict):
        for v in value.values():
            _flat_tensors(v, out, depth + 1)


class GraftGrad(torch.autograd.Function):
    """Identity on ``restored``; in backward, zeros for the upstream tensors so their backward still runs."""

    @staticmethod
    def forward(ctx: Any, restored: torch.Tensor, *upstream: torch.Tensor) -> torch.Tensor:
        ctx.upstream_meta = [(u.shape, u.dtype, u.device) for u in upstream]
        return restored.view_as(restored)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        zeros = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.upstream_meta]
        return (grad_output, *zeros)


_graft: Callable[..., torch.Tensor] = GraftGrad.apply  # typed handle on the untyped autograd entry point


class _Journal:
    """What one caching execution of a task did to its context, in effect (last write or delete per name).

    A recording view hands its attribute accesses to ``get_attr``/``set_attr``/``del_attr``,
    which forward them to the context and note them through the hooks: ``read`` before each
    attribute read (also of one that is not there), ``touch`` + ``write``/``delete`` around
    each assignment and deletion, ``watch`` with each value read whose type is in
    ``watches`` (a value the task may change in place; the cache keeps no such record), and
    ``read_all`` when the task looks at every attribute at once (iterating, copying or
    comparing ``vars(ctx)``). The recording journals of the analysis and the race checker
    override the hooks (and, for speed, the accessors).
    """

    _DELETED = object()
    watches: Tuple[type, ...] = ()
    mirror: Optional["_RecordingDict"] = None  # vars(view), once the task asked for it

    def __init__(self, target: IterContext) -> None:
        self.target = target
        self.final: Dict[str, Any] = {}  # name -> last value written, or _DELETED
        self.existed: Dict[str, bool] = {}  # name -> present before the task first touched it
        self.reads: Set[str] = set()

    def get_attr(self, name: str) -> Any:
        self.read(name)
        value = getattr(self.target, name)
        if isinstance(value, self.watches):
            self.watch(name, value)
        return value

    def set_attr(self, name: str, value: Any) -> None:
        self.touch(name)
        setattr(self.target, name, value)
        self.write(name, value)
        if self.mirror is not None:
            self.mirror._mirror_one(name)

    def del_attr(self, name: str) -> None:
        self.touch(name)
        delattr(self.target, name)
        self.delete(name)
        if self.mirror is not None:
            self.mirror._mirror_one(name)

    def read(self, name: str) -> None:
        if name not in self.final:
            self.reads.add(name)

    def read_all(self) -> None:
        for name in list(vars(self.target)):
            self.read(name)

    def watch(self, name: str, value: Any) -> None:
        return None

    def touch(self, name: str) -> None:
        if name not in self.existed:
            self.existed[name] = dict.__contains__(vars(self.target), name)

    def write(self, name: str, value: Any) -> None:
        self.final[name] = value

    def delete(self, name: str) -> None:
        self.final[name] = self._DELETED

    def cache(self, task: PipelineTask) -> "TaskCache":
        snapshot = Snapshot()
        cache = TaskCache()
        for name, value in self.final.items():
            if value is self._DELETED:
                if self.existed[name]:
                    cache.deleted.append(name)
                continue
            try:
                cache.set_attrs[name] = snapshot.take(value)
            except Unreplayable as why:
                raise why.error_type(f"task {task.name!r} set ctx.{name} to {why.what}, {why.why}; or do not "
                                     f"shortcut {task.name!r}") from None
        attrs = vars(self.target)
        cache.read_attrs = sorted(n for n in self.reads if dict.__contains__(attrs, n) and n not in cache.set_attrs)
        for k, io in enumerate(task.io):
            try:
                cache.io_values.append(snapshot.take(io.capture()))
            except Unreplayable as why:
                raise why.error_type(f"task {task.name!r}: DeclaredIO #{k} capture() returned {why.what}, "
                                     f"{why.why}; or do not shortcut {task.name!r}") from None
        return cache


_MISSING = object()


class _RecordingDict(dict):  # type: ignore[type-arg]
    """``vars(view)`` for a recording view: the context's attribute dict, every access noted.

    A ``dict``, so ``json.dumps``, ``isinstance(d, dict)`` and C code that wants a dict take
    it. Every method reads and writes the context's own dict; the storage of this one is a
    mirror of it, refreshed each time the view hands it out and on each change made through
    it, for the C code that looks at a dict's storage directly (``json`` checks its size).
    Looking at every attribute at once (iterating, ``len``, ``keys``/``values``/``items``,
    ``copy``, comparing, printing) is a read of all of them.
    """

    __slots__ = ("_journal", "_attrs")

    def __init__(self, journal: _Journal) -> None:  # noqa: dict.__init__ is not called: the storage is a mirror
        self._journal = journal
        self._attrs: Dict[str, Any] = vars(journal.target)

    def _mirror(self) -> "_RecordingDict":
        dict.clear(self)
        dict.update(self, self._attrs)
        return self

    def _mirror_one(self, name: str) -> None:
        value = self._attrs.get(name, _MISSING)
        if value is _MISSING:
            dict.pop(self, name, None)
        else:
            dict.__setitem__(self, name, value)

    def _seen(self, name: str, value: Any) -> Any:
        if isinstance(value, self._journal.watches):
            self._journal.watch(name, value)
        return value

    # one attribute
    def __getitem__(self, name: str) -> Any:
        self._journal.read(name)
        return self._seen(name, self._attrs[name])

    def get(self, name: str, default: Any = None) -> Any:
        self._journal.read(name)
        value = self._attrs.get(name, _MISSING)
        return default if value is _MISSING else self._seen(name, value)

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self._journal.read(name)
        return name in self._attrs

    def __setitem__(self, name: str, value: Any) -> None:
        self._journal.touch(name)
        self._attrs[name] = value
        dict.__setitem__(self, name, value)
        self._journal.write(name, value)

    def __delitem__(self, name: str) -> None:
        self._journal.touch(name)
        del self._attrs[name]
        dict.pop(self, name, None)
        self._journal.delete(name)

    def pop(self, name: str, default: Any = _MISSING) -> Any:
        if name not in self._attrs:
            self._journal.read(name)
            if default is _MISSING:
                raise KeyError(name)
            return default
        value = self._attrs[name]
        del self[name]
        return value

    def setdefault(self, name: str, default: Any = None) -> Any:
        if name in self:
            return self._seen(name, self._attrs[name])
        self[name] = default
        return default

    def update(self, *others: Any, **values: Any) -> None:
        for name, value in dict(*others, **values).items():
            self[name] = value

    # every attribute
    def _all(self) -> Dict[str, Any]:
        self._journal.read_all()
        if self._journal.watches:
            for name, value in list(self._attrs.items()):
                self._seen(name, value)
        return self._attrs

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._all()))

    def __reversed__(self) -> Iterator[str]:
        return reversed(list(self._all()))

    def __len__(self) -> int:
        return len(self._all())

    def keys(self) -> Any:
        return self._all().keys()

    def values(self) -> Any:
        return self._all().values()

    def items(self) -> Any:
        return self._all().items()

    def copy(self) -> Dict[str, Any]:
        return dict(self._all())

    def popitem(self) -> Tuple[str, Any]:
        names = list(self._all())
        if not names:
            raise KeyError("popitem(): dictionary is empty")
        return names[-1], self.pop(names[-1])

    def clear(self) -> None:
        for name in list(self._all()):
            del self[name]

    def __eq__(self, other: object) -> bool:
        return self._all() == other

    def __ne__(self, other: object) -> bool:
        return self._all() != other

    __hash__ = None

    def __or__(self, other: Any) -> Any:
        return self._all() | other

    def __ror__(self, other: Any) -> Any:
        return other | self._all()

    def __ior__(self, other: Any) -> "_RecordingDict":
        self.update(other)
        return self

    def __repr__(self) -> str:
        return repr(self._all())

    def __copy__(self) -> Dict[str, Any]:
        return self.copy()

    def __deepcopy__(self, memo: Dict[int, Any]) -> Dict[str, Any]:
        return deepcopy(self._all(), memo)

    def __reduce__(self) -> Tuple[Any, ...]:
        return dict, (self.copy(),)

    @classmethod
    def fromkeys(cls, keys: Any, value: Any = None) -> Dict[Any, Any]:
        return dict.fromkeys(keys, value)


class _RecordingView(IterContext):
    """Handed to a task while it is being recorded: forwards everything to the context and notes it.

    It behaves as the context does for everything a task may do with it: attributes,
    ``vars()``/``__dict__`` (a ``_RecordingDict``), ``isinstance``, ``repr``, ``copy``, and
    equality and hashing, so a dict keyed by the context finds the view and the other way
    round. ``iter_idx`` is read without a note (it never changes); ``batch`` is noted like
    any attribute, since a task may change the batch in place.
    """

    __slots__ = ("_swp_journal",)

    def __init__(self, journal: _Journal) -> None:  # noqa: super().__init__ is deliberately not called
        object.__setattr__(self, "_swp_journal", journal)

    def __getattribute__(self, name: str) -> Any:
        journal: _Journal = _journal_of(self)
        if name == "iter_idx":
            return journal.target.iter_idx
        if name[:2] == "__" and name[-2:] == "__":
            if name == "__dict__":
                if journal.mirror is None:
                    journal.mirror = _RecordingDict(journal)
                return journal.mirror._mirror()
            return object.__getattribute__(self, name)
        return journal.get_attr(name)

    def __getattr__(self, name: str) -> Any:
        # Python calls this after __getattribute__ raised AttributeError (an attribute the context lacks): the
        # context's own error, without running IterContext.__getattr__ on the view (which would read more)
        return getattr(_journal_of(self).target, name)

    def __setattr__(self, name: str, value: Any) -> None:
        _journal_of(self).set_attr(name, value)

    def __delattr__(self, name: str) -> None:
        _journal_of(self).del_attr(name)

    def __eq__(self, other: object) -> bool:
        target = _journal_of(self).target
        if isinstance(other, _RecordingView):
            return target is _journal_of(other).target
        return target is other if isinstance(other, IterContext) else NotImplemented

    def __hash__(self) -> int:
        return hash(_journal_of(self).target)

    def __repr__(self) -> str:
        return repr(_journal_of(self).target)

    def __dir__(self) -> Any:
        journal = _journal_of(self)
        journal.read_all()
        return dir(journal.target)

    def __reduce_ex__(self, protocol: Any) -> Any:  # copy.copy, copy.deepcopy, pickle: the context itself
        journal = _journal_of(self)
        journal.read_all()
        return journal.target.__reduce_ex__(protocol)


_JOURNAL_SLOT = _RecordingView.__dict__["_swp_journal"]
_journal_of: Callable[[_RecordingView], _Journal] = _JOURNAL_SLOT.__get__  # the slot, read without a lookup


@dataclass
class TaskCache:
    """What one execution of a task left behind."""

    set_attrs: Dict[str, Cached] = field(default_factory=dict)
    deleted: List[str] = field(default_factory=list)
    read_attrs: List[str] = field(default_factory=list)
    io_values: List[Cached] = field(default_factory=list)


class ShortcutTable:
    """Which tasks are shortcut, and their caches. Settings and caches outlive drain()."""

    def __init__(self, tasks: List[PipelineTask]) -> None:
        self._tasks = {t.name: t for t in tasks}
        self.enabled: Set[str] = set()
        self.caches: Dict[str, TaskCache] = {}

    def check_names(self, names: Tuple[str, ...], where: str) -> None:
        if not names:
            raise ValueError(f"{where}: name at least one task")
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"{where}: task names are strings, got {type(name).__name__} {name!r}")
            if name not in self._tasks:
                raise ValueError(f"{where}: unknown task {name!r} (known: {sorted(self._tasks)})")

    def enable(self, names: Tuple[str, ...]) -> None:
        self.check_names(names, "enable_shortcut")
        self.enabled.update(names)

    def disable(self, names: Tuple[str, ...]) -> None:
        self.check_names(names, "disable_shortcut")
        for name in names:
            self.enabled.discard(name)
            self.caches.pop(name, None)

    def executor(self, task: PipelineTask) -> Callable[[IterContext], Any]:
        """The function to launch for ``task``: its own fn unless it is shortcut."""
        if task.name not in self.enabled:
            return task.fn
        return lambda ctx: self._run_shortcut(task, ctx)

    def label(self, name: str) -> str:
        """A task's name as schedules and profiler ranges show it (``Name [skip]`` when shortcut)."""
        return f"{name} [skip]" if name in self.enabled else name

    def _run_shortcut(self, task: PipelineTask, ctx: IterContext) -> None:
        cache = self.caches.get(task.name)
        if cache is None:
            journal = _Journal(ctx)
            task.fn(_RecordingView(journal))
            self.caches[task.name] = journal.cache(task)
        else:
            _replay(task, ctx, cache)


def _replay(task: PipelineTask, ctx: IterContext, cache: TaskCache) -> None:
    upstream: List[torch.Tensor] = []
    for name in cache.read_attrs:
        _flat_tensors(getattr(ctx, name, None), upstream)
    upstream = [u for u in upstream if u.requires_grad]
    attrs = vars(ctx)
    for name in cache.deleted:
        attrs.pop(name, None)
    restorer = Restorer()
    for name, cached in cache.set_attrs.items():
        value = restorer.give(cached)
        if upstream and isinstance(value, torch.Tensor) and value.requires_grad:
            value = _graft(value, *upstream)
        setattr(ctx, name, value)
    for io, cached in zip(task.io, cache.io_values):
        io.restore(restorer.give(cached))


class ShortcutSettings:
    """The shortcut half of a pipeline's public API (mixed into ``_PipelineBase``).

    Settings and caches belong to the pipeline, not to a run: they survive ``drain()``.
    Changing them while iterations are in flight is refused.
    """

    _shortcuts: ShortcutTable
    _tasks: List[Any]  # the pipeline's TaskRuntimes: each launches its ``exec_fn``
    _race_checker: Optional["RaceChecker"]  # check_races=True: every task's context accesses are checked

    def _active_run(self) -> Any:
        raise NotImplementedError

    def enable_shortcut(self, *names: str) -> None:
        """Shortcut these tasks: the next execution caches what each leaves on the context, later ones replay it.

        Settings and caches survive drain(); globally ordered tasks keep their turn.

        Raises:
            ValueError: an unknown task name.
            RuntimeError: iterations are in flight (call drain() first).
        """
        self._require_idle("enable_shortcut")
        self._shortcuts.enable(names)
        self._refresh_executors()

    def disable_shortcut(self, *names: str) -> None:
        """Run these tasks normally again and drop their caches."""
        self._require_idle("disable_shortcut")
        self._shortcuts.disable(names)
        self._refresh_executors()

    @property
    def shortcuts(self) -> List[str]:
        """The names of the shortcut tasks, sorted."""
        return sorted(self._shortcuts.enabled)

    def without_shortcuts(self) -> ContextManager[None]:
        """Within the block no task is shortcut and no cache exists; afterwards both are as before."""
        self._require_idle("without_shortcuts")
        return Scoped(self._suspend_shortcuts, self._resume_shortcuts)

    def _suspend_shortcuts(self) -> Tuple[Set[str], Dict[str, TaskCache]]:
        table = self._shortcuts
        saved = (set(table.enabled), dict(table.caches))
        table.enabled, table.caches = set(), {}
        self._refresh_executors()
        return saved

    def _resume_shortcuts(self, saved: Tuple[Set[str], Dict[str, TaskCache]]) -> None:
        self._shortcuts.enabled, self._shortcuts.caches = saved
        self._refresh_executors()

    def _refresh_executors(self) -> None:
        """Each task's function to launch: its own, or its shortcut executor; checked for races if asked."""
        checker = self._race_checker
        for task in self._tasks:
            fn = self._shortcuts.executor(task.task)
            task.exec_fn = fn if checker is None else checker.wrap(task.task, fn)

    def _require_idle(self, what: str) -> None:
        if self._active_run() is not None:
            raise RuntimeError(f"{what}() while iterations are in flight; call drain() first")
