"""Task shortcut: run a task once, then replay what it left on the context instead of running it.

Three ways a task executes (``ShortcutTable.executor`` picks once, when shortcut
settings change, so a normal task costs nothing extra):

* normal: ``fn(ctx)``;
* caching (first execution after ``enable_shortcut``): ``fn`` runs on a *recording view*
  of the context (``recording.py``), a stand-in that forwards every read, write and delete
  to the context and notes them. The cache then holds exactly what this task wrote (a snapshot of the
  last value it assigned to each attribute, see ``snapshot.py``) and deleted, each
  ``DeclaredIO.capture()`` result, and the attributes it read. What other tasks do to the
  same context meanwhile, on other threads, is not in it; the context itself is never
  modified beyond what the task does (its class stays as it is).
* replay: ``fn`` is skipped; the task's deletions are repeated, its attributes restored
  as fresh values, each ``DeclaredIO.restore`` called, and a gradient bridge
  (``GraftGrad``) connects restored tensors that require grad to the tensors the task
  read, so ``loss.backward()`` still reaches the parameters upstream of the shortcut
  task (with zero gradients: the task's real dependence is gone), while the parameters
  downstream get exactly the gradients the cached values give.

A value a replay cannot reproduce (an iterator, a reference cycle) fails the caching
execution with a TypeError/ValueError naming the task and the attribute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Set, Tuple

import torch

from ..plan.context import IterContext
from ..plan.model import PipelineTask
from .recording import Journal, RecordingView
from ..scoped import Scoped
from .snapshot import Cached, Restorer, Snapshot, Unreplayable

__all__: List[str] = []

TaskFn = Callable[[IterContext], Any]
TaskWrapper = Callable[[PipelineTask, TaskFn], TaskFn]  # (task, the function to launch) -> what to launch instead


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


@dataclass
class TaskCache:
    """What one execution of a task left behind."""

    set_attrs: Dict[str, Cached] = field(default_factory=dict)
    deleted: List[str] = field(default_factory=list)
    read_attrs: List[str] = field(default_factory=list)
    io_values: List[Cached] = field(default_factory=list)


def _cache_of(journal: Journal, task: PipelineTask) -> TaskCache:
    """What ``journal``'s caching run of ``task`` left behind, as snapshots a replay can restore."""
    snapshot = Snapshot()
    cache = TaskCache()
    for name, value in journal.final.items():
        if value is journal.DELETED:
            if journal.existed[name]:
                cache.deleted.append(name)
            continue
        try:
            cache.set_attrs[name] = snapshot.take(value)
        except Unreplayable as why:
            raise why.error_type(f"task {task.name!r} set ctx.{name} to {why.what}, {why.why}; or do not "
                                 f"shortcut {task.name!r}") from None
    attrs = vars(journal.target)
    cache.read_attrs = sorted(n for n in journal.reads if dict.__contains__(attrs, n) and n not in cache.set_attrs)
    for k, io in enumerate(task.io):
        try:
            cache.io_values.append(snapshot.take(io.capture()))
        except Unreplayable as why:
            raise why.error_type(f"task {task.name!r}: DeclaredIO #{k} capture() returned {why.what}, "
                                 f"{why.why}; or do not shortcut {task.name!r}") from None
    return cache


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

    def executor(self, task: PipelineTask) -> TaskFn:
        """The function to launch for ``task``: its own fn unless it is shortcut."""
        if task.name not in self.enabled:
            return task.fn
        return lambda ctx: self._run_shortcut(task, ctx)

    def label(self, name: str) -> str:
        """A task's name as schedules and profiler ranges show it (``Name [skip]`` when shortcut)."""
        return f"{name} [skip]" if name in self.enabled else name

    def _run_shortcut(self, task: PipelineTask, ctx: IterContext) -> None:
        cache = self.caches.get(task.name)
        if cache is None:
            journal = Journal(ctx)
            task.fn(RecordingView(journal))
            self.caches[task.name] = _cache_of(journal, task)
        else:
            _replay(task, ctx, cache)


def _replay(task: PipelineTask, ctx: IterContext, cache: TaskCache) -> None:
    upstream: List[torch.Tensor] = []
    for name in cache.read_attrs:
        _flat_tensors(getattr(ctx, name, None), upstream)
    upstream = [u for u in upstream if u.requires_grad]
    attrs = vars(ctx)
    for name in cache.deleted:
        attrs.pop(name, None)
    restorer = Restorer()
    for name, cached in cache.set_attrs.items():
        value = restorer.give(cached)
        if upstream and isinstance(value, torch.Tensor) and value.requires_grad:
            value = _graft(value, *upstream)
        setattr(ctx, name, value)
    for io, cached in zip(task.io, cache.io_values):
        io.restore(restorer.give(cached))


class ShortcutSettings:
    """A pipeline's shortcut settings and caches, one of its parts.

    They belong to the pipeline, not to a run: they survive ``drain()``. The pipeline
    refuses to change them while iterations are in flight. They decide what each task's units
    launch (``TaskSpec.exec_fn``): the task's function or its shortcut executor, wrapped
    by the pipeline's task wrapper if it has one (``check_races=True``).
    """

    def __init__(self, specs: Sequence[Any], task_wrapper: Optional[TaskWrapper]) -> None:
        self.table = ShortcutTable([spec.task for spec in specs])
        self._specs = specs  # the pipeline's TaskSpecs
        self._wrap = task_wrapper
        self.refresh()

    def enable(self, names: Tuple[str, ...]) -> None:
        self.table.enable(names)
        self.refresh()

    def disable(self, names: Tuple[str, ...]) -> None:
        self.table.disable(names)
        self.refresh()

    @property
    def names(self) -> List[str]:
        """The names of the shortcut tasks, sorted."""
        return sorted(self.table.enabled)

    def is_shortcut(self, name: str) -> bool:
        return name in self.table.enabled

    def label(self, name: str) -> str:
        return self.table.label(name)

    def suspended(self) -> ContextManager[None]:
        """A block with no task shortcut and no cache; afterwards both are as before."""
        return Scoped(self._suspend, self._resume)

    def _suspend(self) -> Tuple[Set[str], Dict[str, TaskCache]]:
        table = self.table
        saved = (set(table.enabled), dict(table.caches))
        table.enabled, table.caches = set(), {}
        self.refresh()
        return saved

    def _resume(self, saved: Tuple[Set[str], Dict[str, TaskCache]]) -> None:
        self.table.enabled, self.table.caches = saved
        self.refresh()

    def refresh(self) -> None:
        """Each task's function to launch: its own, or its shortcut executor; wrapped by the task wrapper if any."""
        wrap = self._wrap
        for spec in self._specs:
            fn = self.table.executor(spec.task)
            spec.exec_fn = fn if wrap is None else wrap(spec.task, fn)
