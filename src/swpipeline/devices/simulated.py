"""A device for tests: it records what a GPU would be asked to do, and can check it.

``SimulatedDevice()`` runs tasks like the CPU device (a stream is a lane) and keeps, per
stream, the FIFO of operations a GPU would receive: ``("launch", task, iter)``,
``("record", event_id)``, ``("wait", (stream, position))``, and ``("fetch", iter)`` where
the caller drew a batch. ``happens_before`` answers
what a GPU must order; the engine's tests prove every dependency with it.

``SimulatedDevice(behind_host=True)`` models streams that run *behind* the host, as
real ones do: nothing launched is assumed finished until the host synchronizes. Inside
every launch it watches each tensor operation (a dispatch mode) and notes, per tensor
storage, which stream allocated it and which (stream, op) read or wrote it; it
reports, in ``hazards``:

* **unordered access**: an op reads a storage last written on another stream, or writes
  one last used on another stream, without that use happening-before it (a missing
  event wait);
* **use after reuse**: a storage allocated on stream A is freed while work on another
  stream B that used it may still be pending, and nothing keeps it for B
  (``keep_alive``, which is ``Tensor.record_stream`` on a GPU): the caching allocator
  would hand the block back to A at once, and A's next op could overwrite it under B;
* **a wait on an event that was never recorded** (a GPU ignores it silently);
* **two threads inside one stream object's context** (``with stream:`` keeps the
  stream to restore in one slot on the object, so concurrent use corrupts it).

The data iterator runs as work on the caller's stream (``fetch``): a batch it makes
there is the caller stream's, and a task on another stream must wait before reading it.
Other storages created outside any launch (model weights, a list of ready batches)
count as host memory: their accesses are ordered, their lifetime is the caller's business.

Frees are noticed without callbacks (a Ctrl-C landing in Python code run by the
garbage collector would be lost): each storage is held by a plain weak reference, and
the dead ones are processed before the device's next operation, and when ``hazards``
is read. Nothing of the model changes between operations, so this is exact.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .device import Device, TaskFn, _Lane

__all__: List[str] = []

Op = Tuple[Any, ...]
Where = Tuple[str, int]  # (stream name, op position)


class _SimEvent:
    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.recorded_at: Optional[Where] = None  # (stream, op position) of the last record


class _SimStream(_Lane):
    """A lane whose ``with`` block behaves like a torch stream's: one saved-stream slot on the object."""

    def __init__(self, name: str, device: "SimulatedDevice") -> None:
        super().__init__(name)
        self._device = device
        self._inside: Optional[str] = None  # the thread inside ``with self:``

    def __enter__(self) -> "_SimStream":
        me = threading.current_thread().name
        if self._inside is not None:
            self._device.hazard(f"two threads inside stream {self.name!r}'s context: {me!r} entered it while "
                                f"{self._inside!r} was inside")
        self._inside = me
        return self

    def __exit__(self, *exc: Any) -> None:
        self._inside = None


@dataclass
class _Use:
    where: Where
    unit: str  # "Task(i3)"
    write: bool


@dataclass
class _Block:
    """One tensor storage the device has seen."""

    storage: "weakref.ReferenceType[Any]"  # the storage, while it lives
    origin: str  # "allocated by Task(i3) on stream 's'", or "host memory"
    stream: Optional[str]  # the allocating stream; None for host memory
    last_use: Dict[str, _Use] = field(default_factory=dict)  # per stream: its latest use
    last_write: Optional[_Use] = None
    kept_for: Set[str] = field(default_factory=set)  # streams it is kept alive for (record_stream)


class SimulatedDevice(Device):
    """A device that records what a GPU would be asked to do, for tests.

    It runs tasks like the CPU device (a stream is a lane) and keeps in ``log``, per
    stream, the operations a GPU would receive: ``("launch", task, iter)``,
    ``("record", event_id)``, ``("wait", (stream, position))``, and ``("fetch", iter)``
    where the caller drew a batch (on its current stream); ``happens_before``
    answers what a GPU must order.

    Args:
        behind_host: model streams that run behind the host, as real ones do, and report
            in ``hazards`` an access that no event orders after another stream's, a
            tensor freed while another stream may still use it and nothing keeps it for
            that stream, a wait on an event never recorded, and two threads inside one
            stream object's context.
    """

    kind = "sim"
    uses_events = True

    def __init__(self, *, behind_host: bool = False) -> None:
        if not isinstance(behind_host, bool):
            raise TypeError(f"SimulatedDevice: behind_host must be True or False, got {behind_host!r}")
        super().__init__()
        self.behind_host = behind_host
        self.tracks_memory = behind_host
        self.log: Dict[str, List[Op]] = {}
        self._hazards: List[str] = []
        self._lock = threading.RLock()
        self._events = 0
        self._blocks: Dict[int, _Block] = {}  # storage data pointer -> block, while the storage lives
        self._synced: Dict[str, int] = {}  # per stream: ops before this position are known finished
        self._current = threading.local()
        if behind_host:
            _warm_dispatch_modes()

    # -- streams -----------------------------------------------------------------------------------

    def default_stream(self) -> Any:
        if "default" not in self._named:
            self._named["default"] = _SimStream("default", self)
        return self._named["default"]

    def _new_stream(self, name: str) -> Any:
        return _SimStream(name, self)

    def _adopt_stream(self, obj: Any) -> Any:
        label = self.stream_label(obj)
        key = f"<object {id(obj)}>"
        if key not in self._named:
            self._named[key] = _SimStream(label, self)
        return self._named[key]

    def current_stream(self) -> Any:
        """The stream current on the calling thread (the default stream unless ``use_stream`` or a task set one)."""
        return getattr(self._current, "stream", None) or self.default_stream()

    def caller_stream(self) -> Any:
        return self.current_stream()

    def use_stream(self, stream: Any) -> "_StreamScope":
        """``with device.use_stream(s):`` makes ``s`` current on this thread, as ``torch.cuda.stream(s)`` does."""
        return _StreamScope(self, stream)

    # -- execution and events ----------------------------------------------------------------------

    @property
    def hazards(self) -> List[str]:
        """What would go wrong on a GPU, in the order it was found (``behind_host`` only)."""
        self._sweep()
        return self._hazards

    def launch(self, stream: Any, fn: TaskFn, ctx: Any, name: str) -> None:
        self._sweep()
        unit = f"{name}(i{ctx.iter_idx})"
        previous = getattr(self._current, "stream", None)
        self._current.stream = stream
        try:
            with stream.lock:
                where = (stream.name, self._append(stream, ("launch", name, ctx.iter_idx)))
                if self.behind_host:
                    with _Watch(self, where, unit):
                        fn(ctx)
                else:
                    fn(ctx)
        finally:
            self._current.stream = previous

    def fetch(self, stream: Any, data_iter: Iterator[Any], iter_idx: int) -> Any:
        """Draw the batch as work on ``stream``: logged as ``("fetch", iter)``, its tensor operations watched
        (``behind_host``) like a task's, so a task on another stream that reads the batch before an event
        orders it after this is reported."""
        self._sweep()
        where = (stream.name, self._append(stream, ("fetch", iter_idx)))
        if not self.behind_host:
            return next(data_iter)
        with _Watch(self, where, f"the data iterator (batch {iter_idx})"):
            return next(data_iter)

    def new_event(self) -> Any:
        with self._lock:
            self._events += 1
            return _SimEvent(self._events)

    def record(self, event: Any, stream: Any) -> None:
        self._sweep()
        with self._lock:
            ops = self.log.setdefault(stream.name, [])
            event.recorded_at = (stream.name, len(ops) - 1)
            ops.append(("record", event.ident))

    def wait(self, stream: Any, event: Any) -> None:
        self._sweep()
        if event.recorded_at is None and self.behind_host:
            self.hazard(f"stream {stream.name!r} waits on event #{event.ident}, which was never recorded")
        self._append(stream, ("wait", event.recorded_at))

    def synchronize(self) -> None:
        self._sweep()  # what was freed before now was freed before the streams caught up
        with self._lock:
            self._synced = {name: len(ops) for name, ops in self.log.items()}

    def keep_alive(self, tensor: torch.Tensor, stream: Any) -> None:
        """Keep ``tensor``'s storage from reuse until ``stream``'s work submitted so far is done."""
        self._sweep()
        block = self._block_of(tensor)
        if block is not None:
            with self._lock:
                block.kept_for.add(stream.name)

    def hazard(self, text: str) -> None:
        with self._lock:
            self._hazards.append(text)

    def _append(self, stream: Any, op: Op) -> int:
        with self._lock:
            ops = self.log.setdefault(stream.name, [])
            ops.append(op)
            return len(ops) - 1

    # -- what a GPU must order -----------------------------------------------------------------------

    def launches(self) -> Dict[Tuple[str, int], Where]:
        """(task, iter) -> (stream, position) of every launch."""
        found = {}
        for name, ops in self.log.items():
            for pos, op in enumerate(ops):
                if op[0] == "launch":
                    found[(op[1], op[2])] = (name, pos)
        return found

    def happens_before(self, first: Where, then: Where) -> bool:
        """Whether a GPU must finish op ``first`` before it starts op ``then`` (both (stream, pos)).

        True when ``first`` precedes ``then`` on one stream (FIFO), or when ``then``'s
        stream waited, before ``then``, on an event recorded after an op that
        happens-after ``first``.
        """
        with self._lock:
            seen: Set[Where] = set()
            frontier = [then]
            while frontier:
                stream, pos = frontier.pop()
                if stream == first[0] and first[1] < pos:
                    return True
                for p in range(pos - 1, -1, -1):
                    op = self.log[stream][p]
                    if op[0] == "wait" and op[1] is not None and op[1] not in seen:
                        seen.add(op[1])
                        src_stream, src_pos = op[1]
                        if (src_stream, src_pos) == first:
                            return True
                        frontier.append((src_stream, src_pos + 1))
            return False

    # -- memory (behind_host) --------------------------------------------------------------------------

    def _block_of(self, tensor: torch.Tensor) -> Optional[_Block]:
        """The live block of ``tensor``'s storage, if the device has seen it."""
        key = _storage_key(tensor)
        block = self._blocks.get(key) if key is not None else None
        return block if block is not None and block.storage() is tensor.untyped_storage() else None

    def _touch(self, tensor: torch.Tensor, where: Where, unit: str, write: bool, new: bool) -> None:
        key = _storage_key(tensor)
        if key is None:
            return
        with self._lock:
            block = self._block_of(tensor)
            if block is None:
                self._sweep()  # a dead storage may have left this address
                stream = where[0] if new else None
                origin = f"a storage allocated by {unit} on stream {stream!r}" if new else "a host storage"
                block = self._blocks[key] = _Block(weakref.ref(tensor.untyped_storage()), origin, stream)
            use = _Use(where, unit, write)
            self._check_order(block, use)
            block.last_use[where[0]] = use
            if write:
                block.last_write = use

    def _check_order(self, block: _Block, use: _Use) -> None:
        stream = use.where[0]
        earlier = list(block.last_use.values()) if use.write else [block.last_write] if block.last_write else []
        for prior in earlier:
            if prior.where[0] != stream and not self.happens_before(prior.where, use.where):
                verb = "writes" if use.write else "reads"
                self.hazard(f"{use.unit} on stream {stream!r} {verb} {block.origin}, which "
                            f"{prior.unit} on stream {prior.where[0]!r} {'wrote' if prior.write else 'read'}, "
                            f"without waiting for it")

    def _sweep(self) -> None:
        """Process the storages that died since the last operation (see the module docstring)."""
        with self._lock:
            dead = [(key, block) for key, block in self._blocks.items() if block.storage() is None]
            for key, block in dead:
                del self._blocks[key]
                self._freed(block)

    def _freed(self, block: _Block) -> None:
        """A storage died: would its block be reused under another stream's pending work?

        Not if the host synchronized after the use, if the block is kept for that stream,
        or if whatever the allocating stream runs from now on is ordered after the use
        (it waited for an event recorded after it): a reuse is work on that stream.
        """
        with self._lock:
            if block.stream is None:
                return
            next_op = (block.stream, len(self.log.get(block.stream, ())))
            for stream, use in block.last_use.items():
                finished = self._synced.get(stream, 0) > use.where[1] or self.happens_before(use.where, next_op)
                if stream != block.stream and not finished and stream not in block.kept_for:
                    self._hazards.append(
                        f"use after reuse: {block.origin} was freed while {use.unit} on stream {stream!r} may "
                        f"still use it; nothing keeps it for stream {stream!r} (record_stream), so stream "
                        f"{block.stream!r} may reuse the memory under it")


def _storage_key(tensor: torch.Tensor) -> Optional[int]:
    """The identity of a tensor's memory while it lives (None for tensors without dense memory of their own)."""
    if not tensor.numel() or tensor.layout != torch.strided or tensor.device.type == "meta":
        return None
    return int(tensor.untyped_storage().data_ptr())


class _Watch(TorchDispatchMode):
    """Inside one launch: note every tensor read, write and allocation with the launch's (stream, position)."""

    def __init__(self, device: SimulatedDevice, where: Where, unit: str) -> None:
        super().__init__()
        self.device, self.where, self.unit = device, where, unit

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        written = {k for k, a in enumerate(func._schema.arguments)
                   if a.alias_info is not None and a.alias_info.is_write}
        named = list(args) + [kwargs.get(a.name) for a in func._schema.arguments[len(args):]]
        known = {_storage_key(t) for t in _tensors(named)}
        for k, value in enumerate(named):
            for t in _tensors([value]):
                self.device._touch(t, self.where, self.unit, k in written, False)
        out = func(*args, **kwargs)
        for t in _tensors([out]):
            if _storage_key(t) not in known:
                self.device._touch(t, self.where, self.unit, True, True)
        return out


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


_WARM = False  # set once the first operation under a dispatch mode has run in this process


def _warm_dispatch_modes() -> None:
    """Pay, once and here, what torch does on the first operation under any dispatch mode (it imports
    torch._dynamo: seconds on a busy machine), instead of inside the first watched task."""
    global _WARM
    if not _WARM:
        with _Passthrough():
            torch.zeros(1).add_(1)
        _WARM = True


def _tensors(values: List[Any]) -> Iterator[torch.Tensor]:
    leaves, _ = tree_flatten(values)
    return (v for v in leaves if isinstance(v, torch.Tensor))


class _StreamScope:
    def __init__(self, device: SimulatedDevice, stream: Any) -> None:
        self.device, self.stream = device, stream

    def __enter__(self) -> Any:
        self.previous = getattr(self.device._current, "stream", None)
        self.device._current.stream = self.stream
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        self.device._current.stream = self.previous

