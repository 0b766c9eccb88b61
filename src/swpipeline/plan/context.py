"""The task's context: ``IterContext``, the per-iteration scratch space every task function is handed.

Guarantees this module gives to the rest of the package:

* ``batch`` and ``iter_idx`` are read-only: assigning or deleting either raises an
  ``AttributeError`` that says why;
* an attribute ``free_early`` deleted (``_swp_free``) raises ``FreedAttributeError`` however
  it is read (``ctx.x``, ``getattr``, ``hasattr``, ``vars(ctx)``), never a silent default;
* the context's attribute dict holds no reference to its context (a retired context is freed
  at once).
"""

from __future__ import annotations

import difflib
import operator
from typing import TYPE_CHECKING, Any, FrozenSet, List, Sequence

__all__: List[str] = []


class _EngineField(property):
    """A context field the engine owns: tasks read it; assigning or deleting it is an error that says why."""

    def __init__(self, slot: str, name: str, why: str) -> None:
        super().__init__(operator.attrgetter(slot), doc=why)
        self.field_name, self.why = name, why

    def __set__(self, obj: object, value: object) -> None:
        raise AttributeError(f"IterContext.{self.field_name} is read-only: {self.why}")

    def __delete__(self, obj: object) -> None:
        raise AttributeError(f"IterContext.{self.field_name} is read-only: {self.why}")


class FreedAttributeError(RuntimeError):
    """A task read a context attribute that ``free_early`` had already deleted.

    A ``RuntimeError``, not an ``AttributeError``: ``getattr(ctx, name, default)``,
    ``hasattr`` and ``vars(ctx).get(name)`` must not turn it into a silent default.
    """


class _ContextAttrs(dict):  # type: ignore[type-arg]
    """An IterContext's attribute dict: reading a name ``free_early`` deleted raises instead of missing.

    Attribute access (``ctx.x``, ``ctx.x = v``) goes to the dict's storage directly; only the
    lookups a task makes through ``vars(ctx)`` / ``ctx.__dict__`` reach these methods. It
    holds no reference to its context (no cycle: a retired context is freed at once).
    """

    __slots__ = ("iter_idx", "freed")

    def __init__(self, iter_idx: int) -> None:
        super().__init__()
        self.iter_idx = iter_idx
        self.freed: FrozenSet[str] = frozenset()  # names the engine deleted early (free_early)

    def freed_error(self, name: str) -> "FreedAttributeError":
        return FreedAttributeError(
            f"IterContext of iteration {self.iter_idx} no longer has {name!r}: free_early deleted it once "
            f"every task that declares it (reads/writes) had finished this iteration. Declare it in the "
            f"reads of the task that needs it, or pass keep=({name!r},) to keep it until the iteration retires")

    def _check(self, name: object) -> None:
        if name in self.freed and not dict.__contains__(self, name):
            raise self.freed_error(str(name))

    def __missing__(self, name: str) -> Any:
        self._check(name)
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        self._check(name)
        return dict.__contains__(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        self._check(name)
        return dict.get(self, name, default)

    def pop(self, name: str, *default: Any) -> Any:
        self._check(name)
        return dict.pop(self, name, *default)

    def setdefault(self, name: str, default: Any = None) -> Any:
        self._check(name)
        return dict.setdefault(self, name, default)

    def __reduce__(self) -> Any:  # a copy or pickle of it is a plain dict
        return (dict, (dict(self),))


class IterContext:
    """Per-iteration scratch space handed to every task function.

    ``batch`` is what the data iterator yielded and ``iter_idx`` the 0-based
    iteration number; both are read-only (the engine relies on them). Tasks attach
    intermediate results as attributes (``ctx.x = ...``) and may ``del`` them to free
    memory early. Reading an attribute that ``free_early`` deleted raises
    :class:`FreedAttributeError` (a ``RuntimeError``) however it is read: ``ctx.x``,
    ``getattr(ctx, "x", None)``, ``hasattr``, or through ``vars(ctx)``.
    """

    __slots__ = ("_swp_batch", "_swp_iter", "__dict__", "__weakref__")

    batch = _EngineField("_swp_batch", "batch", "it is what the data iterator yielded for this iteration; put "
                         "a transformed batch in an attribute of your own (ctx.x = ...), which you may del to "
                         "free it early (the engine drops the batch when the iteration retires)")
    iter_idx = _EngineField("_swp_iter", "iter_idx", "the engine numbers the iterations and relies on it; keep "
                            "a value of your own in another attribute")

    def __init__(self, batch: Any, iter_idx: int) -> None:
        self._swp_batch = batch  # the slots behind the read-only fields
        self._swp_iter = iter_idx
        object.__setattr__(self, "__dict__", _ContextAttrs(iter_idx))

    def __swp_context__(self) -> "IterContext":
        """The context itself; a stand-in for it (the recording view the checks hand a task) gives the context
        it stands for. Helpers that keep per-iteration state (``WeightVersions``) key it by this object."""
        return self

    def _swp_free(self, names: Sequence[str]) -> None:
        """The engine deletes ``names`` early: no declared task uses them any more in this iteration."""
        attrs = object.__getattribute__(self, "__dict__")
        if isinstance(attrs, _ContextAttrs):
            attrs.freed = attrs.freed | frozenset(names)  # first: a reader sees the value or the error
        for name in names:
            dict.pop(attrs, name, None)

    def __getattr__(self, name: str) -> Any:  # only reached for attributes that were never set
        if name.startswith("__"):
            raise AttributeError(name)
        attrs = object.__getattribute__(self, "__dict__")
        if isinstance(attrs, _ContextAttrs) and name in attrs.freed:
            raise attrs.freed_error(name)
        have = ["batch", "iter_idx", *sorted(vars(self))]
        close = difflib.get_close_matches(name, have, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise AttributeError(
            f"IterContext of iteration {self.iter_idx} has no attribute {name!r}{hint}; it has "
            f"{', '.join(have)}. If another task sets {name!r}, that task must run first: declare it in "
            f"intra_iter_deps (or inter_iter_deps, for the previous iteration's value)"
        )

    if TYPE_CHECKING:  # tasks set arbitrary attributes; tell the type checker so
        def __setattr__(self, name: str, value: Any) -> None: ...

    def __repr__(self) -> str:
        return f"IterContext(iter_idx={self.iter_idx}, attrs={sorted(vars(self))})"
