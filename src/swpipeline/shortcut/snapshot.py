"""Snapshots of values, for task shortcut: ``cache_val`` takes one, ``restore_val`` hands out fresh copies.

What a snapshot keeps, so that every replay gets what the task produced:

* tensors: ``detach().clone()`` (``requires_grad`` remembered); a restore is a new
  ``detach()`` of the clone each time, so a backward never runs through a graph twice;
* dicts, lists, tuples, named tuples, and objects whose attributes hold tensors (such
  as TorchRec's ``KeyedJaggedTensor``): rebuilt around restored contents; a dict or list
  subclass is rebuilt from a shallow copy of the original, so a ``defaultdict`` keeps its
  factory and an ``OrderedDict`` its type;
* shared parts stay shared: one object reached twice is restored as one object (within
  one ``Snapshot``/``Restorer`` pair), so ``[t, t]`` comes back as one tensor twice;
* anything else is kept by reference.

What it refuses, with an :class:`Unreplayable` naming what and why (the caller adds the
task and attribute): an iterator or generator (a replay would hand out the one already
consumed), and a value that contains itself (a reference cycle).
"""

from __future__ import annotations

import collections.abc
import copy
from typing import Any, Dict, List, Optional, Set, Tuple

import torch

__all__: List[str] = []

_CACHE_TAG = object()  # marks a snapshot node so restore_val can tell it from plain data
Cached = Tuple[Any, ...]


class Unreplayable(Exception):
    """A value a replay could not reproduce; ``error_type`` is the exception the user should get."""

    def __init__(self, error_type: type, what: str, why: str) -> None:
        super().__init__(f"{what}, {why}")
        self.error_type, self.what, self.why = error_type, what, why


class Snapshot:
    """Takes snapshots of several values that may share parts (one task's attributes and DeclaredIO values)."""

    def __init__(self) -> None:
        self._done: Dict[int, Cached] = {}
        self._open: Set[int] = set()  # objects being snapshotted: reaching one again is a cycle
        self._originals: List[Any] = []  # keeps ids unique while the snapshot is taken

    def take(self, value: Any) -> Cached:
        key = id(value)
        found = self._done.get(key)
        if found is not None:
            return found
        if key in self._open:
            raise Unreplayable(ValueError, "a value that contains itself",
                               f"through a {type(value).__name__}; a shortcut cannot replay reference cycles")
        self._originals.append(value)
        node = self._node(value, key)
        self._done[key] = node
        return node

    def _node(self, value: Any, key: int) -> Cached:
        if isinstance(value, torch.Tensor):
            return (_CACHE_TAG, "t", value.detach().clone(), value.requires_grad)
        if isinstance(value, collections.abc.Iterator):
            kind = "generator" if isinstance(value, collections.abc.Generator) else f"{type(value).__name__} iterator"
            raise Unreplayable(TypeError, f"a {kind}", "which a shortcut cannot replay (every replay would get the "
                                                      "same, already consumed iterator); store a list instead")
        self._open.add(key)
        try:
            if isinstance(value, dict):
                return (_CACHE_TAG, "d", _shell(value), [(k, self.take(v)) for k, v in value.items()])
            if isinstance(value, list):
                return (_CACHE_TAG, "l", _shell(value), [self.take(v) for v in value])
            if isinstance(value, tuple):
                return (_CACHE_TAG, "u", type(value), [self.take(v) for v in value])
            if _has_tensor_attrs(value):
                return (_CACHE_TAG, "o", type(value), {k: self.take(v) for k, v in _attributes(value).items()})
        finally:
            self._open.discard(key)
        return (_CACHE_TAG, "v", value)


def _shell(container: Any) -> Optional[Any]:
    """An empty copy of a dict/list subclass (keeps defaultdict's factory, the type); None for plain ones."""
    if type(container) in (dict, list):
        return None
    shell = copy.copy(container)
    shell.clear()
    return shell


class Restorer:
    """Rebuilds values from snapshot nodes; a node restored twice gives the same object (shared parts)."""

    def __init__(self) -> None:
        self._made: Dict[int, Any] = {}

    def give(self, cached: Cached) -> Any:
        if not (isinstance(cached, tuple) and cached and cached[0] is _CACHE_TAG):
            raise TypeError("restore_val expects a value produced by cache_val")
        key = id(cached)
        if key in self._made:
            return self._made[key]
        value = self._build(cached)
        self._made[key] = value
        return value

    def _build(self, cached: Cached) -> Any:
        kind = cached[1]
        if kind == "t":
            tensor = cached[2].detach()
            return tensor.requires_grad_(True) if cached[3] else tensor  # only a float or complex tensor can
        if kind == "d":
            out = {} if cached[2] is None else copy.copy(cached[2])
            out.update((k, self.give(v)) for k, v in cached[3])
            return out
        if kind == "l":
            items = [self.give(v) for v in cached[3]]
            if cached[2] is None:
                return items
            out = copy.copy(cached[2])
            out.extend(items)
            return out
        if kind == "u":
            items = [self.give(v) for v in cached[3]]
            return tuple(items) if cached[2] is tuple else _make_tuple(cached[2], items)
        if kind == "o":
            obj = object.__new__(cached[2])
            for name, val in cached[3].items():
                object.__setattr__(obj, name, self.give(val))
            return obj
        return cached[2]


def cache_val(value: Any) -> Cached:
    """A snapshot of one value (see the module docstring)."""
    return Snapshot().take(value)


def restore_val(cached: Cached) -> Any:
    """A fresh value from ``cache_val``'s snapshot: new tensor leaves sharing the cached storage."""
    return Restorer().give(cached)


def _make_tuple(kind: type, items: List[Any]) -> Any:
    return kind(*items) if hasattr(kind, "_fields") else kind(items)


def _attributes(obj: Any) -> Dict[str, Any]:
    attrs = dict(getattr(obj, "__dict__", {}))
    for klass in type(obj).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                attrs[slot] = getattr(obj, slot)
    return attrs


def _has_tensor_attrs(obj: Any) -> bool:
    if isinstance(obj, (type, torch.nn.Module)) or callable(obj):
        return False
    try:
        attrs = _attributes(obj)
    except Exception:  # objects with exotic attribute protocols are kept by reference
        return False
    return any(isinstance(v, torch.Tensor) or isinstance(v, (list, tuple, dict)) and _holds_tensor(v)
               for v in attrs.values())


def _holds_tensor(container: Any) -> bool:
    items = container.values() if isinstance(container, dict) else container
    return any(isinstance(v, torch.Tensor) for v in items)
