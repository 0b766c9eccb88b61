"""Names for what tasks touch: module paths for parameters, buffers, gradients and optimizer state.

``find_roots`` walks the task functions (bound ``self``, closure variables, the globals
they use, attributes) for the objects they can reach; ``named_slots`` names every tensor
reachable from those roots by path (``model.dense.0.weight``, its ``.grad``,
``optimizer.state[model.dense.0.weight].exp_avg``); ``describe`` names any other tensor
by dtype and shape.
"""

from __future__ import annotations

import functools
import types
from collections import deque
from typing import Any, Deque, Dict, Iterable, Iterator, List, Mapping, Optional, Set, Tuple

import torch

from ..plan.context import IterContext
from .memory import RegionIndex

__all__: List[str] = []

_MAX_OBJECTS, MAX_DEPTH, _MAX_ITEMS = 4000, 6, 64  # bounds of the walk that names things


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _children(obj: Any, path: str) -> Iterator[Tuple[Any, str]]:
    """The objects ``obj`` refers to, with their names; bound ``self`` and a closure's ``self`` add nothing."""
    if isinstance(obj, types.MethodType):
        yield obj.__self__, path
        yield obj.__func__, path
    elif isinstance(obj, types.FunctionType):
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
            try:
                yield cell.cell_contents, path if name == "self" else _join(path, name)
            except ValueError:  # an empty cell
                continue
        for name in _global_names(obj.__code__):
            if name in obj.__globals__:
                yield obj.__globals__[name], _join(path, name)
        if hasattr(obj, "__wrapped__"):
            yield obj.__wrapped__, path
    elif isinstance(obj, functools.partial):
        yield obj.func, path
        yield from ((v, _join(path, f"arg{k}")) for k, v in enumerate(obj.args))
        yield from ((v, _join(path, k)) for k, v in obj.keywords.items())
    elif isinstance(obj, dict):
        yield from ((v, f"{path}[{k!r}]") for k, v in list(obj.items())[:_MAX_ITEMS] if isinstance(k, str))
    elif isinstance(obj, (list, tuple)):
        yield from ((v, f"{path}[{k}]") for k, v in enumerate(obj[:_MAX_ITEMS]))
    elif not isinstance(obj, (type, types.ModuleType, IterContext, str, bytes, int, float, bool)):
        yield from ((v, _join(path, k)) for k, v in _attributes(obj))


def _global_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _global_names(const)


def _attributes(obj: Any) -> List[Tuple[str, Any]]:
    """An object's instance attributes (``__dict__`` and ``__slots__``), dunder names left out."""
    found: List[Tuple[str, Any]] = []
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        found += [(k, v) for k, v in attrs.items() if isinstance(k, str) and not k.startswith("__")]
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if isinstance(name, str) and not name.startswith("__") and hasattr(obj, name):
                found.append((name, getattr(obj, name)))
    return found[:_MAX_ITEMS]


def _is_engine(obj: Any) -> bool:
    """A pipeline engine: its contexts hold other iterations' data, never state to name."""
    return callable(getattr(type(obj), "fill_pipeline", None)) and callable(getattr(type(obj), "run_serial", None))


def find_roots(functions: Iterable[Any], named: Mapping[str, Any]) -> Dict[str, Any]:
    """Modules, optimizers, tensors and generators reachable from ``functions`` (breadth first: the shortest name
    wins)."""
    found: Dict[str, Any] = {}
    seen: Set[int] = set()
    queue: Deque[Tuple[Any, str, int]] = deque((obj, name, 0) for name, obj in named.items())
    queue.extend((fn, "", 0) for fn in functions)
    while queue and len(seen) < _MAX_OBJECTS:
        obj, path, depth = queue.popleft()
        if id(obj) in seen or obj is None:
            continue
        seen.add(id(obj))
        if isinstance(obj, (torch.nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Generator)) or \
                names_its_tensors(obj):
            if path:
                found.setdefault(path, obj)
            continue
        if depth < MAX_DEPTH and not _is_engine(obj):
            queue.extend((child, name, depth + 1) for child, name in _children(obj, path))
    return found


def names_its_tensors(obj: Any) -> bool:
    """Whether ``obj`` says what its tensors are (``WeightVersions``: its versions of each parameter)."""
    return callable(getattr(type(obj), "__swp_named_tensors__", None))


def _local_tensors(tensor: torch.Tensor) -> List[torch.Tensor]:
    """The tensors holding a (possibly sharded) tensor's data on this process."""
    shards = getattr(tensor, "local_shards", None)
    if callable(shards):
        try:
            return [s.tensor for s in shards()]
        except Exception:
            return []
    local = getattr(tensor, "_local_tensor", None)
    return [local] if isinstance(local, torch.Tensor) else [tensor]


def named_slots(roots: Mapping[str, Any]) -> Tuple[Dict[str, Optional[torch.Tensor]], Dict[int, str]]:
    """Named state now: name -> tensor (None: an empty ``.grad``), and parameter id -> parameter name.

    Parameters, buffers and ``.grad`` of the modules, the optimizers' state, plain tensors.
    """
    slots: Dict[str, Optional[torch.Tensor]] = {}
    param_names: Dict[int, str] = {}

    def put(name: str, tensor: Optional[torch.Tensor]) -> None:
        if tensor is None:
            slots.setdefault(name, None)
            return
        parts = _local_tensors(tensor)
        for k, part in enumerate(parts):
            slots.setdefault(name if k == 0 else f"{name}#{k}", part)

    def put_param(name: str, param: torch.Tensor) -> None:
        param_names.setdefault(id(param), name)
        put(name, param)
        put(f"{name}.grad", param.grad)

    for root, obj in roots.items():
        if isinstance(obj, torch.nn.Module):
            for name, param in obj.named_parameters():
                put_param(_join(root, name), param)
            for name, buffer in obj.named_buffers():
                put(_join(root, name), buffer)
    for root, obj in roots.items():
        if isinstance(obj, torch.optim.Optimizer):
            for g, group in enumerate(obj.param_groups):
                for k, param in enumerate(group.get("params", [])):
                    if isinstance(param, torch.Tensor) and id(param) not in param_names:
                        put_param(f"{root}.param_groups[{g}][{k}]", param)
            for owner_param, state in list(obj.state.items()):
                owner = param_names.get(id(owner_param), "?")
                if isinstance(state, dict):
                    for key, value in state.items():
                        if isinstance(value, torch.Tensor):
                            put(f"{root}.state[{owner}].{key}", value)
        elif isinstance(obj, torch.Tensor):
            put(root, obj)
    return slots, param_names


def named_copies(roots: Mapping[str, Any], param_names: Mapping[int, str]) -> List[Tuple[str, torch.Tensor]]:
    """The tensors of objects that say what they are (``__swp_named_tensors__()``: the parameter each stands for,
    what it is, the tensor; ``WeightVersions``' stashed versions), named after the parameter: ``model.0.weight
    (version 3)``. They name what an operator reads or writes; unlike ``named_slots``' names, they come and go as
    the object makes and drops them, which is no write of anything."""
    found = []
    for root, obj in roots.items():
        if names_its_tensors(obj):
            for live, label, tensor in obj.__swp_named_tensors__():
                found.append((f"{param_names.get(id(live), root)} ({label})", tensor))
    return found


def state_index(roots: Mapping[str, Any]) -> "RegionIndex[str]":
    """The named state now (``named_slots``), indexed by the memory each name covers; it keeps the tensors
    alive, so that no other tensor takes their storages while the index is in use."""
    index: RegionIndex[str] = RegionIndex(keep=True)
    slots, params = named_slots(roots)
    for name, tensor in slots.items():
        if tensor is not None:
            index.add(name, tensor)
    for name, tensor in named_copies(roots, params):
        index.add(name, tensor)
    return index


def walk_tensors(value: Any, depth: int = 0, seen: Optional[Set[int]] = None) -> List[torch.Tensor]:
    """The tensors inside a value: containers, named tuples, dataclasses and objects' attributes."""
    seen = set() if seen is None else seen
    if id(value) in seen or depth > MAX_DEPTH or value is None:
        return []
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (str, bytes, int, float, bool, type, types.ModuleType, types.FunctionType)):
        return []
    items: Iterable[Any]
    if isinstance(value, dict):
        items = list(value.values())[:_MAX_ITEMS]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)[:_MAX_ITEMS]
    else:
        items = [v for _, v in _attributes(value)]
    return [t for item in items for t in walk_tensors(item, depth + 1, seen)]


def describe(tensor: torch.Tensor, number: int) -> str:
    """A stable name for a tensor nothing names: its dtype, shape and the order it was first touched in."""
    dtype = str(tensor.dtype).replace("torch.", "")
    return f"tensor {dtype}[{', '.join(str(s) for s in tensor.shape)}] #{number}"


# -- torch: what a task does to the state ------------------------------------------------------------------
