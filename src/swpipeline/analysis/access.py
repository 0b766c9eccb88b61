"""What a task touches: context attributes, and state outside the context found through torch itself.

``record_iteration`` (``report.py``) runs one iteration's tasks in a given order on the
caller's thread and collects, per task, the names it read, wrote and deleted:

* ``ctx.<attr>``: context attributes, seen through a recording view of the context (the
  one task shortcut uses). Memory an operator of the task wrote is a write of every
  attribute whose value covers any of it, whatever name the task wrote it through (an
  alias, a view, the batch's tensor under a name of its own), and a container read from
  the context and changed in place is a write of its attribute (see ``inplace.py``);
  ``ctx.batch`` is an attribute like any other for that, and is only reported when a task
  changes it. Looking at every attribute at once (``vars(ctx)`` iterated, copied,
  compared) reads every attribute any task of the iteration writes. ``ctx.iter_idx``
  never changes and is left out;
* state outside the context, seen through torch: the operators' reads, writes and draws
  (``operators.py``; a draw reads and advances a generator: see ``generators.py``), each
  a read or write of every named tensor whose memory it meets (``memory.py``: two views
  of one buffer that share no byte are two names that never conflict); a
  ``TorchFunctionMode`` notes reads and assignments of ``.grad``; version counters and
  the identity of every named tensor, compared before and after the task, catch writes
  no operator reported (``p.grad = None``). A tensor is state if it has a name, or if it
  existed before the iteration began and the batch does not hold it; a generator is
  state if it is a default generator or has a name;
* ``<Task>.io[k]``: the state behind a ``DeclaredIO``, written by every task that declares
  it and by any task during which its ``capture()`` value changes; tensors that
  ``capture()`` returns are named after it, so reading them reads it.

Names come from walking the task functions (bound ``self``, closure variables, the
globals they use, attributes): a parameter reads ``model.dense.0.weight``, its gradient
``model.dense.0.weight.grad``, an optimizer's state
``optimizer.state[model.dense.0.weight].exp_avg``, a generator ``loader.gen``. Any other
tensor is ``tensor float32[16, 8] #k``, numbered in the order of first access.

Not seen: Python state other than the context and ``DeclaredIO`` (lists, counters,
attributes of plain objects) unless reached from a context attribute as above, random
state outside torch (``random``, NumPy), an explicit generator nothing names, and tensors
that native code writes behind both the dispatcher and the version counter. State created
lazily during the recorded iteration (optimizer state, ``.grad``) is seen when it has a
name.
"""

from __future__ import annotations

import gc
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

import torch
from torch.overrides import TorchFunctionMode

from ..plan.context import IterContext
from ..plan.model import DeclaredIO, PipelineTask
from ..shortcut.recording import Journal, RecordingView
from .generators import GeneratorKey, generator_name, named_generators
from .inplace import WATCHED, ValueWatch, Written, attributes_meeting
from .memory import Region, RegionIndex, region_of, storage_key
from .naming import MAX_DEPTH, describe, find_roots, named_copies, named_slots, walk_tensors
from .operators import Observer

__all__: List[str] = []

READ, WRITE, DELETE = "read", "write", "delete"
MUTATE, DRAW, READ_ALL = "mutate", "draw", "read all"  # changed in place; drawn from (a generator); vars(ctx) read
ENGINE_FIELDS = frozenset({"batch", "iter_idx"})
Note = Callable[[str, str], None]  # (kind, attribute name)


# -- the context ---------------------------------------------------------------------------------------


class _NotingJournal(Journal):
    """A recording journal that hands every context access to ``note(kind, name)`` as it happens.

    Values read are watched (``inplace.py``); ``finish(written)``, once the task has
    returned, notes a ``MUTATE`` of each attribute whose value covers memory its operators
    wrote (``written``), or whose container it changed in place.
    """

    watches = WATCHED

    def __init__(self, target: IterContext, note: Note) -> None:  # no super().__init__: no records kept
        self.target = target
        self._note = note
        self._values: Optional[ValueWatch] = None

    def read(self, name: str) -> None:
        self._note(READ, name)

    def read_all(self) -> None:
        self._note(READ_ALL, "")

    def watch(self, name: str, value: Any) -> None:
        if self._values is None:
            self._values = ValueWatch()
        self._values.watch(name, value)

    def touch(self, name: str) -> None:
        return None

    def write(self, name: str, value: Any) -> None:
        self._note(WRITE, name)

    def delete(self, name: str) -> None:
        self._note(DELETE, name)

    def finish(self, written: Written) -> None:
        context = self.target
        attributes = {"batch": context.batch, **vars(context)}
        changed = attributes_meeting(attributes, written)
        if self._values is not None:
            changed += self._values.changed({r.storage for r in written.regions})
        for name in dict.fromkeys(changed):
            self._note(MUTATE, name)


def recording_view(ctx: IterContext, note: Note) -> Tuple[IterContext, Callable[[Written], None]]:
    """A stand-in for ``ctx`` that forwards every access to it and calls ``note`` for each; and the function to
    call when the task has returned, which notes what it changed in place."""
    journal = _NotingJournal(ctx, note)
    return RecordingView(journal), journal.finish


@dataclass
class TaskAccess:
    """What one task touched: names read, written (assigned, changed in place or drawn from) and deleted."""

    reads: Set[str] = field(default_factory=set)
    writes: Set[str] = field(default_factory=set)
    deletes: Set[str] = field(default_factory=set)
    assigned: Set[str] = field(default_factory=set)  # written by an assignment or an operator's output
    mutated: Set[str] = field(default_factory=set)  # a value read from the context, changed in place
    draws: Set[str] = field(default_factory=set)  # generators drawn from
    reads_all: bool = False  # looked at every context attribute at once (``vars(ctx)`` iterated, copied, ...)

    def note(self, kind: str, name: str) -> None:
        if kind == READ:
            self.reads.add(name)
        elif kind == DELETE:
            self.deletes.add(name)
        elif kind == READ_ALL:
            self.reads_all = True
        else:
            self.writes.add(name)
            (self.mutated if kind == MUTATE else self.draws if kind == DRAW else self.assigned).add(name)

    @property
    def touched(self) -> Set[str]:
        return self.reads | self.writes | self.deletes

    def modifies(self, name: str) -> bool:
        return name in self.writes or name in self.deletes

    def modify_kind(self, name: str) -> str:
        """How the task modified ``name``, in the words of a report: drawn, deleted, changed in place, written."""
        if name in self.draws:
            return DRAW
        if name in self.deletes and name not in self.writes:
            return DELETE
        return MUTATE if name in self.mutated and name not in self.assigned else WRITE


@dataclass
class IterationAccess:
    """One recorded iteration: the task order, what each task touched, and which names are state."""

    order: List[str]
    tasks: Dict[str, TaskAccess]
    state: Set[str]  # names outside the context: consecutive iterations share them
    weights: Set[str] = field(default_factory=set)  # the names among them that are a module's parameters


# -- naming: modules, optimizers and tensors reachable from the task functions ---------------------------


_GRAD = torch._C.TensorBase.__dict__["grad"]


class _GradSlots(TorchFunctionMode):
    """Hands every ``t.grad`` read and assignment to ``on_grad(tensor, kind)``."""

    def __init__(self, on_grad: Callable[[torch.Tensor, str], None]) -> None:
        super().__init__()
        self.on_grad = on_grad

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        if getattr(func, "__self__", None) is _GRAD and args and isinstance(args[0], torch.Tensor):
            self.on_grad(args[0], READ if getattr(func, "__name__", "") == "__get__" else WRITE)
        return func(*args, **(kwargs or {}))


class _Snapshot(NamedTuple):
    """The named state at one moment."""

    versions: Dict[str, Tuple[Optional[torch.Tensor], int]]  # name -> (the tensor, or None: no .grad; its version)
    names: RegionIndex[str]  # names by the memory they cover; a DeclaredIO's name wins over a module path
    grads: Dict[int, str]  # parameter id -> the name of its .grad
    fingerprints: List[Any]  # per DeclaredIO, a copy of its capture()


class StateRecorder:
    """Notes, task by task, what each task does to the state outside the context (see the module docstring).

    Built just before the iteration: it names what the task functions reach, and keeps every
    tensor alive at that moment that the batch does not hold (so their storages stay
    theirs until the iteration is over).
    """

    def __init__(self, tasks: Sequence[PipelineTask], batch: Any, roots: Mapping[str, Any]) -> None:
        self.roots = find_roots([t.fn for t in tasks], roots)
        first: Dict[int, str] = {}
        for task in tasks:
            for k, io in enumerate(task.io):
                first.setdefault(id(io), f"{task.name}.io[{k}]")
        self.ios: List[Tuple[str, DeclaredIO]] = list({first[id(io)]: io for t in tasks for io in t.io}.items())
        self.declared = {t.name: [first[id(io)] for io in t.io] for t in tasks}
        batch_keys = {storage_key(t) for t in walk_tensors(batch)}
        self.existing = [t for t in _live_tensors() if storage_key(t) not in batch_keys]
        self.existing_by_key = {storage_key(t): t for t in self.existing}
        self.unnamed: Dict[int, str] = {}
        self.state: Set[str] = {name for name, _ in self.ios}
        self.weights: Set[str] = set()  # the module parameters among the names (seen by _snapshot)
        self.generators = {key: name for key, (name, _) in named_generators(self.roots).items()}

    def _snapshot(self) -> _Snapshot:
        slots, params = named_slots(self.roots)
        index: RegionIndex[str] = RegionIndex()
        fingerprints = []
        for name, io in self.ios:
            value = _capture(io)
            for found in walk_tensors(value):
                index.add(name, found)
            fingerprints.append(_frozen(value))
        versions: Dict[str, Tuple[Optional[torch.Tensor], int]] = {}
        for name, tensor in slots.items():
            if tensor is not None:
                name = index.add(name, tensor)
            versions.setdefault(name, (tensor, _version(tensor)))
        for name, tensor in named_copies(self.roots, params):
            index.add(name, tensor)
        grads = {pid: f"{name}.grad" for pid, name in params.items()}
        self.weights.update(name for name in params.values() if name in versions)
        return _Snapshot(versions, index, grads, fingerprints)

    def _names_of(self, region: Optional[Region], named: Sequence[RegionIndex[str]]) -> List[str]:
        """The names of the memory ``region`` meets: named state, else an unnamed tensor that existed before."""
        if region is None:
            return []
        found = list(dict.fromkeys(name for index in named for name in index.meeting(region)))
        if not found and region.storage in self.existing_by_key:
            name = self.unnamed.get(region.storage)
            if name is None:
                name = self.unnamed[region.storage] = describe(self.existing_by_key[region.storage],
                                                               len(self.unnamed) + 1)
            found.append(name)
        return found

    def run(self, task: PipelineTask, call: Callable[[], Any], access: TaskAccess) -> Written:
        """``call()`` (the task on its context), noting into ``access`` what it does to the state; returns what
        its operators wrote."""
        before = self._snapshot()
        existing_versions = [_version(t) for t in self.existing]
        reads: List[Optional[Region]] = []
        writes: List[Tuple[torch.Tensor, Optional[Region]]] = []  # (tensor, the memory it covered before)
        grads: List[Tuple[torch.Tensor, str]] = []
        draws: List[GeneratorKey] = []
        with _GradSlots(lambda t, kind: grads.append((t, kind))), Observer(
                lambda t: reads.append(region_of(t)), lambda t, region: writes.append((t, region)), draws.append):
            call()
        after = self._snapshot()
        named = (before.names, after.names)
        written = Written.of(writes)
        reported = {r.storage for r in written.regions}
        noted: List[Tuple[str, str]] = [(WRITE, name) for name in self.declared[task.name]]
        for kind, regions in ((READ, reads), (WRITE, written.regions)):
            for region in dict.fromkeys(regions):
                noted += [(kind, name) for name in self._names_of(region, named)]
        grad_names = {**after.grads, **before.grads}
        noted += [(kind, grad_names[id(t)]) for t, kind in grads if id(t) in grad_names]
        for name in before.versions.keys() | after.versions.keys():  # replaced, or written behind the dispatcher
            (was, was_version), (now, now_version) = (before.versions.get(name, (None, -1)),
                                                      after.versions.get(name, (None, -1)))
            moved = was_version != now_version and now is not None and storage_key(now) not in reported
            if was is not now or moved:
                noted.append((WRITE, name))
        for tensor, version in zip(self.existing, existing_versions):
            if _version(tensor) != version and storage_key(tensor) not in reported:
                noted += [(WRITE, name) for name in self._names_of(region_of(tensor), named)] or [
                    (WRITE, describe(tensor, 0))]
        for (name, _), was, now in zip(self.ios, before.fingerprints, after.fingerprints):
            if not _same(was, now):
                noted.append((WRITE, name))
        for drawn in dict.fromkeys(draws):
            generator = generator_name(drawn, self.generators)
            if generator is not None:
                noted.append((DRAW, generator))
        for kind, name in noted:
            access.note(kind, name)
            self.state.add(name)
        return written


def _live_tensors() -> List[torch.Tensor]:
    """Every tensor object alive now that has a storage and a version counter. Tensor subclasses that dispatch
    in Python (FakeTensor, FunctionalTensor, DTensor: wrappers, often of a mode or a compile that has ended) are
    left out: they hold no storage of their own (a DTensor's local tensor is found as itself), and asking an
    orphaned one for its storage is not safe."""
    found = []
    is_tensor: Dict[type, bool] = {}
    with warnings.catch_warnings():  # issubclass() wakes lazily deprecated objects, which warn
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            kind = type(obj)
            known = is_tensor.get(kind)
            if known is None:
                known = is_tensor[kind] = issubclass(kind, torch.Tensor) and (
                    getattr(kind, "__torch_dispatch__", None) is getattr(torch.Tensor, "__torch_dispatch__", None))
            if known and storage_key(obj) is not None and _version(obj) >= 0:
                found.append(obj)
    return found


def _version(tensor: Optional[torch.Tensor]) -> int:
    if tensor is None:
        return -1
    try:
        return int(tensor._version)
    except Exception:  # inference tensors have no version counter
        return -2


def _capture(io: DeclaredIO) -> Any:
    try:
        return io.capture()
    except Exception as exc:  # the state is not there yet: its absence is its value
        return ("capture() raised", type(exc).__name__)


def _frozen(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` to compare with a later one: tensors cloned, containers rebuilt."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if depth < MAX_DEPTH and isinstance(value, dict):
        return {k: _frozen(v, depth + 1) for k, v in value.items()}
    if depth < MAX_DEPTH and isinstance(value, (list, tuple)):
        return tuple(_frozen(v, depth + 1) for v in value)
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point() or a.is_complex():
            return bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
        return bool(torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:
        return a is b
