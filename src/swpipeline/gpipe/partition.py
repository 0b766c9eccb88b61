"""Splitting an ``nn.Sequential`` into partitions, and placing them on devices.

The checks here are the constructor's: the module, ``balance``, ``chunks``,
``checkpoint`` and ``devices``. Every message names the argument, shows the
offending value and says what to do instead.

Where partitions may live: every partition on the CPU, or on one accelerator
device (several partitions may share it: each still gets its own streams and
thread), or a mix of the CPU and that one device. The engine drives one
accelerator per pipeline, so partitions on two different accelerator devices are
refused.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from typing import Iterable, List, Optional, Sequence, Union

import torch
from torch import nn

from ..devices.device import machine_accelerator

__all__: List[str] = []

DeviceLike = Union[torch.device, int, str]

CHECKPOINT_MODES = ("always", "except_last", "never")


def check_module(module: object) -> nn.Sequential:
    """The module, if it can be partitioned.

    Raises:
        TypeError: not an ``nn.Sequential``.
        ValueError: a layer appears twice, or two layers share a parameter.
    """
    if not isinstance(module, nn.Sequential):
        raise TypeError(f"module must be an nn.Sequential (its layers are split into partitions), got "
                        f"{type(module).__name__}; wrap the layers in nn.Sequential(...)")
    children = list(module.named_children())
    if len(children) != len(module):
        raise ValueError(f"module: nn.Sequential of {len(module)} layers holds only {len(children)} distinct "
                         f"modules (a layer appears twice); each layer must be its own module to be placed")
    shared = len(list(module.parameters())) != sum(len(list(c.parameters())) for c in module.children())
    if shared:
        raise ValueError("module: two layers share a parameter; partitions are trained on separate threads and "
                         "devices, so each parameter must belong to exactly one layer")
    return module


def check_balance(balance: Optional[Iterable[int]], num_layers: int) -> List[int]:
    """``balance`` as a list of positive ints summing to ``num_layers``.

    Raises:
        TypeError: ``balance`` is not an iterable of ints.
        ValueError: missing, a non-positive entry, or a sum other than ``num_layers``.
    """
    if balance is None:
        raise ValueError(f"balance is required: the number of layers in each partition, e.g. balance="
                         f"{_example_balance(num_layers)} for this module of {num_layers} layers")
    if isinstance(balance, (str, bytes)) or not isinstance(balance, Iterable):
        raise TypeError(f"balance must be a list of ints (layers per partition), got {type(balance).__name__}")
    values = list(balance)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"balance must hold ints (layers per partition), got {values!r}")
    if any(v <= 0 for v in values):
        raise ValueError(f"balance={values}: every partition needs at least one layer; drop the zero and "
                         f"negative entries")
    if sum(values) != num_layers:
        raise ValueError(f"balance={values} sums to {sum(values)} but the module has {num_layers} layers; make "
                         f"the entries add up to {num_layers}, e.g. {_example_balance(num_layers)}")
    return values


def _example_balance(num_layers: int) -> List[int]:
    half = max(num_layers // 2, 1)
    return [half, num_layers - half] if num_layers > 1 else [num_layers]


def check_chunks(chunks: object) -> int:
    """``chunks`` as an int >= 1: an int, or a float with a whole value (``8.0``, as torchgpipe accepts).

    Raises:
        TypeError: not a number (a bool or a str is refused too).
        ValueError: a float with a fractional part, or below 1.
    """
    if isinstance(chunks, float) and not isinstance(chunks, bool):
        if not chunks.is_integer():
            raise ValueError(f"chunks={chunks!r} is not a whole number of micro-batches; use an int such as "
                             f"chunks={max(int(chunks), 1)}")
        chunks = int(chunks)
    elif not isinstance(chunks, (int, bool)) and hasattr(type(chunks), "__index__"):  # e.g. numpy.int64
        chunks = operator.index(chunks)  # type: ignore[arg-type]
    if isinstance(chunks, bool) or not isinstance(chunks, int):
        raise TypeError(f"chunks must be an int (micro-batches per mini-batch), got {type(chunks).__name__} "
                        f"{chunks!r}")
    if chunks < 1:
        raise ValueError(f"chunks={chunks}: a mini-batch is split into at least one micro-batch; use chunks >= 1")
    return chunks


def check_checkpoint(checkpoint: object) -> str:
    """``checkpoint`` as one of ``CHECKPOINT_MODES``, a plain ``str``.

    A str-like object (a ``str`` subclass, or one whose class defines ``__str__``) is taken
    as ``str(checkpoint)``, as torchgpipe takes it.

    Raises:
        TypeError: not a str, nor an object whose str() gives one (``None``, a number, bytes).
        ValueError: an unknown mode.
    """
    if not _str_like(checkpoint):
        raise TypeError(f"checkpoint must be a str (or an object whose str() is one), one of "
                        f"{', '.join(map(repr, CHECKPOINT_MODES))}; got {type(checkpoint).__name__} {checkpoint!r}")
    mode = str(checkpoint)
    if mode not in CHECKPOINT_MODES:
        raise ValueError(f"checkpoint={mode!r} is not a checkpoint mode; use 'always' (recompute every "
                         f"micro-batch in backward), 'except_last' (all but the last) or 'never'")
    return mode


def _str_like(value: object) -> bool:
    """A str, or an object whose class says what it is as text (its own ``__str__``); bytes are not text."""
    if isinstance(value, str):
        return True
    return not isinstance(value, (bytes, bytearray)) and type(value).__str__ is not object.__str__


class TooFewDevicesError(ValueError, IndexError):
    """Fewer devices than partitions: a ValueError (a wrong argument), and an IndexError as torchgpipe raises."""


def resolve_devices(devices: Optional[Iterable[DeviceLike]], num_partitions: int) -> List[torch.device]:
    """One torch.device per partition.

    ``None``: one partition per accelerator device (``cuda:0``, ``cuda:1``, ...) when the
    machine has an accelerator, else every partition on the CPU.

    Raises:
        TypeError: an entry is not a device, an int or a str.
        ValueError: fewer devices than partitions (``TooFewDevicesError``, also an IndexError), an
            unknown device, or two accelerator devices.
    """
    if devices is None:
        accel = machine_accelerator()
        if accel is None:
            resolved = [torch.device("cpu")] * num_partitions
        else:
            resolved = [torch.device(accel.type, i) for i in range(torch.accelerator.device_count())]
    else:
        if isinstance(devices, (str, bytes, torch.device)) or not isinstance(devices, Iterable):
            raise TypeError(f"devices must be a list of devices (one per partition), got {type(devices).__name__} "
                            f"{devices!r}; e.g. devices=['cpu'] * {max(num_partitions, 1)}")
        resolved = [_one_device(d) for d in devices]
    if len(resolved) < num_partitions:
        shown = [str(d) for d in resolved]
        raise TooFewDevicesError(f"devices={shown} holds {len(resolved)} device(s) for {num_partitions} partitions; "
                                 f"give one per partition (a device may repeat, e.g. devices=['cpu'] * "
                                 f"{num_partitions})")
    resolved = resolved[:num_partitions]
    accelerators = sorted({str(d) for d in resolved if d.type != "cpu"})
    if len(accelerators) > 1:
        raise ValueError(f"devices: partitions on {len(accelerators)} accelerator devices ({', '.join(accelerators)}); "
                         f"a pipeline drives one accelerator: place the partitions on one of them (each partition "
                         f"still gets its own streams and thread) and on the cpu")
    return resolved


def _one_device(spec: object) -> torch.device:
    if isinstance(spec, torch.device):
        device = spec
    elif isinstance(spec, bool) or not isinstance(spec, (int, str)):
        raise TypeError(f"devices: each entry must be a torch.device, an int or a str such as 'cpu' or 'cuda:0', "
                        f"got {type(spec).__name__} {spec!r}")
    else:
        try:
            device = torch.device(spec)
        except RuntimeError as exc:
            raise ValueError(f"devices: {spec!r} is not a device torch knows ({exc})") from None
    if device.type == "cpu":
        return torch.device("cpu")  # "cpu:0" and "cpu" are one device
    accel = machine_accelerator()
    if accel is None or accel.type != device.type:
        raise ValueError(f"devices: {str(device)!r} requested but this machine's accelerator is "
                         f"{accel.type if accel is not None else 'absent'}; use 'cpu' or that accelerator")
    index: Optional[int] = device.index  # None for a bare "cuda" (the stubs say int)
    if index is None:
        return torch.device(device.type, torch.accelerator.current_device_index())
    if index >= torch.accelerator.device_count():
        raise ValueError(f"devices: {str(device)!r} requested but only {torch.accelerator.device_count()} "
                         f"{device.type} device(s) exist")
    return device


def split_module(module: nn.Sequential, balance: Sequence[int], devices: Sequence[torch.device]) -> nn.ModuleList:
    """The partitions: ``balance[k]`` consecutive layers each, moved to ``devices[k]``, keeping the layers' names."""
    layers = list(module.named_children())
    partitions: List[nn.Module] = []
    start = 0
    for size, device in zip(balance, devices):
        partition = nn.Sequential(OrderedDict(layers[start:start + size]))
        partitions.append(partition.to(device))
        start += size
    return nn.ModuleList(partitions)
