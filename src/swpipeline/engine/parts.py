"""A pipeline's parts, made once from its plan, and the public methods that hand over to them.

``_PipelineParts`` resolves everything a pipeline needs from its plan and arguments, once:
the device, each task's stream and dependencies (``runtime.TaskSpec``), the schedule
(``schedule.Schedule``), the release rule the engine passes in, the thread group run on
the caller's thread, and what every run is made from (``assemble.RunSettings``). It holds
the pipeline's parts, each owning its behaviour and none referring back to the pipeline::

    _shortcut    shortcut/replay.ShortcutSettings   which tasks are shortcut, their caches
    _serial      serial.SerialBaseline              the serial baseline (run_serial)
    _tracing     tracing.Tracing                    whether a fill is traced; the last timeline

and the public methods that only check that nothing is in flight (``_require_idle``) and
hand over to a part. How a pipeline runs (fill, progress, advance, drain, abandon, run) is
the life cycle's, ``pipeline._PipelineBase``, which builds on this class; this class only
reads whether a run is in flight (``_run``).
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, List, Optional, Tuple, Union

from ..devices.annotations import resolve_emit_nvtx
from ..devices.device import Device, DeviceSpec, resolve_device
from ..errors import SharedStreamWarning, warn_caller
from ..observe.stats import RunStats
from ..observe.timeline import Timeline
from ..plan import ordering
from ..plan.context import IterContext
from ..plan.model import PipelinePlan
from ..shortcut.replay import ShortcutSettings
from .assemble import RunSettings
from .crew import Stragglers
from .driving import DriverSeat, Occupancy, driving
from .hooks import hooks_for
from .modes import device_types
from .release import ReleaseRule
from .run import Run
from .runtime import build_tasks, shared_stream_message, shared_streams
from .schedule import Schedule
from .serial import SerialBaseline
from .tracing import Tracing

if TYPE_CHECKING:
    from ..analysis.report import PlanAnalysis  # free_early=analyze(...): a type the engine never imports

__all__: List[str] = []

RuleOf = Callable[[int], ReleaseRule]  # the engine's release rule, made for the plan's depth


def _seconds(name: str, value: object) -> float:
    """A timeout argument: a finite number of seconds > 0 (at most threading.TIMEOUT_MAX)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a finite number of seconds > 0, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value > threading.TIMEOUT_MAX:
        raise ValueError(f"{name} must be a finite number of seconds > 0 (at most {threading.TIMEOUT_MAX:g}), got "
                         f"{value!r}: a wait without end could not be told from a hang; use a large finite value")
    if value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


class _PipelineParts:
    """What a pipeline is made of (see the module docstring).

    ``rule_of`` makes the engine's release rule for the plan's depth (``ClockRule``, or a
    ``DataFlowRule`` with its ``max_depth``); the other arguments are the engines' own.
    """

    def __init__(self, plan: PipelinePlan, rule_of: RuleOf, device: DeviceSpec = None, *,
                 signal_timeout: float = 30.0, progress_timeout: float = 60.0, join_timeout: float = 10.0,
                 worker_init: Optional[Callable[[str], None]] = None, check_races: bool = False,
                 free_early: Union[bool, PlanAnalysis] = False, keep: Iterable[str] = (),
                 caller_thread_group: Optional[str] = "auto") -> None:
        if not isinstance(plan, PipelinePlan):
            raise TypeError(f"plan must be a PipelinePlan, got {type(plan).__name__}")
        if not isinstance(check_races, bool):
            raise TypeError(f"check_races must be True or False, got {check_races!r}")
        self.signal_timeout = _seconds("signal_timeout", signal_timeout)
        self.progress_timeout = _seconds("progress_timeout", progress_timeout)
        self.join_timeout = _seconds("join_timeout", join_timeout)
        if worker_init is not None and not callable(worker_init):
            raise TypeError(f"worker_init must be a callable taking the thread group name, got {worker_init!r}")
        self.plan = plan
        self.worker_init = worker_init
        self._rule = rule_of(plan.depth)
        self._device_asked = device
        self.device = resolve_device(device)
        self._mode_types = device_types(self.device.device_type)  # whose autocast state to carry to workers
        ordering.validate_stages(plan)
        self._tasks = build_tasks(plan, self.device)
        shared = shared_streams(self._tasks)
        if shared:
            warn_caller(shared_stream_message(shared), SharedStreamWarning)
        self._schedule = Schedule.build(plan, {t.name: t.stream_label for t in self._tasks},
                                        {t.name: t.stream for t in self._tasks})
        self._by_name = {t.name: t for t in self._tasks}
        self._serial_order = [self._by_name[n] for n in ordering.serial_order(plan)]
        self._groups = list(dict.fromkeys(t.group for t in self._tasks))
        hooks = hooks_for(plan, check_races=check_races, free_early=free_early, keep=keep)
        self._race_checker = hooks.race_checker  # check_races=True: its warnings
        # the pipeline's parts: its shortcut settings, its serial baseline, its tracing
        self._shortcut = ShortcutSettings(self._tasks, hooks.task_wrapper)  # (no part refers back to the pipeline)
        self._serial = SerialBaseline(self._serial_order, self.device, self._shortcut.label, type(self).__name__)
        self._tracing = Tracing(self.device, type(self).__name__, self._serial.names)
        # a thread group run by the thread that drives the pipeline: in every fill / in run()
        self._fill_caller_group, self._run_caller_group = self._caller_groups(caller_thread_group)
        # what every run is made from (event slots: inter-iteration consumers lag up to the plan's reach)
        self._run_settings = RunSettings(self._schedule, self._rule, self._tasks, self._groups, self.device,
                                         self._rule.max_live + plan.reach, self.signal_timeout, self.progress_timeout,
                                         self.join_timeout, worker_init, hooks.free_uses,
                                         self._rule.yields_after_hand_out)
        self._run: Optional[Run] = None  # the current fill (None: idle)
        self._peak_live_contexts = 0
        self._stragglers = Stragglers()  # threads of ended runs that were still in a task
        self._seat = DriverSeat()
        self._nvtx = False  # NVTX ranges for the run in progress (run(emit_nvtx=True))

    def _caller_groups(self, value: object) -> Tuple[Optional[str], Optional[str]]:
        """``caller_thread_group`` as (the group on the caller's thread in every fill, the one in ``run()``)."""
        refusal = self._rule.caller_group_refusal()
        if value == "auto":
            auto = self.worker_init is None and refusal is None
            return None, ordering.last_stage_group(self.plan) if auto else None
        if value is None:
            return None, None
        if not isinstance(value, str) or value not in self._groups:
            raise ValueError(f"caller_thread_group={value!r} is not a thread group of the plan (its groups: "
                             f"{self._groups}); or pass \"auto\" or None")
        if refusal is not None:
            raise ValueError(f"caller_thread_group={value!r}: {refusal}")
        return value, value

    def _active_run(self) -> Optional[Run]:
        run = self._run
        return run if run is not None and run.active else None

    def _occupancy(self) -> Optional[Occupancy]:
        """What the current run (the last one, if it ended) runs on which thread (see driving.py)."""
        return self._run

    def _require_idle(self, what: str) -> None:
        if self._active_run() is not None:
            raise RuntimeError(f"{what}() while iterations are in flight; call drain() first")

    # -- the serial baseline, shortcuts and tracing: the pipeline's parts ------------------------

    @property
    def serial_order(self) -> List[str]:
        """The tasks in the order a serial iteration runs them (topological; ties by stage, then name)."""
        return self._serial.names

    @driving
    def run_one_serial_iter(self, batch: Any, iter_idx: int = 0) -> IterContext:
        """Run one iteration serially on the calling thread, tasks in topological order.

        Needs no fill_pipeline() and leaves no state behind. Returns the IterContext.
        """
        if self._active_run() is not None:
            raise RuntimeError("run_one_serial_iter() while pipelined iterations are in flight; call drain() first")
        return self._serial.iteration(batch, iter_idx)

    @driving
    def run_serial(self, data_iter: Iterable[Any], verbose: bool = False, emit_nvtx: bool = False) -> float:
        """Run every batch serially (no threads, default stream) as a baseline; returns seconds."""
        if self._active_run() is not None:
            raise RuntimeError("run_serial() while pipelined iterations are in flight; call drain() first")
        return self._serial.run(data_iter, verbose, resolve_emit_nvtx(emit_nvtx))

    def enable_shortcut(self, *names: str) -> None:
        """Shortcut these tasks: the next execution caches what each leaves on the context, later ones replay it.

        Settings and caches survive drain(); globally ordered tasks keep their turn.

        Raises:
            ValueError: an unknown task name.
            RuntimeError: iterations are in flight (call drain() first).
        """
        self._require_idle("enable_shortcut")
        self._shortcut.enable(names)

    def disable_shortcut(self, *names: str) -> None:
        """Run these tasks normally again and drop their caches."""
        self._require_idle("disable_shortcut")
        self._shortcut.disable(names)

    @property
    def shortcuts(self) -> List[str]:
        """The names of the shortcut tasks, sorted."""
        return self._shortcut.names

    def without_shortcuts(self) -> ContextManager[None]:
        """Within the block no task is shortcut and no cache exists; afterwards both are as before."""
        self._require_idle("without_shortcuts")
        return self._shortcut.suspended()

    def tracing(self) -> ContextManager[None]:
        """Record the timeline of every ``fill_pipeline()`` started in the block; read ``pipe.timeline`` after.

        For step-by-step loops; ``run(data, trace=True)`` is the one-call form.
        """
        return self._tracing.scope()

    @property
    def timeline(self) -> Optional[Timeline]:
        """What the last fill ran where and when, if it was traced (see ``run(trace=...)``), else None."""
        return self._tracing.timeline

    def stats(self) -> RunStats:
        """Per-task and per-run statistics of the last traced run (``print(pipe.stats())`` shows a table).

        Raises:
            RuntimeError: the last run was not traced.
        """
        return self._tracing.stats()

    # -- state ----------------------------------------------------------------------------------

    @property
    def last_context(self) -> Optional[IterContext]:
        """The IterContext of the iteration the last progress() call retired."""
        run = self._run
        return run.feed.last_ctx if run is not None else None

    @property
    def peak_live_contexts(self) -> int:
        """The most IterContexts alive at once during the current (or last) fill."""
        run = self._run
        return run.feed.peak_live_contexts if run is not None else self._peak_live_contexts

    def _device_text(self) -> str:
        """The device for ``repr``: what was asked for, and what is used when that differs (``0 (cpu)``)."""
        asked, used = self._device_asked, str(self.device)
        if asked is None or isinstance(asked, Device):
            return used
        same = (getattr(self.device, "index", None) == asked and used != "cpu" if isinstance(asked, int)
                else str(asked) == used)
        return str(asked) if same else f"{asked} ({used})"
