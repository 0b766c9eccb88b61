"""Stages wrapped in ``DistributedDataParallel`` or sharded with FSDP2: pipeline and data parallelism together.

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

A stage sharded with FSDP2 (``fully_shard``, its blocks and itself over a data-parallel mesh)
is handled as torch's stage handles it, so that the gradients are the same bits (and so is a
stage whose blocks alone are sharded, each block then a root of its own, which torch's stage
leaves to reduce-scatter after every microbatch)::

    every backward                   no gradient sync, no reshard after it: each parameter's
                                     unsharded gradient adds up over the microbatches
    after the stage's last backward  every parameter group's post-backward (one reduce-scatter
                                     of the summed gradient per group), then FSDP's end of backward

and, unlike torch's, its parameters are gathered once per step: from the stage's first forward
to its last backward they stay gathered (no reshard after a forward), then are resharded, so a
step all-gathers each parameter group once instead of once per microbatch's forward and
backward. The gathered parameters of the rank's stages are held for the step, as FSDP holds
them with ``reshard_after_forward=False``. So a schedule that splits the backward in two works
on sharded stages too: ``I`` computes the inputs' gradients alone, ``W`` the weights' into the
gathered parameters, and the stage's last ``W`` is its last backward.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterable, Iterator, List, Sequence

import torch
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.nn.parallel import DistributedDataParallel

__all__: List[str] = []


def forward_sync(module: Any) -> ContextManager[Any]:
    """The context a stage's forward runs in."""
    if isinstance(module, DistributedDataParallel):
        return module.no_sync()
    return contextlib.nullcontext()


def sharded_modules(modules: Sequence[Any]) -> List[Any]:
    """The FSDP2 modules in ``modules`` and below them (found once, when the schedule is built)."""
    return [sub for module in modules for sub in module.modules() if isinstance(sub, FSDPModule)]


@contextlib.contextmanager
def gathered_for_the_step(sharded: Sequence[Any]) -> Iterator[None]:
    """FSDP2 stages' parameters (``sharded``: their FSDP modules) kept gathered from their first forward of the step
    to their last backward (the module docstring); resharded when the step ends, however it ends, and the modules'
    own setting restored."""
    groups = [(group, group.post_forward_mesh_info) for sub in sharded for group in sub._get_fsdp_state()
              ._fsdp_param_groups]
    for group, _ in groups:
        group.post_forward_mesh_info = None  # FSDP's own reading: no reshard after the forward
    try:
        yield
    finally:
        for group, info in groups:
            group.post_forward_mesh_info = info
        for sub in sharded:
            sub.reshard()


def outermost_sharded(module: Any) -> List[Any]:
    """The FSDP2 modules of a stage that no other of its FSDP2 modules holds: the stage module itself when it is
    sharded, else each sharded block (``fully_shard`` on the blocks alone makes each one a root of its own)."""
    if isinstance(module, FSDPModule):
        return [module]
    found: List[Any] = []
    for child in module.children():
        found += outermost_sharded(child)
    return found


def backward_sync(module: Any, roots: Sequence[Any], last: bool, sharded: Sequence[Any] = ()) -> ContextManager[Any]:
    """The context a stage's backward from ``roots`` runs in; ``last``: the stage's last in the step; ``sharded``:
    the stage's ``outermost_sharded`` modules."""
    if sharded:
        return _sharded_backward(sharded, last)
    if not isinstance(module, DistributedDataParallel):
        return contextlib.nullcontext()
    if not last:
        return module.no_sync()
    module.reducer.prepare_for_backward(_tensors(roots))
    return contextlib.nullcontext()


@contextlib.contextmanager
def _sharded_backward(tops: Sequence[Any], last: bool) -> Iterator[None]:
    """An FSDP2 stage's backward: gradients add up unsharded; after the last, each group reduce-scatters once."""
    for module in tops:
        module.set_is_last_backward(False)
        module.set_reshard_after_backward(False)
        module.set_requires_gradient_sync(False)
    yield
    if last:
        for module in tops:
            module.set_is_last_backward(True)
            module.set_reshard_after_backward(True)
            module.set_requires_gradient_sync(True)
            state = fully_shard.state(module)  # type: ignore[attr-defined]
            for each in state._state_ctx.all_states:
                for group in each._fsdp_param_groups:
                    group.post_backward()
            state._root_post_backward_final_callback()


def _tensors(values: Iterable[Any]) -> List[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor)]
