"""Cross-stream memory lifetime: tensors handed from one stream to another stay valid until read.

On an accelerator, a tensor made on stream A belongs to A's memory pool. When its last
reference goes, the caching allocator lets A reuse the block at once, while kernels
another stream B was given earlier may still be reading it: events order B after A,
never A's *reuse* after B. So whenever a task leaves tensors on the context for tasks on
other streams, the engine marks each of them as in use by those streams
(``Device.keep_alive``, i.e. ``Tensor.record_stream``): the block is then reused only
once the streams have done the work submitted to them before it was freed.

Which tensors, and for which streams:

* after a unit of task ``P`` runs, the tensors it wrote to the context (new or replaced
  attributes, and tensors inside them: lists, tuples, dicts, objects' attributes), kept
  for the stream of every task that depends on ``P``, directly or through other tasks,
  within the iteration or in the next one, other than ``P``'s own stream;
* a sink on a side stream (no task depends on it): also for the caller's stream, which
  reads the retired iteration.

What stays the user's: tensors kept anywhere but on the context (a list outside the
plan, a module's attribute) and read on another stream need ``record_stream`` by hand.

The trade-off: the alternative would hold every retired context until an event on
every stream had passed (memory freed in order, later); marking tensors frees each block
as soon as its readers are done, so peak memory stays near a serial loop's, at the cost
of one ``record_stream`` per tensor and consumer stream (microseconds, on devices that
track memory only).

``EarlyFree`` (``free_early=``) goes one step further for the context itself: an
attribute is deleted as soon as every task that declares it has finished the
iteration, instead of when the iteration retires.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, FrozenSet, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Set

import torch

from ..devices.device import Device
from ..plan.model import PipelinePlan

__all__: List[str] = []

_MAX_DEPTH = 6
_MISSING = object()


def written_since(attrs: Dict[str, Any], before: Dict[str, Any]) -> List[Any]:
    """The values in ``attrs`` that are new or replaced compared with the snapshot ``before``."""
    return [value for name, value in attrs.items() if before.get(name, _MISSING) is not value]


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor reachable from ``value`` through containers and plain objects' attributes (not modules)."""
    seen: Set[int] = set()
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, torch.Tensor):
            yield item
            continue
        if depth >= _MAX_DEPTH or id(item) in seen or isinstance(item, (str, bytes, int, float, torch.nn.Module)):
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            children: Sequence[Any] = list(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = list(item)
        elif hasattr(item, "__dict__"):
            children = list(vars(item).values())
        else:
            children = [getattr(item, slot, None) for slot in getattr(type(item), "__slots__", ())]
        stack.extend((child, depth + 1) for child in children)


def keep_written(device: Device, attrs: Dict[str, Any], before: Dict[str, Any], streams: Sequence[Any]) -> None:
    """Keep every tensor written since ``before`` alive for each of ``streams``."""
    for value in written_since(attrs, before):
        for tensor in tensors_in(value):
            for stream in streams:
                device.keep_alive(tensor, stream)


class EarlyFree:
    """Delete each context attribute as soon as every task that uses it has finished the iteration.

    ``uses[k]`` are the attributes task ``k`` (plan order) reads or writes. After a unit of
    task ``k`` ran (and before it signals completion, so that an iteration is done only
    once its frees are), each of those attributes whose last user this was is deleted
    from the context. On an accelerator the deletion is stream-safe: tensors handed to
    other streams are kept alive for them (above). One per run; thread-safe.
    """

    def __init__(self, uses: Sequence[FrozenSet[str]]) -> None:
        self.uses = [tuple(sorted(u)) for u in uses]
        self.users: Dict[str, int] = {}
        for attrs in self.uses:
            for name in attrs:
                self.users[name] = self.users.get(name, 0) + 1
        self._left: Dict[int, Dict[str, int]] = {}  # per iteration: users still to finish, per attribute
        self._lock = threading.Lock()

    def done(self, task: int, ctx: Any) -> None:
        """Task ``task`` finished its unit of ``ctx``'s iteration: free what no one else uses."""
        attrs = self.uses[task]
        if not attrs:
            return
        it = ctx.iter_idx
        gone = []
        with self._lock:
            left = self._left.get(it)
            if left is None:
                left = self._left[it] = dict(self.users)
            for name in attrs:
                count = left[name] - 1
                if count:
                    left[name] = count
                else:
                    del left[name]
                    gone.append(name)
            if not left:
                del self._left[it]
        if gone:
            ctx._swp_free(gone)


ENGINE_FIELDS = frozenset({"batch", "iter_idx"})  # the engine's own, never freed early


class ObservedUses(NamedTuple):
    """The context attributes each task was seen to read or write: ``free_early=analyze(plan, batch)``, precomputed.

    The analysis makes it (``analysis/engine_hooks.py``); the engine only reads the sets.
    """

    task_names: List[str]  # the tasks of the plan that was analysed, in plan order
    uses: Mapping[str, FrozenSet[str]]  # task name -> the context attributes it reads or writes


def attribute_uses(plan: PipelinePlan, free_early: object, keep: object) -> Optional[List[FrozenSet[str]]]:
    """Per task (plan order), the context attributes ``free_early`` frees after it; None when off.

    ``free_early`` is False, True (each task's declared ``reads=`` and ``writes=``) or the
    ``ObservedUses`` of an analysis; anything else is refused, in the words of the
    pipeline's ``free_early=`` argument.
    """
    if isinstance(keep, str) or not isinstance(keep, Iterable):
        raise TypeError(f"keep must be a collection of context attribute names, e.g. keep=(\"loss\",); got {keep!r}")
    kept = frozenset(keep)
    if free_early is False:
        if kept:
            raise ValueError(f"keep={sorted(kept)} without free_early: nothing is freed early, so nothing needs "
                             f"keeping")
        return None
    if isinstance(free_early, ObservedUses):
        if free_early.task_names != plan.task_names:
            raise ValueError(f"free_early: the analysis is of another plan (tasks {free_early.task_names}, this "
                             f"plan's {plan.task_names}); pass analyze(plan, batch) of this plan")
        return [free_early.uses[t] - ENGINE_FIELDS - kept for t in plan.task_names]
    if free_early is not True:
        raise TypeError(f"free_early must be False, True (tasks declare reads= and writes=) or a PlanAnalysis "
                        f"from analyze(plan, batch); got {free_early!r}")
    undeclared = [t.name for t in plan.tasks if t.reads is None or t.writes is None]
    if undeclared:
        raise ValueError(f"free_early=True needs every task's reads= and writes= (the context attributes it "
                         f"touches); not declared for {undeclared}. Declare them on each PipelineTask, or pass "
                         f"free_early=analyze(plan, batch)")
    return [frozenset((t.reads or frozenset()) | (t.writes or frozenset())) - kept for t in plan.tasks]
