"""Writes without an assignment: a value read from the context, changed in place by the task that read it.

``ctx.x.mul_(2)``, ``ctx.batch["img"].div_(255)`` and ``ctx.log.append(item)`` assign
nothing, so a recording view of the context sees only reads. ``ValueWatch`` remembers,
for each value a task reads from the context, a *probe* of what it can see of it, and
compares the probes again when the task returns:

* a tensor: its version counter, which every in-place operation on it or on any view of
  it bumps (views share their base's counter);
* a list, set, deque or dict: the identity of each of its items (and keys), so an
  append, a removal, an item replaced or a key added is a change;
* the tensors and containers inside a container or tuple, down to ``MAX_NESTING`` levels
  below the value, at most ``MAX_ITEMS`` items per container.

A change is a write of the attribute the value was read from, made by the task that
read it. While tasks run at once (the race checker), a tensor may also change because
another task changed it meanwhile: the checker then counts the change only when an
operator on the reading task's thread wrote the tensor's storage (``changed(written)``);
the task that did write it logs it as its own. The probes keep the items they compare
alive, so an address reused by a new object never hides a replacement.

What a probe cannot see: a write through memory torch does not count (``t.data``,
``t.numpy()``, a pointer handed to native code); tensors without a version counter
(made under ``torch.inference_mode``); attributes of other objects; containers nested
deeper than ``MAX_NESTING`` or past the first ``MAX_ITEMS`` items.
"""

from __future__ import annotations

import collections
import operator
from typing import Any, Dict, List, Optional, Set, Tuple

import torch

from .naming import storage_key

__all__: List[str] = []

MAX_NESTING, MAX_ITEMS = 2, 1024  # how far below a value read from the context the probes look
WATCHED = (torch.Tensor, list, dict, set, tuple, collections.deque)  # what a probe can see into

_Probe = Tuple[Any, Any]  # (the object, what was seen of it)


def _version(tensor: torch.Tensor) -> int:
    try:
        return int(tensor._version)
    except Exception:  # inference tensors have no version counter
        return -1


def _seen(obj: Any) -> Any:
    """What a probe sees of one object now (None: nothing it can compare)."""
    if isinstance(obj, torch.Tensor):
        return _version(obj)
    if isinstance(obj, dict):
        return (*obj, *obj.values())
    if isinstance(obj, (list, set, collections.deque)):
        return tuple(obj)
    return None


def _same(was: Any, now: Any) -> bool:
    if isinstance(was, int):  # a tensor's version
        return bool(was == now)
    return len(was) == len(now) and all(map(operator.is_, was, now))  # a container's items, by identity


def _probes(value: Any, depth: int, out: List[_Probe]) -> None:
    seen = _seen(value)
    if seen is not None:
        out.append((value, seen))
    if depth >= MAX_NESTING or isinstance(value, torch.Tensor):
        return
    items = value.values() if isinstance(value, dict) else value
    for k, item in enumerate(items):
        if k >= MAX_ITEMS:
            break
        if isinstance(item, WATCHED):
            _probes(item, depth + 1, out)


class ValueWatch:
    """The values one task call read from the context, to tell afterwards which it changed in place."""

    __slots__ = ("_watched",)

    def __init__(self) -> None:
        self._watched: Dict[Tuple[str, int], Tuple[str, Any, List[_Probe]]] = {}  # (attribute, id(value)) -> ...

    def watch(self, name: str, value: Any) -> None:
        """Remember ``value``, just read from attribute ``name`` (a value already watched is kept as it was)."""
        key = (name, id(value))
        if key not in self._watched:
            probes: List[_Probe] = []
            _probes(value, 0, probes)
            self._watched[key] = (name, value, probes)

    def changed(self, written: Optional[Set[int]] = None) -> List[str]:
        """The attributes whose watched values changed in place since they were read, in the order first read.

        ``written``: the storages the task's own operators wrote (seen on its thread); a tensor whose
        version moved but whose storage is not among them was changed by another thread meanwhile,
        and that change is the other task's write, not this one's.
        """
        found: List[str] = []
        for name, _, probes in self._watched.values():
            if name not in found and any(not _same(seen, _seen(obj)) and _own(obj, written) for obj, seen in probes):
                found.append(name)
        return found


def _own(obj: Any, written: Optional[Set[int]]) -> bool:
    """Whether a change of ``obj`` is the watching task's (``ValueWatch.changed``)."""
    return written is None or not isinstance(obj, torch.Tensor) or storage_key(obj) in written
