"""Splitting a step's inputs into microbatches along dimension 0, and joining the last stage's outputs."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

__all__: List[str] = []


def split_value(value: Any, n: int, what: str) -> List[Any]:
    """``n`` pieces of ``value``: a tensor split along dimension 0 as ``torch.tensor_split`` does (sizes differ
    by at most one, the larger first); anything else repeated."""
    if not isinstance(value, torch.Tensor):
        return [value] * n
    if value.dim() == 0 or value.size(0) < n:
        size = "a scalar" if value.dim() == 0 else f"{value.size(0)} rows"
        raise ValueError(f"step(): {what} has {size}, too few to split into n_microbatches={n} microbatches along "
                         f"dimension 0; give at least {n} rows or use fewer microbatches")
    return list(torch.tensor_split(value, n, dim=0))


def split_args(args: Sequence[Any], kwargs: Dict[str, Any], n: int) -> Tuple[List[Tuple[Any, ...]],
                                                                           List[Dict[str, Any]]]:
    """Per microbatch, the positional and keyword arguments."""
    pieces = [split_value(a, n, f"positional argument {k}") for k, a in enumerate(args)]
    per_kw = {key: split_value(v, n, f"keyword argument {key!r}") for key, v in kwargs.items()}
    return ([tuple(p[m] for p in pieces) for m in range(n)],
            [{key: v[m] for key, v in per_kw.items()} for m in range(n)])


def split_target(target: Optional[Any], n: int) -> Optional[List[Any]]:
    return None if target is None else split_value(target, n, "target")


def as_tuple(value: Any) -> Tuple[Any, ...]:
    """A stage's output as a tuple of values (a tensor, or a tuple or list of them)."""
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return (value,)


def merge_outputs(outputs: Sequence[Any]) -> Any:
    """The last stage's microbatch outputs joined along dimension 0, without autograd: per element of a tuple or
    list, per key of a dict (each microbatch's with the same keys); a value of no dimension or no tensor, as the list
    of each microbatch's."""
    first = outputs[0]
    if isinstance(first, torch.Tensor) and first.dim():
        return torch.cat([o.detach() for o in outputs])
    if isinstance(first, (tuple, list)) and all(isinstance(o, type(first)) and len(o) == len(first) for o in outputs):
        joined = [merge_outputs([o[k] for o in outputs]) for k in range(len(first))]
        return type(first)(joined)
    if isinstance(first, dict) and all(isinstance(o, dict) and o.keys() == first.keys() for o in outputs):
        return type(first)((key, merge_outputs([o[key] for o in outputs])) for key in first)
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in outputs]
