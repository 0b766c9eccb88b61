"""Gradient-norm clipping across pipeline stages, bit for bit what one process's ``clip_grad_norm_`` gives.

One process computes each gradient's norm, groups them by dtype in the order the parameters
come, and takes the norm of that vector of norms; then scales every gradient by
``max_norm / (total + 1e-6)`` (at most 1). Across ranks each rank holds some of the
gradients: each computes its own gradients' norms by the same calls, every rank gathers all
of them (a float each), puts them in the one-process order (stage by stage, each stage's
parameters in order, grouped by dtype as one process groups them) and takes the same norm of
them, so every rank gets the one-process total, bit for bit, and scales its own gradients
by it. Adding up each rank's share of the squares instead (the usual way) sums in another
order and differs from one process by an ulp or so. A stage sharded with FSDP2 gathers each
gradient whole to take its norm (one at a time), as one process would see it, and scales its
own shard.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Set, Tuple

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._foreach_utils import _device_has_foreach_support, _has_foreach_support

from .stage import PipelineStage

__all__: List[str] = []

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _stages_of(stages: Any) -> List[PipelineStage]:
    """This rank's stages: from a schedule, a stage, or a list of stages."""
    found = getattr(stages, "_stages", stages)
    found = [found] if isinstance(found, PipelineStage) else list(found)
    if not found or not all(isinstance(s, PipelineStage) for s in found):
        raise TypeError(f"clip_grad_norm_: give this rank's schedule, its PipelineStage, or a list of its stages, "
                        f"got {stages!r}")
    return sorted(found, key=lambda s: s.stage_index)


def _norms(grads: Sequence[torch.Tensor], norm_type: float, foreach: Any) -> List[torch.Tensor]:
    """Each gradient's norm, by the calls one process's ``clip_grad_norm_`` makes for its device and dtype."""
    if not grads:
        return []
    device = grads[0].device
    if (foreach is None and _has_foreach_support(list(grads), device)) or (foreach and
                                                                           _device_has_foreach_support(device)):
        return list(torch._foreach_norm(list(grads), norm_type))
    if foreach:
        raise RuntimeError(f"clip_grad_norm_: foreach=True was passed, but {device.type} tensors have no foreach "
                           f"operators; pass foreach=None")
    return [torch.linalg.vector_norm(g, norm_type) for g in grads]


def clip_grad_norm_(stages: Any, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: Any = None) -> torch.Tensor:
    """Clip the gradients of every stage of the pipeline by their total norm, as one process clips the whole
    model's; call it on every rank of the pipeline, after ``step()``.

    Args:
        stages: this rank's schedule, its ``PipelineStage``, or a list of its stages. Where weights are tied
            across stages (``tied_weights=``), give the schedule: each tied weight then counts once, in the
            first stage that uses it, as one process counts a shared parameter once.
        max_norm, norm_type, error_if_nonfinite, foreach: as ``torch.nn.utils.clip_grad_norm_``'s.

    Returns:
        The total norm of all the pipeline's gradients (the same tensor on every rank), on this rank's first
        stage's device.

    Raises:
        RuntimeError: the total norm is NaN or infinite and ``error_if_nonfinite`` (on every rank alike).
    """
    ties = getattr(stages, "_ties", None)  # a schedule's tied weights: each counted once, in its first stage
    with torch.no_grad():
        return _clip(_stages_of(stages), max_norm, float(norm_type), error_if_nonfinite, foreach,
                     ties.repeats() if ties is not None else set())


def _clip(mine: List[PipelineStage], max_norm: float, norm_type: float, error_if_nonfinite: bool,
          foreach: Any, repeats: Set[int]) -> torch.Tensor:
    group, device = mine[0].group, mine[0].device
    wire = device if dist.get_backend(group) == "nccl" else torch.device("cpu")
    keys: List[Tuple[int, int, int]] = []  # (stage, parameter, dtype's place in _DTYPES), per norm
    norms: List[torch.Tensor] = []
    params: List[torch.Tensor] = []
    for stage in mine:
        grads = [_whole(p.grad) for p in stage.submod.parameters() if p.grad is not None and id(p) not in repeats]
        params += list(stage.submod.parameters())
        groups: Dict[Tuple[torch.device, torch.dtype], List[int]] = {}
        for k, g in enumerate(grads):
            groups.setdefault((g.device, g.dtype), []).append(k)
        for (_, dtype), members in groups.items():
            if dtype not in _DTYPES:
                raise TypeError(f"clip_grad_norm_: stage {stage.stage_index} has a gradient of dtype {dtype}; the "
                                f"gradients are floating point ({', '.join(map(str, _DTYPES))})")
            norms += _norms([grads[k] for k in members], norm_type, foreach)
            keys += [(stage.stage_index, k, _DTYPES.index(dtype)) for k in members]
    # every rank's rows (stage, parameter, dtype, norm) as float64, which holds each exactly: two gathers
    rows = torch.zeros(len(keys), 4, dtype=torch.float64, device=wire)
    if keys:
        rows[:, :3] = torch.tensor(keys, dtype=torch.float64, device=wire)
        rows[:, 3] = torch.stack([n.to(wire, torch.float64) for n in norms])
    size = dist.get_world_size(group)
    counts = [torch.zeros(1, dtype=torch.int64, device=wire) for _ in range(size)]
    dist.all_gather(counts, torch.tensor([len(keys)], dtype=torch.int64, device=wire), group=group)
    longest = max(int(c) for c in counts)
    if longest == 0:
        return torch.tensor(0.0, device=device)
    padded = torch.zeros(longest, 4, dtype=torch.float64, device=wire)
    padded[:len(keys)] = rows
    gathered = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(gathered, padded, group=group)
    everything = sorted(tuple(row) for g, c in zip(gathered, counts) for row in g[:int(c)].cpu().tolist())
    by_dtype: Dict[int, List[float]] = {}  # one process's groups: by dtype, in the order they first come
    for _, _, dtype, value in everything:
        by_dtype.setdefault(int(dtype), []).append(value)
    values = [torch.tensor(vs, dtype=torch.float64, device=device).to(_DTYPES[d]) for d, vs in by_dtype.items()]
    norms = [n for group_values in values for n in group_values.unbind()]
    total: torch.Tensor = torch.linalg.vector_norm(torch.stack(norms), norm_type)
    if error_if_nonfinite and bool(torch.logical_or(total.isnan(), total.isinf())):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the pipeline's gradients is "
                           f"{float(total)}, so it cannot be clipped; to scale them by it anyway, pass "
                           f"error_if_nonfinite=False")
    sharded = [p.grad for p in params if isinstance(p.grad, DTensor)]
    if sharded:  # each rank's shard scaled by the same factor, as one process scales the whole gradient
        factor = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for grad in sharded:
            grad.to_local().mul_(factor.to(grad.device))
    plain = [p for p in params if not isinstance(p.grad, DTensor)]
    torch.nn.utils.clip_grads_with_norm_(plain, max_norm, total.to(plain[0].device) if plain else total, foreach)
    return total


def _whole(grad: torch.Tensor) -> torch.Tensor:
    """A gradient as one process holds it: a sharded one (FSDP2's) gathered whole."""
    return grad.full_tensor() if isinstance(grad, DTensor) else grad
