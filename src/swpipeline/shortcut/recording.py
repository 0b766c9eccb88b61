"""The recording view: a stand-in for a task's context that forwards every access to it and notes each one.

A task handed ``RecordingView(journal)`` instead of its ``IterContext`` cannot tell the
difference (attributes, ``vars()``, ``isinstance``, ``__class__``, ``repr``, ``copy``,
``pickle``/``torch.save``, equality and hashing all behave as the context's do), while
every attribute read, assignment and deletion reaches the ``Journal``'s hooks. Three
users override those hooks: the task shortcut's caching run (``replay.py``: the default
hooks, which keep what the task did in effect), the plan analysis (``analysis/access.py``) and the race checker
(``analysis/checked_call.py``).

A leaf: it imports nothing of the package but the plan model.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

from ..plan.context import IterContext

__all__: List[str] = []


class Journal:
    """What one recorded call of a task did to its context, in effect (last write or delete per name).

    A recording view hands its attribute accesses to ``get_attr``/``set_attr``/``del_attr``,
    which forward them to the context and note them through the hooks: ``read`` before each
    attribute read (also of one that is not there), ``touch`` + ``write``/``delete`` around
    each assignment and deletion, ``watch`` with each value read whose type is in
    ``watches`` (a value the task may change in place; the cache keeps no such record), and
    ``read_all`` when the task looks at every attribute at once (iterating, copying or
    comparing ``vars(ctx)``). The default hooks keep ``final``, ``existed`` and ``reads``,
    from which the task shortcut takes its cache (``replay.py``); the recording journals
    of the analysis and the race checker override the hooks (and, for speed, the accessors).
    """

    DELETED = object()
    watches: Tuple[type, ...] = ()
    mirror: Optional["RecordingDict"] = None  # vars(view), once the task asked for it

    def __init__(self, target: IterContext) -> None:
        self.target = target
        self.final: Dict[str, Any] = {}  # name -> last value written, or DELETED
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
        value = unwrapped(value)
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

    def read_whole(self) -> None:
        """The task pickles or copies the context: a look at every attribute at once and a read of the batch; a
        shallow copy shares the values, so each one is watched as a value read by name is."""
        self.read_all()
        self.get_attr("batch")
        if self.watches:
            for name, value in list(vars(self.target).items()):
                if isinstance(value, self.watches):
                    self.watch(name, value)

    def watch(self, name: str, value: Any) -> None:
        return None

    def touch(self, name: str) -> None:
        if name not in self.existed:
            self.existed[name] = dict.__contains__(vars(self.target), name)

    def write(self, name: str, value: Any) -> None:
        self.final[name] = value

    def delete(self, name: str) -> None:
        self.final[name] = self.DELETED



_MISSING = object()


class RecordingDict(dict):  # type: ignore[type-arg]
    """``vars(view)`` for a recording view: the context's attribute dict, every access noted.

    A ``dict``, so ``json.dumps``, ``isinstance(d, dict)`` and C code that wants a dict take
    it. Every method reads and writes the context's own dict; the storage of this one is a
    mirror of it, refreshed each time the view hands it out and on each change made through
    it, for the C code that looks at a dict's storage directly (``json`` checks its size).
    Looking at every attribute at once (iterating, ``len``, ``keys``/``values``/``items``,
    ``copy``, comparing, printing) is a read of all of them.
    """

    __slots__ = ("_journal", "_attrs")

    def __init__(self, journal: Journal) -> None:  # dict.__init__ is not called: the storage is a mirror
        self._journal = journal
        self._attrs: Dict[str, Any] = vars(journal.target)

    def _mirror(self) -> "RecordingDict":
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
        value = unwrapped(value)
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

    def __ior__(self, other: Any) -> "RecordingDict":
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


class RecordingView(IterContext):
    """Handed to a task while it is being recorded: forwards everything to the context and notes it.

    It behaves as the context does for everything a task may do with it: attributes,
    ``vars()``/``__dict__`` (a ``RecordingDict``), ``isinstance``, ``repr``, and equality and
    hashing, so a dict keyed by the context finds the view and the other way round. Pickling
    (``pickle``, ``torch.save``) and ``copy``/``deepcopy`` give what the context gives (the same
    bytes; ``__class__`` names the context's class, which pickle checks) and note a read of
    everything (``Journal.read_whole``). ``iter_idx`` is read without a note (it never
    changes); ``batch`` is noted like any attribute, since a task may change the batch in place.
    """

    __slots__ = ("_swp_journal",)

    def __init__(self, journal: Journal) -> None:  # super().__init__ is deliberately not called
        object.__setattr__(self, "_swp_journal", journal)

    def __getattribute__(self, name: str) -> Any:
        journal: Journal = _journal_of(self)
        if name == "iter_idx":
            return journal.target.iter_idx
        if name[:2] == "__" and name[-2:] == "__":
            if name == "__dict__":
                if journal.mirror is None:
                    journal.mirror = RecordingDict(journal)
                return journal.mirror._mirror()
            if name == "__class__":  # pickle checks it against the class the context's reduction names
                return type(journal.target)
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

    def __swp_context__(self) -> IterContext:  # the context this view stands for (a dunder: read without a note)
        return _journal_of(self).target

    def __eq__(self, other: object) -> bool:
        target = _journal_of(self).target
        if isinstance(other, RecordingView):
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

    def __reduce_ex__(self, protocol: Any) -> Any:  # copy.copy, copy.deepcopy, pickle, torch.save: the context itself
        journal = _journal_of(self)
        journal.read_whole()
        return journal.target.__reduce_ex__(protocol)


JOURNAL_SLOT = RecordingView.__dict__["_swp_journal"]
_journal_of: Callable[[RecordingView], Journal] = JOURNAL_SLOT.__get__  # the slot, read without a lookup


def unwrapped(value: Any) -> Any:
    """What a task stores: the context itself where it stores its view (``ctx.me = ctx``), as a plain run would; a
    view kept past its call would log later accesses as that call's."""
    return _journal_of(value).target if isinstance(value, RecordingView) else value
