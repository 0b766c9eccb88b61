"""Stages wrapped in ``DistributedDataParallel``: pipeline and data parallelism together.

Each rank of a pipeline may hold its stage as a ``DistributedDataParallel`` module over a
data-parallel group (the same stage of other pipeline replicas). Its gradients must then be
all-reduced once per step, after every microbatch's backward has added to them, not once
per microbatch (DDP's default: an all-reduce per backward, and an error when several
forwards come before their backwards). So, as torch.distributed.pipelining does::

    forward                          under no_sync (DDP prepares for no backward)
    a backward that is not the last  under no_sync (the gradients only add up)
    the stage's last backward        the reducer is told which outputs it starts from, then
                                     the backward all-reduces the summed gradients

"The last" is the stage's last action in the rank's order that writes the parameters'
gradients: its last ``B``, or with a split backward its last ``W`` (an ``I`` never does).
Gradients are divided by ``n_microbatches`` after the step, as without DDP.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterable, List, Sequence

import torch
from torch.nn.parallel import DistributedDataParallel

__all__: List[str] = []


def forward_sync(module: Any) -> ContextManager[Any]:
    """The context a stage's forward runs in."""
    if isinstance(module, DistributedDataParallel):
        return module.no_sync()
    return contextlib.nullcontext()


def backward_sync(module: Any, roots: Sequence[Any], last: bool) -> ContextManager[Any]:
    """The context a stage's backward from ``roots`` runs in; ``last``: the stage's last in the step."""
    if not isinstance(module, DistributedDataParallel):
        return contextlib.nullcontext()
    if not last:
        return module.no_sync()
    module.reducer.prepare_for_backward(_tensors(roots))
    return contextlib.nullcontext()


def _tensors(values: Iterable[Any]) -> List[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor)]
