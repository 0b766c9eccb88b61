"""Range annotations (``SWP/{Task}/iter{N}``) that cost nothing unless someone is looking.

``torch.profiler.record_function`` costs microseconds even with no profiler, and
``torch.cuda.nvtx`` raises on CPU builds, so a range is opened only when a torch
profiler is recording or NVTX emission was asked for on a CUDA device.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, ContextManager, List

import torch

__all__: List[str] = []

logger = logging.getLogger("swpipeline")

def _always() -> bool:
    return True


# A C function; ~0.1 us. Fall back to "always annotate" on a torch without it.
_profiler_enabled: Callable[[], bool] = getattr(torch.autograd, "_profiler_enabled", _always)


_range_push: Callable[[str], object] = torch.cuda.nvtx.range_push
_range_pop: Callable[[], object] = torch.cuda.nvtx.range_pop
emit_nvtx_context: Callable[[], ContextManager[object]] = torch.autograd.profiler.emit_nvtx


# ``_profiler_enabled()`` answers for the calling thread only, and is False on every thread for a
# profiler started with ``_ExperimentalConfig(profile_all_threads=True)``; the Python flag below is
# set by every Python-started torch profiler, whatever threads it records (see docs/observability.md).
_autograd_profiler = torch.autograd.profiler

if hasattr(_autograd_profiler, "_is_profiler_enabled"):
    def profiler_active() -> bool:
        """Whether a torch profiler is recording right now, on this thread or on all (about 0.05 us to ask)."""
        return _autograd_profiler._is_profiler_enabled or _profiler_enabled()
else:  # pragma: no cover - a torch without the flag
    def profiler_active() -> bool:
        """Whether a torch profiler is recording right now (about 0.1 us to ask)."""
        return bool(_profiler_enabled())


def nvtx_available() -> bool:
    return torch.cuda.is_available()


def run_annotated(label: str, fn: Callable[[Any], Any], ctx: Any, nvtx: bool) -> None:
    """Run ``fn(ctx)`` inside a profiler range and/or an NVTX range named ``label``."""
    if nvtx:
        _range_push(label)
    try:
        if profiler_active():
            with torch.profiler.record_function(label):
                fn(ctx)
        else:
            fn(ctx)
    finally:
        if nvtx:
            _range_pop()


def resolve_emit_nvtx(emit_nvtx: bool) -> bool:
    """NVTX is honoured on CUDA only; elsewhere a request is logged and ignored."""
    if emit_nvtx and not nvtx_available():
        logger.warning("emit_nvtx=True ignored: NVTX needs a CUDA build with a GPU")
        return False
    return bool(emit_nvtx)
