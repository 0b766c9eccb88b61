"""Writes without an assignment: memory an operator wrote, and containers changed in place.

``ctx.x.mul_(2)``, ``ctx.batch["img"].div_(255)`` and ``ctx.log.append(item)`` assign
nothing, so a recording view of the context sees only reads. Two things tell the writes:

* **memory** (``attributes_meeting``): the tensors a task's operators wrote (in place or
  ``out=``, by their schema) covered, before each operator ran, some bytes of some storages
  (``memory.py``; a copy's new tensor covered none of what it copies); every
  context attribute whose value holds a tensor covering any of those bytes is written, by
  whatever name the task wrote through: ``ctx.y = ctx.x`` then ``ctx.y.add_(1)`` writes
  ``ctx.x`` too, a view ``ctx.x[:2]`` changed in place writes ``ctx.x``, and two disjoint
  rows of one buffer never write each other (though they share one version counter); a
  tensor pointed at other memory (``ctx.x.set_(y)``) writes the attributes holding it;
* **containers** (``ValueWatch``): for each value a task reads from the context, the
  identity of each item (and key) of a list, set, deque or dict, so an append, a removal,
  an item replaced or a key added is a write of the attribute it was read from. For a
  serial run (``analyze``) it also compares tensors' version counters, to catch a write no
  operator reported (native code that bumps the counter behind the dispatcher).

Both look down to ``MAX_NESTING`` levels below an attribute's value, at most ``MAX_ITEMS``
items per container. The probes keep the items they compare alive, so an address reused
by a new object never hides a replacement.

What neither can see: a write through memory torch does not count (``t.data``,
``t.numpy()``, a pointer handed to native code); tensors without a version counter (made
under ``torch.inference_mode``) written behind the dispatcher; attributes of other objects;
containers nested deeper than ``MAX_NESTING`` or past the first ``MAX_ITEMS`` items.
"""

from __future__ import annotations

import collections
import operator
from typing import AbstractSet, Any, Dict, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Tuple

import torch

from .memory import Region, meet, region_of, storage_key

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
    """The values one task call read from the context, to tell afterwards which containers it changed in place."""

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

    def changed(self, reported: Optional[AbstractSet[int]] = None) -> List[str]:
        """The attributes whose watched containers changed since they were read, in the order first read.

        ``reported``: in a serial run (every change is the task's own), the storages the task's
        operators were seen writing; a tensor whose version counter moved though its storage is
        not among them was written behind the dispatcher, and changes its attribute too. None:
        tensors are left to ``attributes_meeting``.
        """
        found: List[str] = []
        for name, _, probes in self._watched.values():
            if name not in found and any(_changed(obj, seen, reported) for obj, seen in probes):
                found.append(name)
        return found


def _changed(obj: Any, seen: Any, reported: Optional[AbstractSet[int]]) -> bool:
    if isinstance(obj, torch.Tensor):
        return reported is not None and seen != _version(obj) and storage_key(obj) not in reported
    return not _same(seen, _seen(obj))


def tensors_within(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """The tensors a context attribute's value holds, down to ``MAX_NESTING`` levels, ``MAX_ITEMS`` per container."""
    if isinstance(value, torch.Tensor):
        yield value
        return
    if depth >= MAX_NESTING or not isinstance(value, WATCHED):
        return
    items = value.values() if isinstance(value, dict) else value
    for k, item in enumerate(items):
        if k >= MAX_ITEMS:
            break
        yield from tensors_within(item, depth + 1)


class Written(NamedTuple):
    """What a task's operators wrote: the memory that existed before each write, and the tensor objects they
    pointed at other memory (``set_``) or that covered none (an empty tensor resized), kept alive."""

    regions: List[Region]
    rebound: List[torch.Tensor]

    @classmethod
    def of(cls, writes: Iterable[Tuple[torch.Tensor, Optional[Region]]]) -> "Written":
        """From an observer's ``(tensor, the memory it covered before the write)`` pairs."""
        regions: List[Region] = []
        rebound: List[torch.Tensor] = []
        for tensor, region in writes:
            if region is None:
                rebound.append(tensor)
            else:
                regions.append(region)
        return cls(regions, rebound)


def attributes_meeting(attributes: Mapping[str, Any], written: Written) -> List[str]:
    """The attributes whose values hold a tensor covering memory written, or a tensor rebound (in the mapping's
    order)."""
    by_storage: Dict[int, List[Region]] = {}
    for region in written.regions:
        by_storage.setdefault(region.storage, []).append(region)
    rebound = {id(tensor) for tensor in written.rebound}
    found = []
    for name, value in attributes.items():
        for tensor in tensors_within(value):
            if id(tensor) in rebound:
                found.append(name)
                break
            near = by_storage.get(storage_key(tensor) or 0)
            if near:
                mine = region_of(tensor)
                if mine is not None and any(meet(mine, region) for region in near):
                    found.append(name)
                    break
    return found
