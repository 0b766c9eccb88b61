"""Micro-batches: the tensor-or-tensors rule, splitting a mini-batch, gathering the outputs.

What crosses a partition boundary (the module's input, each partition's output) is a
tensor or a tuple of tensors. Inside the package it is always a tuple (``Tensors``)
plus a flag saying whether the user's value was a single tensor (``atomic``), so
that a partition is called exactly as the un-partitioned module would call it:
with the tensor, or with the tuple as one argument.

Splitting chunks every tensor along dimension 0 (``Tensor.chunk``: equal pieces,
the last one smaller, possibly fewer pieces than asked for); gathering concatenates
the micro-batches' outputs along dimension 0, in micro-batch order.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import torch
from torch import Tensor

__all__: List[str] = []

Tensors = Tuple[Tensor, ...]
TensorOrTensors = Union[Tensor, Tensors]


def to_tuple(value: object, where: str) -> Tuple[Tensors, bool]:
    """``(tensors, atomic)`` for a tensor or a tuple of tensors.

    Raises:
        TypeError: ``value`` is neither (``where`` names what produced it).
    """
    if isinstance(value, Tensor):
        return (value,), True
    if isinstance(value, tuple) and value and all(isinstance(t, Tensor) for t in value):
        return value, False
    if isinstance(value, tuple):
        kinds = sorted({type(t).__name__ for t in value if not isinstance(t, Tensor)}) or ["nothing"]
        raise TypeError(f"{where}: expected a tensor or a non-empty tuple of tensors, got a tuple holding "
                        f"{', '.join(kinds)}; only tensors can cross a partition boundary")
    raise TypeError(f"{where}: expected a tensor or a tuple of tensors, got {type(value).__name__}; "
                    f"only tensors can cross a partition boundary")


def from_tuple(tensors: Tensors, atomic: bool) -> TensorOrTensors:
    """The value a partition receives or the caller gets back: the tensor itself if ``atomic``."""
    return tensors[0] if atomic else tensors


def scatter(tensors: Tensors, chunks: int) -> List[Tensors]:
    """Split every tensor into ``chunks`` pieces along dimension 0; one tuple per micro-batch.

    Raises:
        ValueError: a tensor has no dimension 0, or the tensors' sizes along it (their batch sizes) differ:
            micro-batch ``m`` would pair rows of one tensor with other rows of another.
    """
    for position, tensor in enumerate(tensors):
        if tensor.dim() == 0:
            raise ValueError(f"input[{position}] is a 0-dim tensor: a mini-batch is split along dimension 0 into "
                             f"micro-batches; give every input tensor a batch dimension")
    sizes = [t.size(0) for t in tensors]
    if len(set(sizes)) > 1:
        raise ValueError(f"input tensors have different batch sizes {sizes} (dimension 0); each micro-batch takes "
                         f"the same rows of every tensor, so give every input tensor the same batch size "
                         f"(chunks={chunks} would pair rows that do not belong together)")
    pieces = [tensor.chunk(chunks) for tensor in tensors]
    return [tuple(p[m] for p in pieces) for m in range(len(pieces[0]))]


def gather(outputs: Sequence[Tensors]) -> Tensors:
    """Concatenate the micro-batches' outputs along dimension 0, position by position.

    Raises:
        TypeError: the micro-batches' outputs have different numbers of tensors.
        ValueError: an output is a 0-dim tensor (it has no batch dimension to concatenate along).
    """
    lengths = {len(o) for o in outputs}
    if len(lengths) > 1:
        raise TypeError(f"the last partition returned tuples of different lengths ({sorted(lengths)}) for "
                        f"different micro-batches; its output must have the same structure for every micro-batch")
    if any(t.dim() == 0 for o in outputs for t in o):
        raise ValueError("the last partition returned a 0-dim tensor: the micro-batches' outputs are concatenated "
                         "along dimension 0; return per-sample values (reduce, e.g. take the mean, after GPipe)")
    return tuple(torch.cat([o[j] for o in outputs]) for j in range(lengths.pop()))


def split_like(grads: Sequence[Tensor], outputs: Sequence[Tensors]) -> List[Tensors]:
    """Split gradients of gathered tensors into the micro-batches' pieces (the inverse of ``gather``)."""
    per_tensor = [torch.split(g, [o[j].size(0) for o in outputs]) for j, g in enumerate(grads)]
    return [tuple(p[m] for p in per_tensor) for m in range(len(outputs))]
