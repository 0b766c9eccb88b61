"""Each partition's streams, and the rules for tensors that cross streams.

Partition ``k`` computes on stream ``compute{k}`` and receives on stream ``copy{k}``
(activations in forward, gradients in backward), both created by the engine from
their names, so the forward and the backward pipeline share them. On the CPU a
stream is an execution lane and nothing here does more than the copies.

On an accelerator the engine orders the tasks of one pass (a device event per
declared dependency). What lies outside a pass is ordered here:

* ``fence_in``: before a pass, every partition stream waits for the caller's
  current stream, where the input, the incoming gradients and the parameters
  (just updated by an optimizer, say) were written;
* ``fence_out``: after it, the caller's current stream waits for every partition
  stream, so what the caller does next sees the pass's results;
* a tensor allocated on one stream and used on another is recorded on the user
  stream (``record_stream``): the caching allocator then does not reuse its memory
  until that stream is done with it, whenever the tensor is freed.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..devices.device import Device

__all__: List[str] = []


def compute_stream(partition: int) -> str:
    return f"compute{partition}"


def copy_stream(partition: int) -> str:
    return f"copy{partition}"


class PartitionStreams:
    """The compute and copy streams of every partition on the engine's device.

    Args:
        device: the engine's device (shared by the forward and the backward pipeline).
        accelerator: the accelerator the partitions use, or None when all are on the CPU.
        num_partitions: how many partitions.
    """

    def __init__(self, device: Device, accelerator: Optional[torch.device], num_partitions: int) -> None:
        self.device, self.accelerator, self.num_partitions = device, accelerator, num_partitions

    @property
    def on_accelerator(self) -> bool:
        return self.accelerator is not None

    def compute(self, partition: int) -> Any:
        return self.device.stream(compute_stream(partition))

    def copy(self, partition: int) -> Any:
        return self.device.stream(copy_stream(partition))

    def _all(self) -> List[Any]:
        return [s for k in range(self.num_partitions) for s in (self.compute(k), self.copy(k))]

    def fence_in(self) -> None:
        """Every partition stream waits for the caller's current stream."""
        if self.accelerator is None:
            return
        current = torch.accelerator.current_stream(self.accelerator)
        for stream in self._all():
            stream.wait_stream(current)

    def fence_out(self, handed_back: Sequence[Optional[Tensor]] = ()) -> None:
        """The caller's current stream waits for every partition stream; ``handed_back`` is recorded on it."""
        if self.accelerator is None:
            return
        current = torch.accelerator.current_stream(self.accelerator)
        for stream in self._all():
            current.wait_stream(stream)
        record(handed_back, current)

    def move(self, tensors: Sequence[Optional[Tensor]], device: torch.device,
             user: int) -> Tuple[Optional[Tensor], ...]:
        """Copy ``tensors`` to ``device`` on the current (copy) stream, for partition ``user`` to compute on.

        A copy to the CPU blocks until it is done (the CPU reads it next); a copy to an
        accelerator is asynchronous. None stays None. Same-device tensors are not copied.
        """
        moved = tuple(None if t is None else t.to(device, non_blocking=device.type != "cpu") for t in tensors)
        if self.accelerator is not None:
            record(tensors, self.copy(user))
            record(moved, self.compute(user))
        return moved


def record(tensors: Sequence[Optional[Tensor]], stream: Any) -> None:
    """Tell the caching allocator that ``stream`` uses these tensors (accelerator tensors on its device only)."""
    device = getattr(stream, "device", None)
    for tensor in tensors:
        if tensor is not None and tensor.device.type != "cpu" and tensor.device == device:
            tensor.record_stream(stream)
