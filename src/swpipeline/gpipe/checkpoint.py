"""Checkpointing: a partition's forward that keeps only its input, and the recomputation in backward.

A checkpointed cell (one partition on one micro-batch) runs its forward without
recording the autograd graph and keeps only its input; the backward pass runs the
partition again on that input, recording the graph this time, and then
backpropagates through it. The recomputation draws the same random numbers as the
forward (see ``randomness.py``), so a Dropout mask, and so every gradient, is
exactly what the un-checkpointed cell would give.

``is_checkpointing()`` and ``is_recomputing()`` tell a layer which of the two runs
it is in (per thread, like torch's grad mode), e.g. to count something only once.

Which micro-batches are checkpointed, in training mode with gradients enabled::

    checkpoint='always'       micro-batches 0 .. chunks-1
    checkpoint='except_last'  micro-batches 0 .. chunks-2   (the last one's backward starts at once)
    checkpoint='never'        none
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, List, Optional, Tuple

import torch
from torch import Tensor

from .microbatch import Tensors

__all__: List[str] = []


class _Flags(threading.local):
    def __init__(self) -> None:
        self.checkpointing = False
        self.recomputing = False


_flags = _Flags()


def is_checkpointing() -> bool:
    """Whether this thread is running a checkpointed forward (no graph is recorded; it is recomputed later).

    Returns:
        True inside a partition's checkpointed forward, else False.
    """
    return _flags.checkpointing


def is_recomputing() -> bool:
    """Whether this thread is recomputing a checkpointed forward in backward.

    A layer with a side effect (a counter, a running statistic) can skip it when this
    is True, so that it happens once per micro-batch.

    Returns:
        True inside a partition's recomputation, else False.
    """
    return _flags.recomputing


@contextlib.contextmanager
def checkpointing() -> Iterator[None]:
    saved, _flags.checkpointing = _flags.checkpointing, True
    try:
        yield
    finally:
        _flags.checkpointing = saved


@contextlib.contextmanager
def recomputing() -> Iterator[None]:
    saved, _flags.recomputing = _flags.recomputing, True
    try:
        yield
    finally:
        _flags.recomputing = saved


def checkpoint_stop(mode: str, chunks: int, training: bool, grad_enabled: bool) -> int:
    """Micro-batches with an index below this are checkpointed (``chunks``: the configured number)."""
    if not (training and grad_enabled):
        return 0
    return {"always": chunks, "except_last": chunks - 1, "never": 0}[mode]


class _Boundary(torch.autograd.Function):
    """The identity on a partition's inputs, returning aliases that are not leaves.

    A partition may then modify its input in place (``ReLU(inplace=True)`` as its
    first layer), as it could inside the un-partitioned module; a leaf that requires
    grad refuses that.
    """

    @staticmethod
    def forward(ctx: Any, *inputs: Tensor) -> Tuple[Tensor, ...]:
        return tuple(t.detach() for t in inputs)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> Tuple[Tensor, ...]:
        return grads


_boundary: Callable[..., Tuple[Tensor, ...]] = _Boundary.apply  # typed handle on the untyped autograd entry


def make_leaves(tensors: Tensors, wanted: Callable[[Tensor], bool]) -> Tensors:
    """Detached copies (sharing storage) of a partition's inputs; those ``wanted`` require grad."""
    return tuple(t.detach().requires_grad_(wanted(t) and (t.is_floating_point() or t.is_complex()))
                 for t in tensors)


def enter(leaves: Tensors) -> Tensors:
    """What the partition is called with: the leaves, behind ``_Boundary`` when a graph is recorded."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in leaves):
        return _boundary(*leaves)
    return leaves


def versions(tensors: Tensors) -> Tuple[int, ...]:
    return tuple(t._version for t in tensors)


def modified_in_place(leaves: Tensors, before: Tuple[int, ...]) -> Optional[int]:
    """The position of the first input whose version changed since ``before``, if any."""
    for position, (tensor, version) in enumerate(zip(leaves, before)):
        if tensor._version != version:
            return position
    return None
