"""The memory a tensor covers, so that the checks compare what two names share, not the names.

A tensor's ``Region`` is its storage (identified while the storage is alive) and the span of
bytes ``[lo, hi)`` from its first element to the end of its last. Two regions *meet* when they
are in one storage and share a byte:

* one tensor under two names, or a view and its base, meet wherever their elements do;
* two rows of one buffer (``buf[0]``, ``buf[1]``) have disjoint spans and never meet, though
  they share one version counter, which every in-place operation on either bumps;
* two strided views whose spans interleave (columns 0 and 1 of a matrix) are compared byte
  by byte, up to ``EXACT_BYTES`` of overlapping span; beyond that they count as meeting.

``RegionIndex`` finds, for a region, the names whose regions it meets (the context attributes
or the named state a write reaches).
"""

from __future__ import annotations

import math
from typing import Dict, Generic, Iterable, List, NamedTuple, Optional, Tuple, TypeVar

import torch


__all__: List[str] = []

EXACT_BYTES = 1 << 22  # interleaved views are compared byte by byte up to this overlap; beyond, they meet

Name = TypeVar("Name")


class Region(NamedTuple):
    """A tensor's storage and the bytes ``[lo, hi)`` its elements span, with its geometry (not the tensor: a
    region keeps nothing alive)."""

    storage: int
    lo: int
    hi: int
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    itemsize: int

    @property
    def dense(self) -> bool:
        """Whether the elements cover every byte of the span (then spans decide alone)."""
        return self.hi - self.lo == math.prod(self.shape) * self.itemsize


def storage_key(tensor: torch.Tensor) -> Optional[int]:
    """Identifies a tensor's storage while it is alive (views share it); None for tensors without one."""
    try:
        if tensor.is_meta or tensor.layout is not torch.strided:
            return None
        return int(tensor.untyped_storage()._cdata)
    except Exception:  # wrapper subclasses, functional tensors
        return None


def region_of(tensor: torch.Tensor) -> Optional[Region]:
    """The memory ``tensor`` covers (None: no storage to compare, or no element). On the checks' hot path: one
    call per tensor an operator writes."""
    try:
        if tensor.is_meta or tensor.layout is not torch.strided or not tensor.numel():
            return None
        key = int(tensor.untyped_storage()._cdata)
        shape, stride, size = tuple(tensor.shape), tuple(tensor.stride()), tensor.element_size()
        lo = int(tensor.storage_offset()) * size
    except Exception:  # wrapper subclasses, functional tensors: no storage or strides to compare
        return None
    extent = 1
    for n, s in zip(shape, stride):
        extent += (n - 1) * s
    return Region(key, lo, lo + extent * size, shape, stride, size)


def meet(a: Region, b: Region) -> bool:
    """Whether two regions share a byte."""
    if a.storage != b.storage or a.hi <= b.lo or b.hi <= a.lo:
        return False
    if a.dense or b.dense:
        return True
    lo, hi = max(a.lo, b.lo), min(a.hi, b.hi)
    if hi - lo > EXACT_BYTES:
        return True
    return bool((_bytes_covered(a, lo, hi) & _bytes_covered(b, lo, hi)).any())


def _bytes_covered(region: Region, lo: int, hi: int) -> torch.Tensor:
    """A mask of the bytes in ``[lo, hi)`` that the region's elements cover."""
    size = region.itemsize
    count = (region.hi - region.lo) // size
    offsets = torch.arange(count).as_strided(region.shape, region.stride, 0).reshape(-1)  # in elements, from lo
    starts = region.lo + offsets * size
    mask = torch.zeros(hi - lo, dtype=torch.bool)
    for byte in range(size):
        at = starts + byte
        mask[at[(at >= lo) & (at < hi)] - lo] = True
    return mask


def regions_of(tensors: Iterable[torch.Tensor]) -> List[Region]:
    """The regions of the tensors that have one."""
    return [r for r in map(region_of, tensors) if r is not None]


class RegionIndex(Generic[Name]):
    """Names by the memory their tensors cover: which names a region meets."""

    def __init__(self, keep: bool = False) -> None:
        self._by_storage: Dict[int, List[Tuple[Region, Name]]] = {}
        self._kept: Optional[List[torch.Tensor]] = [] if keep else None  # keep=True: the tensors, alive

    def add(self, name: Name, tensor: torch.Tensor) -> Name:
        """Index ``tensor``'s memory under ``name``; returns the name it is known by (the first name given to
        exactly the same memory: one tensor reached by two paths is one name)."""
        found = region_of(tensor)
        if found is None:
            return name
        same = self._by_storage.setdefault(found.storage, [])
        for region, known in same:
            if region == found:
                return known
        same.append((found, name))
        if self._kept is not None:
            self._kept.append(tensor)
        return name

    def __contains__(self, storage: object) -> bool:
        return storage in self._by_storage

    def __bool__(self) -> bool:
        return bool(self._by_storage)

    def storages(self) -> Iterable[int]:
        return self._by_storage.keys()

    def meeting(self, region: Region) -> List[Name]:
        """The names whose memory ``region`` meets, in the order they were added (each once)."""
        found: List[Name] = []
        for other, name in self._by_storage.get(region.storage, ()):
            if name not in found and meet(region, other):
                found.append(name)
        return found
