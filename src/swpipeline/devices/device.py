"""The one small interface through which the engines touch streams and events.

Three implementations:

* ``CPUDevice``: no accelerator. A stream is an execution *lane*: tasks on one lane
  never overlap (a lock, as a GPU stream would serialize them) and device events
  reduce to the CPU signals the engine already waits on, so ``uses_events`` is False.
* ``TorchDevice``: an accelerator through torch's device-agnostic ``torch.Stream`` /
  ``torch.Event`` API (CUDA, and any other backend torch exposes the same way).
* ``SimulatedDevice`` (``simulated.py``): for tests, runs like the CPU device but
  records what a GPU would be asked to do, and can model streams running behind the
  host to catch ordering and memory-lifetime mistakes on the CPU.

Guarantees the engines rely on:

* ``launch(stream, fn, ctx, name)`` runs ``fn(ctx)`` on the calling thread with
  ``stream`` current, and returns when ``fn`` returns; the stream is made current
  for that call and that thread only (never through state kept on the stream object,
  which several threads may use at once), and the thread's previous stream is
  restored afterwards.
* ``caller_stream()`` is the stream current on the calling thread: a pipeline's
  ``"default"`` stream for a run is the one current on the thread that fills it, and a
  batch is drawn (``fetch``) on the one current when it is drawn; tasks on other streams
  that read it first wait for an event recorded there right after.
* ``keep_alive(tensor, stream)`` keeps the tensor's memory from being reused until
  ``stream``'s work submitted so far is done (``Tensor.record_stream``), for devices
  that ``tracks_memory``. Whether
to launch at all is the engine's decision: a worker starts no unit once its run is
aborted, and a unit on a stream shared by thread groups waits for its turn on the
stream (a wait that an abort ends), so a lane is never contended and an abort never
waits behind one.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Union

import torch


__all__: List[str] = []

logger = logging.getLogger("swpipeline")

TaskFn = Callable[[Any], Any]


def machine_accelerator() -> Optional[torch.device]:
    """The accelerator torch can use on this machine (its type, e.g. ``cuda``), or None."""
    return torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None


class Device:
    """Base interface; the CPU behaviour is the default."""

    kind = "cpu"
    device_type = "cpu"  # torch's device type of the work (autocast is captured for it and for the CPU)
    uses_events = False  # whether the engine must record/wait device events
    tracks_memory = False  # whether tensors crossing streams must be kept alive for their readers (keep_alive)
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

    def caller_stream(self) -> Any:
        """The stream current on the calling thread (on the CPU: the default lane)."""
        return self.default_stream()

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
        """Run ``fn(ctx)`` with ``stream`` current. On the CPU, a lane needs no lock: one thread group runs a
        lane's units one at a time, and a lane shared by several groups passes its units a turn each."""
        fn(ctx)

    @property
    def launches_directly(self) -> bool:
        """Whether ``launch`` only calls the function (as on the CPU): the engine then calls it itself."""
        return type(self).launch is Device.launch

    def fetch(self, stream: Any, data_iter: Iterator[Any], iter_idx: int) -> Any:
        """``next(data_iter)`` on the calling thread, where ``stream`` is current: what the data iterator
        does on the device goes to ``stream`` (a device that models streams sees it there)."""
        return next(data_iter)

    def new_event(self) -> Any:
        return None

    def new_timing_event(self) -> Any:
        """An event whose ``record()``/``elapsed_time()`` measure device time (tracing only)."""
        raise NotImplementedError(f"{self.kind} has no timing events")

    def keep_alive(self, tensor: Any, stream: Any) -> None:
        """Keep ``tensor``'s memory from reuse until ``stream``'s work submitted so far is done."""

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
    """An accelerator driven through torch's device-generic ``torch.Stream`` / ``torch.Event`` API.

    Args:
        device: the accelerator, e.g. ``"cuda"``, ``"cuda:1"`` or a torch.device.
        stream_priorities: a priority for named streams, e.g. ``{"memcpy": -1}``
            (0 or negative; lower runs first when streams compete, as
            ``torch.Stream(priority=...)``). Streams not named here get priority 0.
    """

    uses_events = True
    has_timing_events = True
    tracks_memory = True

    def __init__(self, device: Union[torch.device, str], *, stream_priorities: Optional[Mapping[str, int]] = None
                 ) -> None:
        super().__init__()
        device = torch.device(device)
        accel = machine_accelerator()
        if accel is None or accel.type != device.type:
            raise ValueError(f"TorchDevice({str(device)!r}): this machine's accelerator is "
                             f"{accel.type if accel else 'absent'}; a TorchDevice drives an accelerator (for the "
                             f"CPU, pass device=\"cpu\" or CPUDevice())")
        index: Optional[int] = device.index  # None for a bare "cuda"
        if index is None:
            device = torch.device(device.type, torch.accelerator.current_device_index())
        self.torch_device = device
        self.index: int = device.index if device.index is not None else 0
        self.kind = str(device)
        self.device_type = device.type
        self._priorities = dict(stream_priorities or {})
        for name, priority in self._priorities.items():
            if not isinstance(name, str) or isinstance(priority, bool) or not isinstance(priority, int) or priority > 0:
                raise ValueError(f"stream_priorities: {name!r}: {priority!r}; give each stream name an int <= 0 "
                                 f"(negative numbers run first)")
        self._default: Any = torch.accelerator.current_stream(self.index)
        if device.type == "cuda":
            self._default = torch.cuda.default_stream(device)

    def default_stream(self) -> Any:
        return self._default

    def caller_stream(self) -> Any:
        return torch.accelerator.current_stream(self.index)

    def _new_stream(self, name: str) -> Any:
        return torch.Stream(device=self.torch_device, priority=self._priorities.get(name, 0))

    def _adopt_stream(self, obj: Any) -> Any:
        self.stream_label(obj)
        return obj

    def enter_thread(self) -> None:
        torch.accelerator.set_device_index(self.index)

    def launch(self, stream: Any, fn: TaskFn, ctx: Any, name: str) -> None:
        # Per call and per thread: torch keeps the current stream per thread, so two thread groups can run
        # on one stream object at once (``with stream:`` would share one saved-stream slot on the object).
        previous = torch.accelerator.current_stream(self.index)
        torch.accelerator.set_stream(stream)
        try:
            fn(ctx)
        finally:
            torch.accelerator.set_stream(previous)

    def keep_alive(self, tensor: Any, stream: Any) -> None:
        if tensor.device.type == self.device_type and tensor.layout == torch.strided:
            tensor.record_stream(stream)

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
    accel = machine_accelerator()
    if spec is None:
        return TorchDevice(torch.device(accel.type, torch.accelerator.current_device_index())) if accel else CPUDevice()
    if isinstance(spec, bool) or not isinstance(spec, (int, str, torch.device)):
        raise TypeError(f"device must be None, an int, a str such as 'cpu' or 'cuda:1', or a torch.device; "
                        f"got {spec!r}")
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
    accel = machine_accelerator()
    if accel is None or accel.type != dev.type:
        raise ValueError(
            f"device {str(dev)!r} requested but this machine's accelerator is "
            f"{accel.type if accel else 'absent'}; use device='cpu' or device=None"
        )
    count = torch.accelerator.device_count()
    if dev.index is not None and dev.index >= count:
        raise ValueError(f"device {str(dev)!r} requested but only {count} {dev.type} device(s) exist")
    return dev
