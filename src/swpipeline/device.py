"""The one small interface through which the engines touch streams and events.

Three implementations:

* ``CPUDevice``: no accelerator. A stream is an execution *lane*: tasks on one lane
  never overlap (a lock, as a GPU stream would serialize them) and device events
  reduce to the CPU signals the engine already waits on, so ``uses_events`` is False.
* ``TorchDevice``: an accelerator through torch's device-agnostic ``torch.Stream`` /
  ``torch.Event`` API (CUDA, and any other backend torch exposes the same way).
* ``SimulatedDevice``: runs like the CPU device but keeps an ordered log of every
  launch, event record and event wait per stream, so CPU tests can prove that the
  engine's GPU protocol orders every dependency (see ``SimulatedDevice.happens_before``).

Guarantee the engines rely on: ``launch(stream, fn, ctx, name)`` runs ``fn(ctx)`` on
the calling thread with ``stream`` current, and returns when ``fn`` returns. Whether
to launch at all is the engine's decision: a worker starts no unit once its run is
aborted, and a unit on a stream shared by thread groups waits for its turn on the
stream (a wait that an abort ends), so a lane is never contended and an abort never
waits behind one.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

import torch


__all__: List[str] = []

logger = logging.getLogger("swpipeline")

TaskFn = Callable[[Any], Any]


class Device:
    """Base interface; the CPU behaviour is the default."""

    kind = "cpu"
    uses_events = False  # whether the engine must record/wait device events
    has_timing_events = False  # whether new_timing_event() gives events that measure device time

    def __init__(self) -> None:
        self._named: Dict[str, Any] = {}
        self._labels: Dict[int, str] = {}
        self._unnamed = 0
        self._keepalive: List[Any] = []

    # -- streams ---------------------------------------------------------------------------

    def stream(self, spec: Any) -> Any:
        """The stream for a TaskSchedule.stream value: None, a name, or a stream object."""
        if spec is None or spec == "default":
            return self.default_stream()
        if isinstance(spec, str):
            if spec not in self._named:
                self._named[spec] = self._new_stream(spec)
            return self._named[spec]
        return self._adopt_stream(spec)

    def stream_label(self, spec: Any) -> str:
        """The name a stream is shown under: 'default', its name, or 'stream<k>' for an object.

        An object may carry its own display name in a ``swp_name`` attribute.
        """
        if spec is None:
            return "default"
        if isinstance(spec, str):
            return spec
        key = id(spec)
        if key not in self._labels:
            self._keepalive.append(spec)
            name = getattr(spec, "swp_name", None)
            if name is None:
                name, self._unnamed = f"stream{self._unnamed}", self._unnamed + 1
            self._labels[key] = name
        return self._labels[key]

    def default_stream(self) -> Any:
        if "default" not in self._named:
            self._named["default"] = _Lane("default")
        return self._named["default"]

    def _new_stream(self, name: str) -> Any:
        return _Lane(name)

    def _adopt_stream(self, obj: Any) -> Any:
        """A lane per stream object (by identity: its label is only for display)."""
        label = self.stream_label(obj)
        key = f"<object {id(obj)}>"
        if key not in self._named:
            self._named[key] = _Lane(label)
        return self._named[key]

    # -- execution and events -----------------------------------------------------------------

    def enter_thread(self) -> None:
        """Called once at the start of every worker thread."""

    def launch(self, stream: Any, fn: TaskFn, ctx: Any, name: str) -> None:
        with stream.lock:
            fn(ctx)

    def new_event(self) -> Any:
        return None

    def new_timing_event(self) -> Any:
        """An event whose ``record()``/``elapsed_time()`` measure device time (tracing only)."""
        raise NotImplementedError(f"{self.kind} has no timing events")

    def record(self, event: Any, stream: Any) -> None:
        """Record ``event`` after the work submitted so far to ``stream``."""

    def wait(self, stream: Any, event: Any) -> None:
        """Make later work on ``stream`` wait for ``event``'s last record."""

    def synchronize(self) -> None:
        """Block until all submitted device work is done."""

    def __str__(self) -> str:
        return self.kind


class _Lane:
    """A CPU execution lane standing in for a stream."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<lane {self.name}>"


class CPUDevice(Device):
    """No accelerator: streams are lanes, events are the CPU signals."""


class TorchDevice(Device):
    """An accelerator driven through torch.Stream / torch.Event."""

    uses_events = True
    has_timing_events = True

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        index: Optional[int] = device.index  # None for a bare "cuda"
        if index is None:
            device = torch.device(device.type, torch.accelerator.current_device_index())
        self.torch_device = device
        self.kind = str(device)
        self._default: Any
        if device.type == "cuda":
            self._default = torch.cuda.default_stream(device)
        else:
            self._default = torch.accelerator.current_stream(device)

    def default_stream(self) -> Any:
        return self._default

    def _new_stream(self, name: str) -> Any:
        return torch.Stream(device=self.torch_device)

    def _adopt_stream(self, obj: Any) -> Any:
        self.stream_label(obj)
        return obj

    def enter_thread(self) -> None:
        torch.accelerator.set_device_index(self.torch_device.index)

    def launch(self, stream: Any, fn: TaskFn, ctx: Any, name: str) -> None:
        with stream:
            fn(ctx)

    def new_event(self) -> Any:
        return torch.Event(device=self.torch_device)

    def new_timing_event(self) -> Any:
        return torch.Event(device=self.torch_device, enable_timing=True)

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def synchronize(self) -> None:
        torch.accelerator.synchronize(self.torch_device.index)


class _SimEvent:
    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.recorded_at: Optional[Tuple[str, int]] = None  # (stream, op position) of the last record


Op = Tuple[Any, ...]


class SimulatedDevice(Device):
    """A device that records what a GPU would be asked to do, for tests.

    ``log[stream]`` is that stream's FIFO of operations, in submission order:
    ``("launch", task, iter)``, ``("record", event_id)``, ``("wait", (stream, position))``
    where the wait names the stream and op position the event was last recorded after
    (``None`` if it was never recorded). Streams run like CPU lanes.
    """

    kind = "sim"
    uses_events = True

    def __init__(self) -> None:
        super().__init__()
        self.log: Dict[str, List[Op]] = {}
        self._log_lock = threading.Lock()
        self._events = 0

    def _append(self, stream: Any, op: Op) -> int:
        with self._log_lock:
            ops = self.log.setdefault(stream.name, [])
            ops.append(op)
            return len(ops) - 1

    def launch(self, stream: Any, fn: TaskFn, ctx: Any, name: str) -> None:
        with stream.lock:
            fn(ctx)
            self._append(stream, ("launch", name, ctx.iter_idx))

    def new_event(self) -> Any:
        with self._log_lock:
            self._events += 1
            return _SimEvent(self._events)

    def record(self, event: Any, stream: Any) -> None:
        with self._log_lock:
            ops = self.log.setdefault(stream.name, [])
            event.recorded_at = (stream.name, len(ops) - 1)
            ops.append(("record", event.ident))

    def wait(self, stream: Any, event: Any) -> None:
        self._append(stream, ("wait", event.recorded_at))

    def launches(self) -> Dict[Tuple[str, int], Tuple[str, int]]:
        """(task, iter) -> (stream, position) of every launch."""
        found = {}
        for name, ops in self.log.items():
            for pos, op in enumerate(ops):
                if op[0] == "launch":
                    found[(op[1], op[2])] = (name, pos)
        return found

    def happens_before(self, first: Tuple[str, int], then: Tuple[str, int]) -> bool:
        """Whether a GPU must finish op ``first`` before it starts op ``then`` (both (stream, pos)).

        True when ``first`` precedes ``then`` on one stream (FIFO), or when ``then``'s
        stream waited, before ``then``, on an event recorded after an op that
        happens-after ``first``.
        """
        seen: Set[Tuple[str, int]] = set()
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


DeviceSpec = Union[None, int, str, torch.device, Device]


def resolve_device(spec: object) -> Device:
    """The Device for a ``device=`` argument.

    ``None``: the current accelerator if there is one, else the CPU. An int: that
    accelerator index, or the CPU (with a warning) when there is no accelerator, so
    examples written for ``device=0`` run anywhere. A string or torch.device:
    exactly that device. A Device instance is used as it is.
    """
    if isinstance(spec, Device):
        return spec
    accel = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if spec is None:
        return TorchDevice(torch.device(accel.type, torch.accelerator.current_device_index())) if accel else CPUDevice()
    if isinstance(spec, bool) or not isinstance(spec, (int, str, torch.device)):
        raise TypeError(f"device must be None, an int, a str such as 'cpu' or 'cuda:1', or a torch.device; got {spec!r}")
    if isinstance(spec, int):
        if spec < 0:
            raise ValueError(f"device index must be >= 0, got {spec}")
        if accel is None:
            logger.warning("device=%d requested but no accelerator is available; running on the CPU", spec)
            return CPUDevice()
        return TorchDevice(_checked(torch.device(accel.type, spec)))
    try:
        dev = torch.device(spec)
    except RuntimeError as exc:
        raise ValueError(f"device {spec!r} is not a device torch knows ({exc})") from None
    if dev.type == "cpu":
        return CPUDevice()
    return TorchDevice(_checked(dev))


def _checked(dev: torch.device) -> torch.device:
    accel = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if accel is None or accel.type != dev.type:
        raise ValueError(
            f"device {str(dev)!r} requested but this machine's accelerator is "
            f"{accel.type if accel else 'absent'}; use device='cpu' or device=None"
        )
    count = torch.accelerator.device_count()
    if dev.index is not None and dev.index >= count:
        raise ValueError(f"device {str(dev)!r} requested but only {count} {dev.type} device(s) exist")
    return dev
