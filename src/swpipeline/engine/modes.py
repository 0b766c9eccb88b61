"""The caller's thread-local torch modes, carried to the threads that run its work.

Grad mode, inference mode and autocast are per thread in PyTorch, and a worker
thread starts with the defaults (grad on, no inference mode, no autocast). So a
pipeline captures the caller's modes each time it hands out work (``fill_pipeline``,
``progress``, ``advance``) and every thread runs that work under them, exactly as
the caller's own thread would (``run_serial``):

* carried: ``torch.is_grad_enabled()`` (``no_grad``, ``enable_grad``,
  ``set_grad_enabled``), ``torch.is_inference_mode_enabled()`` (``inference_mode``),
  and autocast per device type (enabled, dtype) for the CPU and the pipeline's
  accelerator;
* not carried: autocast's weight cache. torch keeps one cache of autocast's weight
  casts for the whole process, not one per thread: a cast one thread made (on a GPU,
  on that thread's stream, perhaps not yet computed) is handed to any other thread
  that casts the same weight, keeps its value after the weight changes in place, and
  is freed for all when any thread leaves its outermost autocast region, under
  kernels still reading it. So every task runs with the cache off
  (``torch.is_autocast_cache_enabled()`` is False inside a task, also in a task's own
  ``torch.autocast`` region and in ``run_serial``; on the caller's thread, for each
  driving call, its data iterator included): each cast is made where it is used,
  from the weight as it is then. The values are those a serial loop with autocast
  around its forward computes; the cost is one cast per use of a weight instead of one
  per region. The caller's own setting is left as it was;
* not carried either: the current stream (each task runs on its own), ``TorchFunctionMode``
  and dispatch modes and what is built on them (``with torch.device(...)`` as a
  default device, ``FlopCounterMode``, fake tensors), and process-wide settings that
  need no carrying (``set_default_dtype``, RNG state, ``torch.backends`` flags).

The common case, a caller at the defaults, is recognised when captured (``None``)
and costs the workers nothing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, List, Optional, Sequence, Tuple

import torch

__all__: List[str] = []

_any_autocast: Callable[[], bool] = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)

Autocast = Tuple[str, torch.dtype]  # (device type, dtype) of an enabled autocast


@dataclass(frozen=True)
class Modes:
    """A snapshot of the thread-local modes that differ from a fresh thread's."""

    grad: bool
    inference: bool
    autocast: Tuple[Autocast, ...]

    @classmethod
    def capture(cls, device_types: Sequence[str]) -> Optional["Modes"]:
        """The calling thread's modes, or None when they are a fresh thread's (nothing to carry)."""
        any_autocast = _any_autocast()
        grad = torch.is_grad_enabled()
        if grad and not any_autocast:  # the common case (inference mode turns grad off)
            return None
        autocast: Tuple[Autocast, ...] = ()
        if any_autocast:
            autocast = tuple((kind, torch.get_autocast_dtype(kind)) for kind in device_types
                             if torch.is_autocast_enabled(kind))
        inference = torch.is_inference_mode_enabled()
        if grad and not inference and not autocast:
            return None
        return cls(grad, inference, autocast)

    def applied(self) -> ContextManager[Any]:
        """A with-block that sets these modes on the calling thread (and restores the thread's own after)."""
        stack = contextlib.ExitStack()
        if self.inference:
            stack.enter_context(torch.inference_mode())
        else:
            stack.enter_context(torch.set_grad_enabled(self.grad))
        for kind, dtype in self.autocast:
            stack.enter_context(torch.autocast(kind, dtype=dtype, cache_enabled=False))
        return stack


def weight_cache_off() -> bool:
    """Turn the calling thread's autocast weight cache off (see above); returns whether it was on, for
    ``restore_weight_cache``. Two plain calls, no with-block: the caller's thread does this per driving call."""
    on = torch.is_autocast_cache_enabled()
    if on:
        torch.set_autocast_cache_enabled(False)
    return on


def restore_weight_cache(was_on: bool) -> None:
    if was_on:
        torch.set_autocast_cache_enabled(True)


def device_types(kind: str) -> Tuple[str, ...]:
    """The autocast device types worth capturing for a pipeline on a device of type ``kind``."""
    return ("cpu",) if kind == "cpu" else ("cpu", kind)
