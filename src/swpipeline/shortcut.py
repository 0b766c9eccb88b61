"""Task shortcut: run a task once, then replay what it left on the context instead of running it.

Three ways a task executes (``ShortcutTable.executor`` picks once, when shortcut
settings change, so a normal task costs nothing extra):

* normal: ``fn(ctx)``;
* caching (first execution after ``enable_shortcut``): ``fn(ctx)``, then every context
  attribute the task added, replaced or deleted is cached (tensors detached and
  cloned, recursively), each ``DeclaredIO.capture()`` result too, and the
  attributes the task *read* are noted;
* replay: ``fn`` is skipped; cached attributes are restored as fresh tensors (a
  new ``detach()`` of the cache every time, so backward never runs through a
  graph twice), each ``DeclaredIO.restore`` is called, and a gradient bridge
  (``GraftGrad``) connects restored tensors that require grad to the tensors the
  task read, so ``loss.backward()`` still reaches the parameters upstream of the
  shortcut task (with zero gradients: the task's real dependence is gone), while
  the parameters downstream get exactly the gradients the cached values give.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

from .plan import IterContext, PipelineTask

__all__: List[str] = []

_CACHE_TAG = object()  # marks a cached value so restore_val can tell it from plain data
Cached = Tuple[Any, ...]


def cache_val(value: Any, _memo: Optional[Dict[int, Cached]] = None) -> Cached:
    """A snapshot of ``value``: tensors detached and cloned (keeping requires_grad), containers recursed.

    Dicts, lists, tuples (named tuples too) and objects whose attributes hold
    tensors (e.g. TorchRec's KeyedJaggedTensor) are rebuilt on restore; anything
    without tensors is kept by reference.
    """
    memo = {} if _memo is None else _memo
    if id(value) in memo:
        return memo[id(value)]
    cached: Cached
    if isinstance(value, torch.Tensor):
        cached = (_CACHE_TAG, "t", value.detach().clone(), value.requires_grad)
    elif isinstance(value, dict):
        cached = (_CACHE_TAG, "d", type(value), {k: cache_val(v, memo) for k, v in value.items()})
    elif isinstance(value, list):
        cached = (_CACHE_TAG, "l", [cache_val(v, memo) for v in value])
    elif isinstance(value, tuple):
        cached = (_CACHE_TAG, "u", type(value), [cache_val(v, memo) for v in value])
    elif _has_tensor_attrs(value):
        attrs = _attributes(value)
        memo[id(value)] = (_CACHE_TAG, "v", value)  # breaks reference cycles back to this object
        cached = (_CACHE_TAG, "o", type(value), {k: cache_val(v, memo) for k, v in attrs.items()})
    else:
        cached = (_CACHE_TAG, "v", value)
    memo[id(value)] = cached
    return cached


def restore_val(cached: Cached) -> Any:
    """A fresh value from ``cache_val``'s snapshot: new tensor leaves sharing the cached storage."""
    if not (isinstance(cached, tuple) and cached and cached[0] is _CACHE_TAG):
        raise TypeError("restore_val expects a value produced by cache_val")
    kind = cached[1]
    if kind == "t":
        tensor = cached[2].detach()
        return tensor.requires_grad_(True) if cached[3] and tensor.is_floating_point() else tensor
    if kind == "d":
        out = cached[2]() if cached[2] is not dict else {}
        out.update({k: restore_val(v) for k, v in cached[3].items()})
        return out
    if kind == "l":
        return [restore_val(v) for v in cached[2]]
    if kind == "u":
        items = [restore_val(v) for v in cached[3]]
        return tuple(items) if cached[2] is tuple else _make_tuple(cached[2], items)
    if kind == "o":
        obj = object.__new__(cached[2])
        for name, val in cached[3].items():
            object.__setattr__(obj, name, restore_val(val))
        return obj
    return cached[2]


def _make_tuple(kind: type, items: List[Any]) -> Any:
    return kind(*items) if hasattr(kind, "_fields") else kind(items)


def _attributes(obj: Any) -> Dict[str, Any]:
    attrs = dict(getattr(obj, "__dict__", {}))
    for klass in type(obj).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                attrs[slot] = getattr(obj, slot)
    return attrs


def _has_tensor_attrs(obj: Any) -> bool:
    if isinstance(obj, (type, torch.nn.Module)) or callable(obj):
        return False
    try:
        attrs = _attributes(obj)
    except Exception:  # objects with exotic attribute protocols are kept by reference
        return False
    return any(isinstance(v, torch.Tensor) or isinstance(v, (list, tuple, dict)) and _holds_tensor(v)
               for v in attrs.values())


def _holds_tensor(container: Any) -> bool:
    items = container.values() if isinstance(container, dict) else container
    return any(isinstance(v, torch.Tensor) for v in items)


def _flat_tensors(value: Any, out: List[torch.Tensor], depth: int = 0) -> None:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif depth < 4 and isinstance(value, (list, tuple)):
        for v in value:
            _flat_tensors(v, out, depth + 1)
    elif depth < 4 and isinstance(value, dict):
        for v in value.values():
            _flat_tensors(v, out, depth + 1)


class GraftGrad(torch.autograd.Function):
    """Identity on ``restored``; in backward, zeros for the upstream tensors so their backward still runs."""

    @staticmethod
    def forward(ctx: Any, restored: torch.Tensor, *upstream: torch.Tensor) -> torch.Tensor:
        ctx.upstream_meta = [(u.shape, u.dtype, u.device) for u in upstream]
        return restored.view_as(restored)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        zeros = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.upstream_meta]
        return (grad_output, *zeros)


_graft: Callable[..., torch.Tensor] = GraftGrad.apply  # typed handle on the untyped autograd entry point


class _ReadTracker(IterContext):
    """Swapped in as the context's class while a task is being cached, to note what it reads."""

    def __getattribute__(self, name: str) -> Any:
        reads = object.__getattribute__(self, "__dict__").get("_swp_reads")
        if reads is not None and not name.startswith("_"):
            reads.add(name)
        return object.__getattribute__(self, name)


@dataclass
class TaskCache:
    """What one execution of a task left behind."""

    set_attrs: Dict[str, Cached] = field(default_factory=dict)
    deleted: List[str] = field(default_factory=list)
    read_attrs: List[str] = field(default_factory=list)
    io_values: List[Cached] = field(default_factory=list)


class ShortcutTable:
    """Which tasks are shortcut, and their caches. Settings and caches outlive drain()."""

    def __init__(self, tasks: List[PipelineTask]) -> None:
        self._tasks = {t.name: t for t in tasks}
        self.enabled: Set[str] = set()
        self.caches: Dict[str, TaskCache] = {}

    def check_names(self, names: Tuple[str, ...], where: str) -> None:
        if not names:
            raise ValueError(f"{where}: name at least one task")
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"{where}: task names are strings, got {type(name).__name__} {name!r}")
            if name not in self._tasks:
                raise ValueError(f"{where}: unknown task {name!r} (known: {sorted(self._tasks)})")

    def enable(self, names: Tuple[str, ...]) -> None:
        self.check_names(names, "enable_shortcut")
        self.enabled.update(names)

    def disable(self, names: Tuple[str, ...]) -> None:
        self.check_names(names, "disable_shortcut")
        for name in names:
            self.enabled.discard(name)
            self.caches.pop(name, None)

    def executor(self, task: PipelineTask) -> Callable[[IterContext], Any]:
        """The function to launch for ``task``: its own fn unless it is shortcut."""
        if task.name not in self.enabled:
            return task.fn
        return lambda ctx: self._run_shortcut(task, ctx)

    def _run_shortcut(self, task: PipelineTask, ctx: IterContext) -> None:
        cache = self.caches.get(task.name)
        if cache is None:
            self.caches[task.name] = self._cache(task, ctx)
        else:
            _replay(task, ctx, cache)

    @staticmethod
    def _cache(task: PipelineTask, ctx: IterContext) -> TaskCache:
        before = {k: id(v) for k, v in vars(ctx).items()}
        reads: Set[str] = set()
        klass = type(ctx)
        vars(ctx)["_swp_reads"] = reads
        ctx.__class__ = _ReadTracker
        try:
            task.fn(ctx)
        finally:
            ctx.__class__ = klass
            vars(ctx).pop("_swp_reads", None)
        after = vars(ctx)
        cache = TaskCache()
        for name, value in after.items():
            if before.get(name) != id(value):
                cache.set_attrs[name] = cache_val(value)
        cache.deleted = [k for k in before if k not in after]
        cache.read_attrs = sorted(n for n in reads if n in before and n not in cache.set_attrs)
        cache.io_values = [cache_val(io.capture()) for io in task.io]
        return cache


def _replay(task: PipelineTask, ctx: IterContext, cache: TaskCache) -> None:
    upstream: List[torch.Tensor] = []
    for name in cache.read_attrs:
        _flat_tensors(getattr(ctx, name, None), upstream)
    upstream = [u for u in upstream if u.requires_grad]
    for name in cache.deleted:
        if hasattr(ctx, name):
            delattr(ctx, name)
    for name, cached in cache.set_attrs.items():
        value = restore_val(cached)
        if upstream and isinstance(value, torch.Tensor) and value.requires_grad:
            value = _graft(value, *upstream)
        setattr(ctx, name, value)
    for io, cached in zip(task.io, cache.io_values):
        io.restore(restore_val(cached))
