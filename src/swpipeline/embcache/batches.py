"""Moving a batch of any shape to the device, and telling the caching allocator which stream uses it.

A batch is a tensor, a dict, list, tuple or named tuple of batches, a dataclass, an
object with a ``to(device, non_blocking=...)`` method (TorchRec's ``Pipelineable``
batches have one), or anything else, which is left as it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List

import torch

__all__: List[str] = []


def _map(batch: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: _map(v, fn) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(_map(v, fn) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map(v, fn) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: _map(getattr(batch, f.name), fn)
                                             for f in dataclasses.fields(batch) if f.init})
    return batch


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor on ``device`` (asynchronous copies where the source is pinned)."""
    mover = getattr(batch, "to", None)
    if not isinstance(batch, torch.Tensor) and callable(mover) and not dataclasses.is_dataclass(batch):
        return mover(device, non_blocking=True)
    return _map(batch, lambda t: t.to(device, non_blocking=True))


def record_stream(batch: Any, stream: Any) -> None:
    """Mark every device tensor of ``batch`` as used by ``stream`` (``Tensor.record_stream``); skips CPU tensors."""
    recorder = getattr(batch, "record_stream", None)
    if not isinstance(batch, torch.Tensor) and callable(recorder):
        recorder(stream)
        return

    def record(tensor: torch.Tensor) -> None:
        if tensor.device.type != "cpu":
            tensor.record_stream(stream)

    _map(batch, record)
