"""GPipe: an ``nn.Sequential`` trained with micro-batch pipeline parallelism, on the swpipeline engine.

``GPipe(module, balance, devices=..., chunks=..., checkpoint=...)`` splits the
layers into partitions and runs each mini-batch as ``chunks`` micro-batches
through two plans (``plans.py``): a forward plan in which partition ``k`` is at
stage ``k`` (so it works on micro-batch ``m`` in clock cycle ``m + k``), and a
backward plan that sends the gradients back the same way, started by autograd
when it reaches the gathered output (``autograd.py``). Each partition has its own
thread group and its own streams, so on the CPU partitions compute in parallel as
far as their work releases the GIL (torch operators do).

One forward call::

    caller:      split input -> fence_in -> engine.run(micro-batches) -> fence_out -> gathered output
    engine:      period p: partition k runs Copy{k}, Forward{k} on micro-batch p - k

On an accelerator the backward plan runs on the thread that runs autograd's
backward (one thread group for all partitions, still on their own streams): torch
runs an accelerator's backward operators on one engine thread per device, and that
thread is the one waiting for the plan, so it must do the plan's work itself.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Union

import torch
from torch import nn

from ..devices.device import CPUDevice, Device, TorchDevice
from ..engine.clocked import SWPipeline
from .autograd import BackwardPass, gathered
from .cells import MicroBatch, MiniBatch
from .checkpoint import checkpoint_stop
from .microbatch import Tensors, TensorOrTensors, from_tuple, gather, scatter, to_tuple
from .partition import (DeviceLike, check_balance, check_checkpoint, check_chunks, check_module, resolve_devices,
                        split_module)
from .plans import backward_plan, forward_plan, thread_group
from .randomness import RunSeed
from .schedule_table import backward_label, forward_label, relabel
from .streams import PartitionStreams

__all__: List[str] = []

# Seconds a task may wait for another, and the caller for a micro-batch: generous, since one
# partition on one micro-batch of a large model may take minutes on a CPU.
_TIMEOUT_S = 600.0
_ACCELERATOR_GROUP = "autograd"


@dataclass
class _Engines:
    """What a GPipe builds on first use (and drops when copied or pickled): its two pipelines."""

    forward: SWPipeline
    backward: BackwardPass
    streams: PartitionStreams
    lock: threading.Lock


class GPipe(nn.Module):
    """Wraps an ``nn.Sequential`` to train it with GPipe's micro-batch pipeline parallelism.

    ::

        model = GPipe(nn.Sequential(a, b, c, d), balance=[2, 2], devices=["cpu", "cpu"], chunks=8)
        output = model(input)          # the same output as the un-partitioned module's
        loss_fn(output).backward()     # gradients reach every layer's parameters and the input

    Args:
        module: the layers, in order.
        balance: the number of layers in each partition (their sum is ``len(module)``).
        devices: where each partition lives (a device may repeat). Default: one partition per
            accelerator device when there is one, else every partition on the CPU.
        chunks: micro-batches per mini-batch (the input is split along dimension 0): an int, or a
            float with a whole value (``8.0``), as torchgpipe accepts.
        checkpoint: ``"always"``, ``"except_last"`` or ``"never"``: which micro-batches' activations
            are recomputed in backward instead of kept (in training mode only; see the GPipe guide).
            A str-like object (one whose ``str()`` is a mode) is taken as ``str(checkpoint)``, as
            torchgpipe takes it.

    Raises:
        TypeError: ``module`` is not an ``nn.Sequential``, or an argument has the wrong type.
        ValueError: ``balance`` does not match the module, ``chunks`` below 1 or not whole, an unknown
            checkpoint mode, fewer devices than partitions (an error that is also an ``IndexError``,
            which torchgpipe raises there), or partitions on two accelerator devices.
    """

    balance: List[int]
    devices: List[torch.device]
    chunks: int
    checkpoint: str

    def __init__(self, module: nn.Sequential, balance: Optional[Iterable[int]] = None, *,
                 devices: Optional[Iterable[DeviceLike]] = None, chunks: int = 1,
                 checkpoint: str = "except_last") -> None:
        super().__init__()
        module = check_module(module)
        self.chunks = check_chunks(chunks)
        self.checkpoint = check_checkpoint(checkpoint)
        self.balance = check_balance(balance, len(module))
        self.devices = resolve_devices(devices, len(self.balance))
        self.partitions = split_module(module, self.balance, self.devices)
        self._engines: Optional[_Engines] = None

    # -- the sequence of layers ---------------------------------------------------------------

    def __len__(self) -> int:
        """The number of layers."""
        return sum(self.balance)

    def __getitem__(self, index: int) -> nn.Module:
        """The layer at ``index`` of the un-partitioned module (negative indices count from the end)."""
        layers = list(self)
        if not -len(layers) <= index < len(layers):
            raise IndexError(f"layer index {index} is out of range for a module of {len(layers)} layers")
        return layers[index]

    def __iter__(self) -> Iterator[nn.Module]:
        """The layers, in order."""
        for partition in self.partitions:
            yield from partition.children()

    # -- placement belongs to GPipe -----------------------------------------------------------

    def cuda(self, device: Optional[Union[int, torch.device]] = None) -> "GPipe":
        raise _moving_denied("cuda()")

    def cpu(self) -> "GPipe":
        raise _moving_denied("cpu()")

    def to(self, *args: Any, **kwargs: Any) -> "GPipe":
        """Only a dtype conversion (``to(torch.float64)``); a device move is refused (see ``devices``)."""
        if "device" in kwargs or "tensor" in kwargs:
            raise _moving_denied("to(device)")
        if args and (isinstance(args[0], (torch.device, int, str)) or isinstance(args[0], torch.Tensor)):
            raise _moving_denied(f"to({args[0]!r})")
        super().to(*args, **kwargs)
        return self

    # -- the engines ---------------------------------------------------------------------------

    def _ensure_engines(self) -> _Engines:
        if self._engines is None:
            count = len(self.partitions)
            accelerator = next((d for d in self.devices if d.type != "cpu"), None)
            device: Device = CPUDevice() if accelerator is None else TorchDevice(accelerator)
            one_thread = _ACCELERATOR_GROUP if accelerator is not None else None
            forward = SWPipeline(forward_plan(count), device, caller_thread_group=thread_group(count - 1),
                                 signal_timeout=_TIMEOUT_S, progress_timeout=_TIMEOUT_S)
            backward = SWPipeline(backward_plan(count, one_thread), device,
                                  caller_thread_group=one_thread or thread_group(0),
                                  signal_timeout=_TIMEOUT_S, progress_timeout=_TIMEOUT_S)
            streams = PartitionStreams(device, accelerator, count)
            lock = threading.Lock()  # one pass at a time: a pass swaps the partitions' parameters for aliases
            self._engines = _Engines(forward, BackwardPass(backward, lock), streams, lock)
        return self._engines

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_engines"] = None  # threads, locks and streams are rebuilt by the copy on first use
        return state

    @property
    def forward_pipeline(self) -> SWPipeline:
        """The forward plan's engine (for ``print_schedule``, ``tracing()``, ``timeline``)."""
        return self._ensure_engines().forward

    @property
    def backward_pipeline(self) -> SWPipeline:
        """The backward plan's engine (iteration ``r`` is micro-batch ``chunks-1-r``)."""
        return self._ensure_engines().backward.pipeline

    def format_schedule(self, chunks: Optional[int] = None) -> str:
        """Both plans' schedules for one mini-batch of ``chunks`` micro-batches (default ``self.chunks``).

        Each table has a row per task and a column per clock period; a cell names the
        micro-batch the task works on in that period (``m3``), or ``--``.

        Raises:
            ValueError: ``chunks`` below 1, or the module has no layers.
        """
        count = self.chunks if chunks is None else check_chunks(chunks)
        if not self.partitions:
            raise ValueError("format_schedule(): this GPipe has no partitions (an empty module) and runs no plan")
        last = len(self.partitions) - 1
        engines = self._ensure_engines()
        forward = relabel(engines.forward.format_schedule(count + last), forward_label(count))
        backward = relabel(engines.backward.pipeline.format_schedule(count + last), backward_label(count))
        backward_rule = f"Backward{{k}} works on micro-batch m in period ({count - 1} - m) + ({last} - k)"
        return (f"forward: Forward{{k}} works on micro-batch m in period m + k\n{forward}\n\n"
                f"backward: {backward_rule}\n{backward}")

    def print_schedule(self, chunks: Optional[int] = None) -> None:
        """Print ``format_schedule(chunks)``."""
        print(self.format_schedule(chunks))

    # -- forward -------------------------------------------------------------------------------

    def forward(self, input: TensorOrTensors) -> TensorOrTensors:
        """Run the mini-batch through the partitions as micro-batches; returns the gathered output.

        Args:
            input: a tensor or a tuple of tensors, split along dimension 0.

        Returns:
            The last partition's outputs, concatenated along dimension 0 (a tensor or a tuple,
            as the last partition returns). Backpropagating through it runs the backward plan.

        Raises:
            TypeError: the input, or what a partition returns, is not a tensor or a tuple of tensors.
            ValueError: an input tensor has no batch dimension, or the tensors' batch sizes differ
                (refused before any partition runs).
            RuntimeError: from ``backward()``, a checkpointed partition that wrote to its input in
                place in forward (it cannot be recomputed from it; torchgpipe fails there too).
            Exception: whatever a partition raised, with notes naming its task, partition and
                micro-batch (the same for an error in backward, raised from ``backward()``).
        """
        tensors, atomic = to_tuple(input, "GPipe input")
        if not self.partitions:
            return input
        engines = self._ensure_engines()
        mini = self._mini_batch(tensors, engines.streams)
        pieces = scatter(tensors, self.chunks)
        mini.micro_batches = [MicroBatch(m, mini, piece, atomic) for m, piece in enumerate(pieces)]
        with engines.lock:
            engines.streams.fence_in()
            engines.forward.run(list(mini.micro_batches))
        mini.output_atomic = mini.micro_batches[0].atomic
        engines.streams.fence_out([t for mb in mini.micro_batches for t in mb.value])
        if mini.records_graph:
            result: TensorOrTensors = gathered(engines.backward, mini)
            return result
        return from_tuple(gather([mb.value for mb in mini.micro_batches]), mini.output_atomic)

    def _mini_batch(self, tensors: Tensors, streams: PartitionStreams) -> MiniBatch:
        grad_enabled = torch.is_grad_enabled()
        named = [[(n, p) for n, p in partition.named_parameters() if p.requires_grad and grad_enabled]
                 for partition in self.partitions]
        params = [[p for _, p in pairs] for pairs in named]
        needs_grad: List[bool] = []
        flowing = grad_enabled and any(t.requires_grad for t in tensors)
        for partition_params in params:
            needs_grad.append(flowing)
            flowing = flowing or bool(partition_params)
        stop = checkpoint_stop(self.checkpoint, self.chunks, self.training, grad_enabled) if flowing else 0
        device_types = dict.fromkeys(["cpu", *(d.type for d in self.devices)])
        autocast = tuple((t, torch.get_autocast_dtype(t)) for t in device_types if torch.is_autocast_enabled(t))
        return MiniBatch(tensors, list(self.partitions), self.devices, streams, grad_enabled, stop, needs_grad,
                         params, [[n for n, _ in pairs] for pairs in named], RunSeed() if self.training else None,
                         autocast)


def _moving_denied(call: str) -> TypeError:
    return TypeError(f"GPipe.{call}: GPipe places each partition on its device itself (the devices argument); "
                     f"build a new GPipe with other devices instead of moving it")
