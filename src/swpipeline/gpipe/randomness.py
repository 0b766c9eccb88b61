"""Random numbers per cell, so that a checkpointed partition recomputes exactly what it drew.

A *cell* is one partition working on one micro-batch. Partitions run on several
threads at once, and torch's default generator is one per device, shared by every
thread: two partitions drawing at the same moment would interleave their draws,
so a Dropout mask would depend on thread timing, and a partition recomputed in
backward could not draw the forward's mask again.

So in training mode each cell runs under ``CellRandomness``, a dispatch mode
that gives every random operator the cell's own generator. The cell's generator
is seeded from the run's seed and the cell's place, ``(micro-batch, partition)``:

    run seed  s = one draw from the default CPU generator, taken by the first cell that draws
    cell seed   = mix(s, micro-batch, partition)          (the same in forward and in recompute)

Saving the generator state for recomputation is therefore remembering the cell's
place; restoring it is seeding a fresh generator the same way. The default
generators are never rewound, and a forward pass takes one draw from the CPU one
only if some cell draws at all. Results are reproducible under ``torch.manual_seed``
and independent of thread timing; the masks differ from those of the un-partitioned
model (whose single forward draws them in another order and shape).

An operator that takes no ``generator`` argument (CUDA's fused dropout kernel) is
run with the device's default generator set to the cell's state, under one lock
shared by all cells, and the default generator's own state put back afterwards.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Type

import torch

if TYPE_CHECKING:
    class _DispatchMode:
        """What this module uses of torch's (untyped) TorchDispatchMode."""

        def __init__(self) -> None: ...

        def __enter__(self) -> "_DispatchMode": ...

        def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                     tb: Optional[TracebackType]) -> None: ...
else:
    from torch.utils._python_dispatch import TorchDispatchMode as _DispatchMode

__all__: List[str] = []

_MASK64 = (1 << 64) - 1
_DEFAULT_GENERATOR_LOCK = threading.Lock()


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def cell_seed(run_seed: int, micro_batch: int, partition: int) -> int:
    """The seed of cell ``(micro_batch, partition)``, a 64-bit mix of the three numbers."""
    return _splitmix64(run_seed ^ _splitmix64((micro_batch << 24) ^ partition))


class RunSeed:
    """One forward pass's seed: drawn from the default CPU generator when a cell first needs it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: Optional[int] = None

    def value(self) -> int:
        with self._lock:
            if self._value is None:
                self._value = int(torch.randint(0, 2**62, ()).item())
            return self._value


def _device_of(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> torch.device:
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device)
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.get_default_device()


def _takes_generator(func: Any) -> bool:
    return any(arg.name == "generator" and arg.kwarg_only for arg in func._schema.arguments)


def _default_generator(device: torch.device) -> Optional[torch.Generator]:
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        generator: torch.Generator = torch.cuda.default_generators[index]
        return generator
    return None


class CellRandomness(_DispatchMode):
    """Within the block, random operators draw from this cell's generators (one per device).

    Args:
        seed: the run's seed.
        micro_batch, partition: the cell's place.
    """

    def __init__(self, seed: RunSeed, micro_batch: int, partition: int) -> None:
        super().__init__()
        self._seed, self._place = seed, (micro_batch, partition)
        self._generators: Dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        generator = self._generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device)
            generator.manual_seed(cell_seed(self._seed.value(), *self._place))
            self._generators[device] = generator
        return generator

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
            return func(*args, **kwargs)
        if _takes_generator(func):
            if kwargs.get("generator") is None:
                kwargs = {**kwargs, "generator": self._generator(_device_of(args, kwargs))}
            return func(*args, **kwargs)
        return self._with_default_generator(func, args, kwargs)

    def _with_default_generator(self, func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        device = _device_of(args, kwargs)
        default = _default_generator(device)
        if default is None:  # a backend without a default generator we can swap: draw as torch would
            return func(*args, **kwargs)
        own = self._generator(device)
        with _DEFAULT_GENERATOR_LOCK:
            saved = default.get_state()
            default.set_state(own.get_state())
            try:
                return func(*args, **kwargs)
            finally:
                own.set_state(default.get_state())
                default.set_state(saved)
