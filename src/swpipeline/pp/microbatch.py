"""A step's inputs split into microbatches, and the last stage's outputs joined: torch's names and arguments.

::

    from swpipeline.pp.microbatch import TensorChunkSpec, merge_chunks, split_args_kwargs_into_chunks

    arg_chunks, kwarg_chunks = split_args_kwargs_into_chunks((x,), {"mask": m}, 4,
                                                             TensorChunkSpec.from_tuple((1,)))
    merge_chunks(outputs, TensorChunkSpec(1))

A spec says along which dimension a value is split, and joined: ``TensorChunkSpec(d)``. Specs
follow the values' structure: one per positional argument (a tuple), one per keyword (a dict),
deeper where a value is a tuple, list or dict; one ``TensorChunkSpec`` given for a container
applies to every tensor in it, and ``None`` anywhere means the default, dimension 0. Every tensor
is split as ``torch.tensor_split`` splits it (sizes differ by at most one, the larger first);
anything that is no tensor, and a tensor whose spec is torch's ``_Replicate``, is given whole to
every microbatch. A tensor too small to give each microbatch a slice is refused, naming it (torch's
makes fewer microbatches than asked instead).

Joining is the inverse: each tensor concatenated along its spec's dimension; a tensor of no
dimension, or anything else, as the list of each microbatch's.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch.distributed.pipelining.microbatch import TensorChunkSpec as _TorchChunkSpec
from torch.distributed.pipelining.microbatch import _Replicate

__all__: List[str] = ["TensorChunkSpec", "merge_chunks", "split_args_kwargs_into_chunks"]


class TensorChunkSpec(_TorchChunkSpec):
    """Split (and join) a tensor along dimension ``split_dim``. A kind of torch's, so that torch's functions take it
    too; torch's own is taken here as well."""

    def __init__(self, split_dim: int) -> None:
        if isinstance(split_dim, bool) or not isinstance(split_dim, int):
            raise TypeError(f"TensorChunkSpec: split_dim must be an int (a dimension), got {split_dim!r}")
        super().__init__(split_dim)  # type: ignore[no-untyped-call]

    def __repr__(self) -> str:
        return f"TensorChunkSpec({self.split_dim})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _TorchChunkSpec) and other.split_dim == self.split_dim

    def __hash__(self) -> int:
        return hash(self.split_dim)

    @staticmethod
    def from_tuple(chunk_dims: Sequence[int]) -> Tuple["TensorChunkSpec", ...]:
        """One spec per positional argument: ``from_tuple((0, 1))``."""
        return tuple(TensorChunkSpec(d) for d in chunk_dims)

    @staticmethod
    def from_dict(chunk_dims: Mapping[str, int]) -> Dict[str, "TensorChunkSpec"]:
        """One spec per keyword argument: ``from_dict({"ids": 0, "mask": 1})``."""
        return {key: TensorChunkSpec(d) for key, d in chunk_dims.items()}


def _is_leaf_spec(spec: Any) -> bool:
    """A spec for one value (ours, torch's, or anything with an int ``split_dim``), or torch's replicate marker."""
    return spec is _Replicate or isinstance(spec, _Replicate) or isinstance(getattr(spec, "split_dim", None), int)


def _split(value: Any, spec: Any, n: int, what: str) -> List[Any]:
    """``n`` pieces of ``value`` as ``spec`` says (the module docstring)."""
    nested = spec is not None and not _is_leaf_spec(spec)  # a spec per element of a tuple, list or dict
    if nested and not _matches(value, spec):
        raise ValueError(f"the spec of {what}, {spec!r}, does not match its value's structure ({_shape(value)}): "
                         f"give one TensorChunkSpec for it, or a tuple, list or dict of them shaped like the value")
    if isinstance(value, (tuple, list)):
        parts = [_split(v, spec[k] if nested else spec, n, f"{what}[{k}]") for k, v in enumerate(value)]
        return [_rebuild(value, [p[m] for p in parts]) for m in range(n)]
    if isinstance(value, dict):
        per_key = {key: _split(v, spec.get(key) if nested else spec, n, f"{what}[{key!r}]")
                   for key, v in value.items()}
        return [type(value)((key, v[m]) for key, v in per_key.items()) for m in range(n)]
    if isinstance(value, torch.Tensor):
        if spec is _Replicate or isinstance(spec, _Replicate):
            return [value] * n
        dim = 0 if spec is None else spec.split_dim
        if not -value.dim() <= dim < max(value.dim(), 1) or value.dim() == 0:
            raise ValueError(f"{what} has {value.dim()} dimensions, so it cannot be split along dimension {dim}: give "
                             f"its spec another split_dim, or pass it as a value that is not split")
        if value.size(dim) < n:
            raise ValueError(f"{what} has {value.size(dim)} rows along dimension {dim}, too few to split into "
                             f"{n} microbatches; give at least {n} or use fewer microbatches")
        return list(torch.tensor_split(value, n, dim=dim))
    if type(value).__name__ == "BlockMask" and getattr(value, "kv_num_blocks", None) is not None \
            and value.kv_num_blocks.size(0) != 1:
        raise ValueError(f"{what} is a BlockMask of a batch of {value.kv_num_blocks.size(0)}; it is not split "
                         f"here: make one per microbatch, or one of batch size 1 (given to every microbatch)")
    return [value] * n


def _matches(value: Any, spec: Any) -> bool:
    """Whether a spec of a tuple, list or dict has the value's shape (a dict's may leave keys out)."""
    if isinstance(spec, (tuple, list)):
        return isinstance(value, (tuple, list)) and len(spec) == len(value)
    return isinstance(spec, Mapping) and isinstance(value, dict) and set(spec) <= set(value)


def _shape(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, dict):
        return f"a dict of keys {sorted(map(str, value))}"
    return type(value).__name__


def _rebuild(like: Any, items: List[Any]) -> Any:
    """A tuple or list (a named tuple too) of ``items``, of the type of ``like``."""
    if isinstance(like, tuple) and hasattr(like, "_fields"):
        return type(like)(*items)
    return type(like)(items)


def split_args_kwargs_into_chunks(args: Tuple[Any, ...], kwargs: Optional[Dict[str, Any]], chunks: int,
                                  args_chunk_spec: Optional[Sequence[Any]] = None,
                                  kwargs_chunk_spec: Optional[Mapping[str, Any]] = None
                                  ) -> Tuple[List[Tuple[Any, ...]], List[Dict[str, Any]]]:
    """Per microbatch, its positional arguments (a tuple) and its keyword arguments (a dict).

    Raises:
        ValueError: ``chunks`` is not an int >= 1, a spec does not match its value, or a tensor has fewer rows
            than ``chunks`` along its dimension (the message names the argument).
    """
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"split_args_kwargs_into_chunks: chunks must be an int >= 1, got {chunks!r}")
    args, kwargs = tuple(args), dict(kwargs or {})
    if args_chunk_spec is not None and len(tuple(args_chunk_spec)) != len(args):
        raise ValueError(f"args_chunk_spec has {len(tuple(args_chunk_spec))} specs for {len(args)} positional "
                         f"arguments: give one per argument")
    if kwargs_chunk_spec is not None and not set(kwargs_chunk_spec) <= set(kwargs):
        raise ValueError(f"kwargs_chunk_spec names {sorted(set(kwargs_chunk_spec) - set(kwargs))}, which are not "
                         f"among the keyword arguments {sorted(kwargs)}")
    arg_specs = tuple(args_chunk_spec) if args_chunk_spec is not None else (None,) * len(args)
    pieces = [_split(a, s, chunks, f"positional argument {k}") for k, (a, s) in enumerate(zip(args, arg_specs))]
    per_kw = {key: _split(v, (kwargs_chunk_spec or {}).get(key), chunks, f"keyword argument {key!r}")
              for key, v in kwargs.items()}
    return ([tuple(p[m] for p in pieces) for m in range(chunks)],
            [{key: v[m] for key, v in per_kw.items()} for m in range(chunks)])


def merge_chunks(chunks: Sequence[Any], chunk_spec: Any) -> Any:
    """The microbatches' values joined into one, as ``chunk_spec`` says (None: along dimension 0); the inverse of
    the split. Autograd sees the join (the schedules return theirs detached)."""
    return _merge(list(chunks), chunk_spec, detach=False)


def _merge(values: List[Any], spec: Any, detach: bool) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor) and first.dim() and not (spec is _Replicate or isinstance(spec, _Replicate)):
        dim = 0 if spec is None or not _is_leaf_spec(spec) else spec.split_dim
        joined = torch.cat(values, dim=dim)
        return joined.detach() if detach else joined
    if isinstance(first, (tuple, list)) and all(isinstance(v, type(first)) and len(v) == len(first) for v in values):
        per = spec if isinstance(spec, (tuple, list)) and len(spec) == len(first) else [spec] * len(first)
        return _rebuild(first, [_merge([v[k] for v in values], per[k], detach) for k in range(len(first))])
    if isinstance(first, dict) and all(isinstance(v, dict) and v.keys() == first.keys() for v in values):
        keyed = spec if isinstance(spec, Mapping) else dict.fromkeys(first, spec)
        return type(first)((key, _merge([v[key] for v in values], keyed.get(key), detach)) for key in first)
    return [v.detach() if detach and isinstance(v, torch.Tensor) else v for v in values]


# -- what the schedules use ---------------------------------------------------------------------------------------

def split_target(target: Optional[Any], n: int) -> Optional[List[Any]]:
    """The last stage's target split like an input along dimension 0 (None: no target)."""
    return None if target is None else _split(target, None, n, "target")


def merge_outputs(outputs: Sequence[Any], spec: Any = None) -> Any:
    """The last stage's microbatch outputs joined (``spec``: the schedule's ``output_merge_spec``), without
    autograd."""
    return _merge(list(outputs), spec, detach=True)


def as_tuple(value: Any) -> Tuple[Any, ...]:
    """A stage's output as a tuple of values (a tensor, or a tuple or list of them)."""
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return (value,)
