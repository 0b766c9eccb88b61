"""_PipelineBase: the life cycle both engines share, driving one ``Run`` per fill.

An engine supplies its release rule (``_rule``, see ``release.py``): when a unit is
handed to its worker. ``handout.HandOut`` applies it for each run. Everything else is
here or in the modules this one composes:

* ``run.py``: the state of one fill (board, turns, events, workers, contexts,
  failure, stopping within one join budget), and the stragglers of ended runs;
* ``executor.py``: one unit of work, the two-phase protocol;
* ``driving.py``: who may drive a pipeline (one thread at a time, never a task of it);
* ``shutdown.py``: runs nobody stopped, at exit and on garbage collection;
* the public API's other facets, mixed in: ``serial.py`` (the serial baseline),
  ``shortcut.py`` (shortcut settings), ``tracing.py`` (timelines, statistics).

Any exception that leaves a driving call while iterations are in flight ends the
run: its iterations are abandoned (not drained) and its workers joined before the
exception reaches the caller. (Misuse refused at once, before anything is touched, is
the exception: a second thread, ``progress()`` before ``advance()``, a data argument
that is not an iterator.) The failure is raised without a reference cycle (``_fail``),
so what the caller's frames hold is freed when the caller drops the exception.

The step boundary. ``progress(it, advance=False)`` retires iteration k, then waits until
every unit already handed out that can run without more being handed out has returned
(``HandOut.boundary``), and returns; nothing is handed out until ``advance()``. So in
between no task runs: a unit not waited for waits, directly or through others, for a
unit not handed out (the boundary is the fixpoint of "its dependencies, its thread
group's earlier units and its turns are done or will be"), and only ``advance()`` hands
out more. What has run is fixed by the plan and the iterations fetched, never by timing:
on ``SWPipeline`` the units of the periods released so far; on ``DataFlowPipeline`` also
the units of later iterations it ran ahead on (``dataflow.py``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from typing import (TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Iterator, List, NoReturn, Optional,
                    Tuple, Union, cast)

import torch

from ..plan import ordering
from . import shutdown
from .hooks import hooks_for
from ..devices.annotations import resolve_emit_nvtx
from ..devices.device import Device, DeviceSpec, resolve_device
from .driving import DriverSeat, Occupancy, driving
from .executor import Launch, RunBatch, bare_functions, make_batch_runner, make_launches, make_unit_runner, traced
from .handout import HandOut
from .lifetime import EarlyFree
from .modes import Modes, device_types
from ..plan.model import IterContext, PipelinePlan
from ..observe.progress_line import ProgressLine, len_or_none
from .run import ABANDONED, FAILED, FINISHED, HELD, Run, RunState, Stragglers
from ..errors import SharedStreamWarning, warn_caller
from .runtime import bind_run, build_tasks, run_default_stream, shared_stream_message, shared_streams
from .release import ReleaseRule
from .schedule import Schedule
from .serial import SerialBaseline
from ..shortcut.replay import ShortcutSettings
from ..observe.stats import RunStats
from ..observe.timeline import Timeline, parse_trace
from .tracing import Tracing
from .worker import enter_worker_thread

if TYPE_CHECKING:
    from ..analysis.report import PlanAnalysis  # free_early=analyze(...): a type the engine never imports

__all__: List[str] = []

def _data_source(data_iter: object) -> Iterator[Any]:
    """``data_iter`` if it is an iterator; a TypeError otherwise (an iterable would start over on every call)."""
    if not callable(getattr(type(data_iter), "__next__", None)):
        raise TypeError(f"progress(): data_iter must be an iterator (the one fill_pipeline() returned) or None, "
                        f"got a {type(data_iter).__name__}: an iterable that is not an iterator would give its "
                        f"first batch again on every call; pass the iterator fill_pipeline(data) returned "
                        f"(nothing was retired or fetched)")
    return cast(Iterator[Any], data_iter)


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


class _PipelineBase:
    """Shared infrastructure of the pipeline engines (see the module docstring)."""

    def __init__(self, plan: PipelinePlan, num_slots: int, device: DeviceSpec = None, *,
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
        self._device_asked = device
        self.device = resolve_device(device)
        self._mode_types = device_types(self.device.device_type)  # whose autocast state to carry to workers
        self._event_slots = num_slots + plan.reach  # see runtime.bind_run: inter consumers lag up to reach
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
        self._free_uses = hooks.free_uses
        # the pipeline's parts: its shortcut settings, its serial baseline, its tracing
        self._shortcut = ShortcutSettings(self._tasks, hooks.task_wrapper)  # (no part refers back to the pipeline)
        self._serial = SerialBaseline(self._serial_order, self.device, self._shortcut.label, type(self).__name__)
        self._tracing = Tracing(self.device, type(self).__name__, self._serial.names)
        # a thread group run by the thread that drives the pipeline: in every fill / in run()
        self._fill_caller_group, self._run_caller_group = self._caller_groups(caller_thread_group)
        self._run: Optional[Run] = None  # the current fill (None: idle)
        self._peak_live_contexts = 0
        self._stragglers = Stragglers()  # threads of ended runs that were still in a task
        self._seat = DriverSeat()
        self._nvtx = False  # NVTX ranges for the run in progress (run(emit_nvtx=True))

    # -- the run's life cycle ------------------------------------------------------------------

    _rule: ReleaseRule  # the engine's release rule (set by the engine's constructor)
    _yield_after_hand_out = False  # let a worker just handed work take the GIL at once (see handout)

    def _caller_groups(self, value: object) -> Tuple[Optional[str], Optional[str]]:
        """``caller_thread_group`` as (the group on the caller's thread in every fill, the one in ``run()``)."""
        if value == "auto":
            auto = self.worker_init is None and self._caller_group_refusal() is None
            return None, ordering.last_stage_group(self.plan) if auto else None
        if value is None:
            return None, None
        if not isinstance(value, str) or value not in self._groups:
            raise ValueError(f"caller_thread_group={value!r} is not a thread group of the plan (its groups: "
                             f"{self._groups}); or pass \"auto\" or None")
        refusal = self._caller_group_refusal()
        if refusal is not None:
            raise ValueError(f"caller_thread_group={value!r}: {refusal}")
        return value, value

    def _caller_group_refusal(self) -> Optional[str]:
        """Why no group may run on the caller's thread with this engine's settings (None: it may)."""
        return None

    def _start_run(self, data_iter: Iterator[Any], caller_group: Optional[str]) -> None:
        self._stragglers.check(self.join_timeout)
        default = run_default_stream(self.device, self._tasks)
        run = Run(bind_run(self._tasks, self.device, self._event_slots, default), self.device, self._event_slots,
                  progress_timeout=self.progress_timeout, join_timeout=self.join_timeout, default_stream=default,
                  signal_timeout=self.signal_timeout)
        self._run = run
        shutdown.track(run)
        try:
            labels = {t.index: self._shortcut.label(t.name) for t in self._tasks}
            recorder = self._tracing.new_recorder(run.tasks, caller_group)
            wait = recorder.timed_wait(run.board.wait_task) if recorder is not None else None
            handout = HandOut(run, self._schedule, self._rule, yield_after_hand_out=self._yield_after_hand_out)
            free = EarlyFree(self._free_uses).done if self._free_uses is not None else None
            tasks = recorder.runtimes if recorder is not None else run.tasks  # a traced run times shadow tasks

            def executor(launch: Launch, timeout: float) -> RunBatch:
                run_unit = make_unit_runner(run.board, self.device, launch, tasks, self._event_slots, timeout, wait,
                                            free, run.batch_events, run.batch_streams)
                if recorder is not None:  # every unit through the traced executor
                    return make_batch_runner(run.board, traced(run_unit, recorder, self._rule.name == "clock"))
                return make_batch_runner(run.board, run_unit, bare_functions(tasks, launch, free))

            plain, annotated = make_launches(self.device, labels, self._nvtx)
            batches = (executor(plain, self.signal_timeout), executor(annotated, self.signal_timeout))
            caller_batches = (executor(plain, run.caller_timeout), executor(annotated, run.caller_timeout))
            run.handout = handout
            run.data_source = data_iter
            torch_threads, device, worker_init = torch.get_num_threads(), self.device, self.worker_init

            def enter(group: str) -> Callable[[], None]:  # must not hold the pipeline (see shutdown.py)
                return functools.partial(enter_worker_thread, torch_threads, device, worker_init, group)

            run.start_workers(self._groups, batches, enter, caller_group, caller_batches)
            run.watch(self)
            run.modes = Modes.capture(self._mode_types)
            handout.fill(data_iter)
        except BaseException as exc:
            self._fail(run, exc)

    def _end(self, run: Run, state: RunState) -> None:
        """Stop ``run`` (idempotent), remembering any straggler."""
        try:
            stragglers = run.stop(state)
        finally:
            self._peak_live_contexts = run.peak_live_contexts
        self._stragglers.adopt(run, stragglers)

    def _fail(self, run: Run, exc: BaseException) -> NoReturn:
        """End the run as failed (its threads joined) and raise ``exc`` in the caller.

        This frame is on the raised exception's traceback: it must not keep the exception as a
        local, or the two would form a reference cycle holding every frame of the traceback (the
        caller's locals among them) until a garbage collection.
        """
        run.record_failure(exc)
        try:
            self._end(run, FAILED)
            raise exc
        finally:
            del exc

    def _discard_run(self) -> None:
        """Forget the (stopped) run: the pipeline is idle again."""
        self._run = None

    def _active_run(self) -> Optional[Run]:
        run = self._run
        return run if run is not None and run.active else None

    def _occupancy(self) -> Optional[Occupancy]:
        """What the current run (the last one, if it ended) runs on which thread (see driving.py)."""
        return self._run

    # -- public API ----------------------------------------------------------------------------

    @driving
    def fill_pipeline(self, data_iter: Iterable[Any]) -> Iterator[Any]:
        """Start the workers and submit the first iterations; returns the iterator to pass to progress().

        Args:
            data_iter: any iterable of batches.

        Raises:
            RuntimeError: the pipeline is already filled (call drain() first), or a thread of an
                earlier run is still inside a task.
            TypeError: ``data_iter`` is not iterable.
        """
        return self._fill(data_iter, self._fill_caller_group)

    def _fill(self, data_iter: Iterable[Any], caller_group: Optional[str]) -> Iterator[Any]:
        if self._active_run() is not None:
            raise RuntimeError("fill_pipeline() called while iterations are still in flight; call drain() first "
                               "(or keep calling progress() until StopIteration)")
        try:
            it = iter(data_iter)
        except TypeError:
            raise TypeError(f"fill_pipeline: data_iter must be iterable, got {type(data_iter).__name__}") from None
        self._start_run(it, caller_group)
        return it

    @driving
    def progress(self, data_iter: Optional[Iterator[Any]] = None, *, advance: bool = True) -> int:
        """Retire the oldest in-flight iteration and advance; returns its iter_idx.

        Args:
            data_iter: where the next batch comes from; ``None`` retires without fetching.
            advance: False: retire, then wait until every unit already handed out that can run has
                returned; no task runs until ``advance()`` is called, so the caller may touch the
                model in between (TorchRec's step boundary). What has run by then is fixed by the
                plan: on ``SWPipeline`` the units of the periods released so far; on
                ``DataFlowPipeline`` also those of later iterations that it ran ahead on.

        Raises:
            StopIteration: no iteration is left in flight (the worker threads are then joined).
                After ``progress(None)`` retired every iteration in flight, ``progress(data_iter)``
                fills the pipeline again from it instead (the iteration numbers go on).
            TypeError: ``data_iter`` is not an iterator (nothing is retired or fetched).
            RuntimeError: progress() before fill_pipeline(), after a failure, or with data after
                a ``progress(None)`` that raised StopIteration.
            ProgressTimeoutError: the oldest iteration did not complete in ``progress_timeout``.
            Exception: whatever a task or the data iterator raised, annotated with the task and
                iteration. Any exception ends the run: the iterations in flight are abandoned.
        """
        return self._progress(data_iter, advance)

    def _progress(self, data_iter: Optional[Iterator[Any]], advance: bool = True) -> int:
        run = self._running(data_iter)
        if data_iter is not run.data_source and data_iter is not None:
            run.data_source = _data_source(data_iter)
        if run.state is HELD:
            raise RuntimeError("progress() while the last progress(advance=False) has not been followed by "
                               "advance(); call advance() first")
        if run.next_retire >= run.num_created:  # nothing in flight
            self._resume_or_finish(run, data_iter)
        try:
            run.handout.run_caller_units(advance)
            oldest = run.retire_oldest()
            if advance:
                run.modes = Modes.capture(self._mode_types)
                run.handout.after_retire(oldest, data_iter)
            else:
                run.hold(oldest, data_iter)
                run.settle(run.handout.boundary())
            return oldest
        except BaseException as exc:
            self._fail(run, exc)

    def _resume_or_finish(self, run: Run, data_iter: Optional[Iterator[Any]]) -> None:
        """Nothing is in flight: fill again from ``data_iter`` if ``progress(None)`` emptied the pipeline
        before the data ended; else end the run (StopIteration)."""
        if data_iter is not None and not run.exhausted:
            try:
                run.modes = Modes.capture(self._mode_types)
                run.handout.resume(data_iter)
            except BaseException as exc:
                self._fail(run, exc)
            if run.next_retire < run.num_created:
                return
        self._end(run, FINISHED)
        raise StopIteration

    def _running(self, data_iter: Optional[Iterator[Any]]) -> Run:
        run = self._run
        if run is None:
            raise RuntimeError("progress() called before fill_pipeline(); call fill_pipeline(data) first")
        if run.active:
            return run
        if run.state is FINISHED:
            if run.emptied and data_iter is not None:
                raise RuntimeError("progress(data) after progress(None) retired the last iteration in flight: that "
                                   "ended the run (StopIteration) and nothing was fetched from the data since; call "
                                   "fill_pipeline(data) to start again (no batch was taken from it)")
            raise StopIteration
        raise RuntimeError("progress() after the pipeline failed (the error was raised earlier); "
                           "call drain() and fill_pipeline() to start again")

    @driving
    def advance(self, fetch: bool = True) -> None:
        """Start what the last ``progress(advance=False)`` held back (its batch too, unless ``fetch`` is False)."""
        self._advance(fetch)

    def _advance(self, fetch: bool) -> None:
        run = self._active_run()
        held = run.unhold() if run is not None else None
        if run is None or held is None:
            return
        oldest, data_iter = held
        try:
            run.modes = Modes.capture(self._mode_types)
            run.handout.after_retire(oldest, data_iter if fetch else None)
        except BaseException as exc:
            self._fail(run, exc)

    @driving
    def abandon(self) -> None:
        """Stop now without running the iterations in flight (their batches are dropped); ready for a new fill."""
        self._abandon()

    def _abandon(self) -> None:
        run = self._run
        if run is None:
            return
        self._end(run, ABANDONED)
        self._discard_run()

    def contexts_in_flight(self) -> List[IterContext]:
        """The IterContexts of the iterations in flight, oldest first."""
        run = self._active_run()
        if run is None:
            return []
        contexts = run.contexts.copy()
        return [contexts[i] for i in sorted(contexts)]

    @driving
    def drain(self) -> None:
        """Retire every in-flight iteration, stop and join the workers, and reset for a new fill.

        Shortcut settings and caches are kept. After a failure it only cleans up; with nothing
        pipelined (after serial iterations) it synchronizes the device.
        """
        self._drain()

    def _drain(self) -> None:
        run = self._run
        if run is None:  # nothing pipelined (serial iterations at most): just a device synchronize
            self.device.synchronize()
            return
        try:
            self._advance(fetch=False)
            while run.active:
                try:
                    self._progress(None)
                except StopIteration:
                    break
        finally:
            if run.active:  # an exception (an interrupt) left the loop above
                self._end(run, ABANDONED)
            self._discard_run()
        if run.state is FINISHED:
            self.device.synchronize()

    @driving
    def run(self, data_iter: Iterable[Any], verbose: bool = False, emit_nvtx: bool = False,
            trace: Any = None) -> float:
        """Run every batch of ``data_iter`` through the pipeline; returns wall-clock seconds.

        Args:
            data_iter: any iterable of batches.
            verbose: show a progress line on stderr, record the timeline and print ``stats()`` at the end.
            emit_nvtx: emit NVTX ranges ``SWP/{Task}/iter{N}`` (CUDA only; ignored elsewhere).
            trace: ``True`` records the run's timeline (``pipe.timeline``, ``pipe.stats()``); a path
                also writes it there as Chrome/Perfetto trace JSON. Off (``None``) costs nothing.

        Raises:
            RuntimeError: a ``fill_pipeline()`` run is in flight (it is left as it is).
            Exception: whatever a task or the data iterator raised; an exception (Ctrl-C included)
                abandons the iterations in flight and joins the workers before it surfaces.
        """
        if self._active_run() is not None:
            raise RuntimeError("run() while a fill_pipeline() run is in flight; finish it (progress() until "
                               "StopIteration, or drain()) or abandon() it first")
        record, trace_path = parse_trace(trace)  # a bad path is refused before anything runs
        was_tracing = self._tracing.begin(record or verbose)
        bar = ProgressLine(type(self).__name__, len_or_none(data_iter)) if verbose else None
        self._nvtx = resolve_emit_nvtx(emit_nvtx)
        start = time.perf_counter()
        try:
            with self._nvtx_context():
                it = self._fill(data_iter, self._run_caller_group)
                while True:
                    try:
                        self._progress(it)
                    except StopIteration:
                        break
                    if bar is not None:
                        bar.step()
                self._drain()
            elapsed = time.perf_counter() - start
        except BaseException:
            self._abandon()
            raise
        finally:
            self._nvtx = False
            self._tracing.end(was_tracing)
            if bar is not None:
                bar.close()
        self._tracing.publish(trace_path, verbose)
        return elapsed

    def _nvtx_context(self) -> Any:
        from ..devices.annotations import emit_nvtx_context

        return emit_nvtx_context() if self._nvtx else contextlib.nullcontext()

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

    def _require_idle(self, what: str) -> None:
        if self._active_run() is not None:
            raise RuntimeError(f"{what}() while iterations are in flight; call drain() first")

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
        return run.last_ctx if run is not None else None

    @property
    def peak_live_contexts(self) -> int:
        """The most IterContexts alive at once during the current (or last) fill."""
        run = self._run
        return run.peak_live_contexts if run is not None else self._peak_live_contexts

    def _device_text(self) -> str:
        """The device for ``repr``: what was asked for, and what is used when that differs (``0 (cpu)``)."""
        asked, used = self._device_asked, str(self.device)
        if asked is None or isinstance(asked, Device):
            return used
        same = (getattr(self.device, "index", None) == asked and used != "cpu" if isinstance(asked, int)
                else str(asked) == used)
        return str(asked) if same else f"{asked} ({used})"

    def __enter__(self) -> "_PipelineBase":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.drain()
        else:
            self.abandon()  # an exception (Ctrl-C too) abandons what is in flight instead of running it
