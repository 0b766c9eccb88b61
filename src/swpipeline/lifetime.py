"""Cross-stream memory lifetime: tensors handed from one stream to another stay valid until read.

On an accelerator, a tensor made on stream A belongs to A's memory pool. When its last
reference goes, the caching allocator lets A reuse the block at once, while kernels
another stream B was given earlier may still be reading it: events order B after A,
never A's *reuse* after B. So whenever a task leaves tensors on the context for tasks on
other streams, the engine marks each of them as in use by those streams
(``Device.keep_alive``, i.e. ``Tensor.record_stream``): the block is then reused only
once the streams have done the work submitted to them before it was freed.

Which tensors, and for which streams:

* after a unit of task ``P`` runs, the tensors it wrote to the context (new or replaced
  attributes, and tensors inside them: lists, tuples, dicts, objects' attributes), kept
  for the stream of every task that depends on ``P``, directly or through other tasks,
  within the iteration or in the next one, other than ``P``'s own stream;
* a sink on a side stream (no task depends on it): also for the caller's stream, which
  reads the retired iteration.

What stays the user's: tensors kept anywhere but on the context (a list outside the
plan, a module's attribute) and read on another stream need ``record_stream`` by hand.

The trade-off: the alternative would hold every retired context until an event on
every stream had passed (memory freed in order, later); marking tensors frees each block
as soon as its readers are done, so peak memory stays near a serial loop's, at the cost
of one ``record_stream`` per tensor and consumer stream (microseconds, on devices that
track memory only).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Sequence, Set

import torch

from .device import Device

__all__: List[str] = []

_MAX_DEPTH = 6
_MISSING = object()


def written_since(attrs: Dict[str, Any], before: Dict[str, Any]) -> List[Any]:
    """The values in ``attrs`` that are new or replaced compared with the snapshot ``before``."""
    return [value for name, value in attrs.items() if before.get(name, _MISSING) is not value]


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor reachable from ``value`` through containers and plain objects' attributes (not modules)."""
    seen: Set[int] = set()
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, torch.Tensor):
            yield item
            continue
        if depth >= _MAX_DEPTH or id(item) in seen or isinstance(item, (str, bytes, int, float, torch.nn.Module)):
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            children: Sequence[Any] = list(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = list(item)
        elif hasattr(item, "__dict__"):
            children = list(vars(item).values())
        else:
            children = [getattr(item, slot, None) for slot in getattr(type(item), "__slots__", ())]
        stack.extend((child, depth + 1) for child in children)


def keep_written(device: Device, attrs: Dict[str, Any], before: Dict[str, Any], streams: Sequence[Any]) -> None:
    """Keep every tensor written since ``before`` alive for each of ``streams``."""
    for value in written_since(attrs, before):
        for tensor in tensors_in(value):
            for stream in streams:
                device.keep_alive(tensor, stream)
