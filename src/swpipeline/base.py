"""_PipelineBase: the public API both engines share, driving one ``Run`` per fill.

An engine supplies a *policy* for each run (``_new_policy``): when a task of an
iteration is handed to its worker (``fill``, ``after_retire``, and optionally
``after_complete``, called on the worker right after a unit completed). Everything
else is here or in the modules this one composes:

* ``run.py``: the state of one fill (board, turns, events, workers, contexts,
  failure, stopping within one join budget);
* ``executor.py``: one unit of work, the two-phase protocol;
* ``shutdown.py``: runs nobody stopped, at exit and on garbage collection;
* ``tracing.py``: recording timelines, statistics;
* ``shortcut.py``: task shortcut.

Who may call what: a pipeline is *driven* (``fill_pipeline``, ``progress``, ``advance``,
``drain``, ``abandon``, ``run``, ``run_serial``, ``run_one_serial_iter``) by one thread
at a time, never from inside one of its own tasks; anything else is refused at once
with an error naming both parties. Any exception that leaves a driving call while
iterations are in flight ends the run: its iterations are abandoned (not drained) and
its workers joined before the exception reaches the caller.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
import weakref
from typing import (Any, Callable, ContextManager, Dict, Iterable, Iterator, List, NoReturn, Optional, Protocol, Set,
                    Tuple, TypeVar)

import torch

from . import ordering, shutdown
from .annotations import profiler_active, resolve_emit_nvtx, run_annotated
from .device import Device, DeviceSpec, resolve_device
from .errors import annotate, stop_iteration_error
from .executor import AfterComplete, make_launch, make_unit_runner, traced
from .plan import IterContext, PipelinePlan
from .progress_line import ProgressLine, len_or_none
from .run import ABANDONED, FAILED, FINISHED, Run
from .runtime import bind_run, build_tasks
from .schedule import Schedule
from .shortcut import ShortcutTable
from .timeline import parse_trace
from .tracing import Tracing, _Scoped
from .worker import Worker

__all__: List[str] = []

logger = logging.getLogger("swpipeline")

F = TypeVar("F", bound=Callable[..., Any])


class Policy(Protocol):
    """What an engine decides for one run: when units are handed to workers."""

    @property
    def after_complete(self) -> Optional[AfterComplete]: ...

    def fill(self, data_iter: Iterator[Any]) -> None: ...

    def after_retire(self, oldest: int, data_iter: Optional[Iterator[Any]]) -> None: ...


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


def _driving(method: F) -> F:
    """Mark a method that drives the pipeline: one thread at a time, never from inside a task."""
    name = method.__name__

    @functools.wraps(method)
    def guarded(self: "_PipelineBase", *args: Any, **kwargs: Any) -> Any:
        me = threading.current_thread()
        claim = (me.ident, name, me.name)
        try:
            self._claim(claim)
            return method(self, *args, **kwargs)
        finally:
            if self._driver is claim:
                self._driver = None

    return guarded  # type: ignore[return-value]


def _enter_worker_thread(torch_threads: int, device: Device, worker_init: Optional[Callable[[str], None]],
                         group: str) -> None:
    # Torch's intra-op thread count is per OS thread: give workers the caller's setting.
    torch.set_num_threads(torch_threads)
    device.enter_thread()
    if worker_init is not None:
        worker_init(group)


class _PipelineBase(Tracing):
    """Shared infrastructure of the pipeline engines (see the module docstring)."""

    def __init__(self, plan: PipelinePlan, num_slots: int, device: DeviceSpec = None, *,
                 signal_timeout: float = 30.0, progress_timeout: float = 60.0, join_timeout: float = 10.0,
                 worker_init: Optional[Callable[[str], None]] = None) -> None:
        if not isinstance(plan, PipelinePlan):
            raise TypeError(f"plan must be a PipelinePlan, got {type(plan).__name__}")
        self.signal_timeout = _seconds("signal_timeout", signal_timeout)
        self.progress_timeout = _seconds("progress_timeout", progress_timeout)
        self.join_timeout = _seconds("join_timeout", join_timeout)
        if worker_init is not None and not callable(worker_init):
            raise TypeError(f"worker_init must be a callable taking the thread group name, got {worker_init!r}")
        self.plan = plan
        self.worker_init = worker_init
        self.device = resolve_device(device)
        self._event_slots = num_slots + 1  # see runtime.bind_run: inter consumers may lag one iteration
        ordering.validate_stages(plan)
        self._tasks = build_tasks(plan, self.device)
        self._schedule = Schedule.build(plan, {t.name: t.stream_label for t in self._tasks},
                                        {t.name: t.stream for t in self._tasks})
        self._by_name = {t.name: t for t in self._tasks}
        self._serial_order = [self._by_name[n] for n in ordering.serial_order(plan)]
        self._groups = list(dict.fromkeys(t.group for t in self._tasks))
        self._shortcuts = ShortcutTable(plan.tasks)
        self._caller_group: Optional[str] = None  # a thread group run by the caller of progress()
        self._run: Optional[Run] = None  # the current fill (None: idle)
        self._peak_live_contexts = 0
        self._stragglers: List[Worker] = []  # threads of ended runs that were still in a task
        self._driver: Optional[Tuple[Optional[int], str, str]] = None  # (thread, method, thread name) driving
        self._claim_lock = threading.Lock()
        self._nvtx = False
        self._slot = shutdown.RunSlot()
        weakref.finalize(self, self._slot.release)
        Tracing.__init__(self)

    # -- who drives ------------------------------------------------------------------------------

    def _claim(self, claim: Tuple[Optional[int], str, str]) -> None:
        me, what, _ = claim
        run = self._run
        unit = run.task_running_on(me) if run is not None and me is not None else None
        if unit is not None:
            where = "while its thread starts (worker_init)" if len(unit) < 2 else (
                f"from inside task {unit[0].name!r} (iteration {unit[1].iter_idx})")
            raise RuntimeError(f"{what}() called {where}: a task must not drive the pipeline that runs it "
                               f"(it would wait for itself); drive it from the thread that called fill_pipeline()")
        with self._claim_lock:
            holder = self._driver
            if holder is None:
                self._driver = claim
                return
        if holder[0] == me:
            raise RuntimeError(f"{what}() called while this thread is already inside {holder[1]}() (from the data "
                               f"iterator, or from a task running on the caller's thread); a pipeline cannot be "
                               f"driven from within its own driving call")
        raise RuntimeError(f"{what}() called from thread {claim[2]!r} while thread {holder[2]!r} is in {holder[1]}(); "
                           f"a pipeline is driven by one thread at a time (fill_pipeline, progress, advance, drain, "
                           f"abandon, run): call it from that thread, or after its call returns")

    # -- the run's life cycle ------------------------------------------------------------------

    def _new_policy(self, run: Run) -> Policy:
        raise NotImplementedError

    def _start_run(self, data_iter: Iterator[Any]) -> None:
        self._check_stragglers()
        run = Run(bind_run(self._tasks, self.device, self._event_slots), self.device, self._event_slots,
                  progress_timeout=self.progress_timeout, join_timeout=self.join_timeout)
        self._run = self._slot.run = run
        shutdown.track(run)
        try:
            labels = {t.index: self._shortcuts.label(t.name) for t in self._tasks}
            launch = make_launch(self.device, labels, self._nvtx)
            recorder = self._new_recorder(run.tasks)
            wait = recorder.timed_wait(run.board.wait_task) if recorder is not None else None
            policy = self._new_policy(run)
            run_unit = make_unit_runner(run.board, self.device, launch, self._event_slots, self.signal_timeout,
                                        policy.after_complete, wait)
            if recorder is not None:
                run_unit = traced(run_unit, recorder)
            run.policy = policy
            torch_threads, device, worker_init = torch.get_num_threads(), self.device, self.worker_init

            def enter(group: str) -> Callable[[], None]:  # must not hold the pipeline (see shutdown.py)
                return functools.partial(_enter_worker_thread, torch_threads, device, worker_init, group)

            run.start_workers(self._groups, run_unit, enter, self._caller_group)
            policy.fill(data_iter)
        except BaseException as exc:
            self._fail(run, exc)

    def _check_stragglers(self) -> None:
        self._stragglers = [w for w in self._stragglers if w.alive]
        for worker in self._stragglers:
            unit = worker.current
            if unit is not None:
                task, ctx = unit[0], unit[1]
                raise RuntimeError(
                    f"fill_pipeline(): thread {worker.thread.name!r} of an earlier run is still running task "
                    f"{task.name!r} (iteration {ctx.iter_idx}) on stream {task.stream_label!r}, which this run "
                    f"needs; wait until that task returns (it did not within join_timeout={self.join_timeout:g} s), "
                    f"then call fill_pipeline() again"
                )

    def _end(self, run: Run, state: str) -> None:
        """Stop ``run`` (idempotent), remembering any straggler."""
        try:
            stragglers = run.stop(state)
        finally:
            self._peak_live_contexts = run.peak_live_contexts
        for worker in stragglers:
            if worker not in self._stragglers:
                self._stragglers.append(worker)
                unit = worker.current
                doing = f"task {unit[0].name!r} (iteration {unit[1].iter_idx})" if unit and len(unit) > 1 else "start-up"
                logger.warning("worker thread %r did not stop within %.1f s (still in %s); a later fill_pipeline() "
                               "waits for it", worker.thread.name, self.join_timeout, doing)

    def _fail(self, run: Run, exc: BaseException) -> NoReturn:
        """End the run as failed (its threads joined) and raise ``exc`` in the caller."""
        run.record_failure(exc)
        self._end(run, FAILED)
        try:
            raise exc
        finally:
            run.forget_error()

    def _discard_run(self) -> None:
        """Forget the (stopped) run: the pipeline is idle again."""
        self._run = self._slot.run = None

    def _active_run(self) -> Optional[Run]:
        run = self._run
        return run if run is not None and run.active else None

    # -- public API ----------------------------------------------------------------------------

    @_driving
    def fill_pipeline(self, data_iter: Iterable[Any]) -> Iterator[Any]:
        """Start the workers and submit the first iterations; returns the iterator to pass to progress().

        Args:
            data_iter: any iterable of batches.

        Raises:
            RuntimeError: the pipeline is already filled (call drain() first), or a thread of an
                earlier run is still inside a task.
            TypeError: ``data_iter`` is not iterable.
        """
        return self._fill(data_iter)

    def _fill(self, data_iter: Iterable[Any]) -> Iterator[Any]:
        if self._active_run() is not None:
            raise RuntimeError("fill_pipeline() called while iterations are still in flight; call drain() first "
                               "(or keep calling progress() until StopIteration)")
        try:
            it = iter(data_iter)
        except TypeError:
            raise TypeError(f"fill_pipeline: data_iter must be iterable, got {type(data_iter).__name__}") from None
        self._start_run(it)
        return it

    @_driving
    def progress(self, data_iter: Optional[Iterator[Any]] = None, *, advance: bool = True) -> int:
        """Retire the oldest in-flight iteration and advance; returns its iter_idx.

        Args:
            data_iter: where the next batch comes from; ``None`` retires without fetching.
            advance: False retires only: nothing new starts until ``advance()`` is called,
                so the caller may touch the model in between (TorchRec's step boundary).

        Raises:
            StopIteration: no iteration is left in flight (the worker threads are then joined).
            RuntimeError: progress() before fill_pipeline(), after a failure, or with data after
                progress(None) retired the last iteration in flight.
            ProgressTimeoutError: the oldest iteration did not complete in ``progress_timeout``.
            Exception: whatever a task or the data iterator raised, annotated with the task and
                iteration. Any exception ends the run: the iterations in flight are abandoned.
        """
        return self._progress(data_iter, advance)

    def _progress(self, data_iter: Optional[Iterator[Any]], advance: bool = True) -> int:
        run = self._running(data_iter)
        if run.deferred is not None:
            raise RuntimeError("progress() while the last progress(advance=False) has not been followed by "
                               "advance(); call advance() first")
        if run.next_retire >= run.num_created:  # nothing in flight
            run.emptied = not run.exhausted
            self._end(run, FINISHED)
            raise StopIteration
        try:
            if run.inline is not None:
                run.inline.run_queued()
            oldest = run.retire_oldest()
            if advance:
                run.policy.after_retire(oldest, data_iter)
            else:
                run.deferred = (oldest, data_iter)
            return oldest
        except BaseException as exc:
            self._fail(run, exc)

    def _running(self, data_iter: Optional[Iterator[Any]]) -> Run:
        run = self._run
        if run is None:
            raise RuntimeError("progress() called before fill_pipeline(); call fill_pipeline(data) first")
        if run.active:
            return run
        if run.state == FINISHED:
            if run.emptied and data_iter is not None:
                raise RuntimeError("progress(data) after progress(None) retired the last iteration in flight: that "
                                   "ended the run (StopIteration) and nothing was fetched from the data since; call "
                                   "fill_pipeline(data) to start again (no batch was taken from it)")
            raise StopIteration
        raise RuntimeError("progress() after the pipeline failed (the error was raised earlier); "
                           "call drain() and fill_pipeline() to start again")

    @_driving
    def advance(self, fetch: bool = True) -> None:
        """Start what the last ``progress(advance=False)`` held back (its batch too, unless ``fetch`` is False)."""
        self._advance(fetch)

    def _advance(self, fetch: bool) -> None:
        run = self._active_run()
        if run is None or run.deferred is None:
            return
        (oldest, data_iter), run.deferred = run.deferred, None
        try:
            run.policy.after_retire(oldest, data_iter if fetch else None)
        except BaseException as exc:
            self._fail(run, exc)

    @_driving
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

    @_driving
    def drain(self) -> None:
        """Retire every in-flight iteration, stop and join the workers, and reset for a new fill.

        Shortcut settings and caches are kept. After a failure it only cleans up.
        """
        self._drain()

    def _drain(self) -> None:
        run = self._run
        if run is None:
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
        if run.state == FINISHED:
            self.device.synchronize()

    @_driving
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
        was_tracing = self._begin_traced_run(record or verbose)
        bar = ProgressLine(type(self).__name__, len_or_none(data_iter)) if verbose else None
        self._nvtx = resolve_emit_nvtx(emit_nvtx)
        start = time.perf_counter()
        try:
            with self._nvtx_context():
                it = self._fill(data_iter)
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
            self._end_traced_run(was_tracing)
            if bar is not None:
                bar.close()
        self._publish_trace(trace_path, verbose)
        return elapsed

    def _nvtx_context(self) -> Any:
        from .annotations import emit_nvtx_context

        return emit_nvtx_context() if self._nvtx else contextlib.nullcontext()

    @_driving
    def run_one_serial_iter(self, batch: Any, iter_idx: int = 0) -> IterContext:
        """Run one iteration serially on the calling thread, tasks in topological order.

        Needs no fill_pipeline() and leaves no state behind. Returns the IterContext.
        """
        if self._active_run() is not None:
            raise RuntimeError("run_one_serial_iter() while pipelined iterations are in flight; call drain() first")
        return self._serial_iter(batch, iter_idx)

    def _serial_iter(self, batch: Any, iter_idx: int) -> IterContext:
        ctx = IterContext(batch, iter_idx)
        annotate_ranges = self._nvtx or profiler_active()
        for task in self._serial_order:
            try:
                if annotate_ranges:
                    run_annotated(f"SWP_serial/{self._shortcuts.label(task.name)}/iter{iter_idx}", task.exec_fn,
                                  ctx, self._nvtx)
                else:
                    task.exec_fn(ctx)
            except StopIteration as exc:
                raise annotate(stop_iteration_error(exc, task.name, iter_idx), task.name, iter_idx) from exc
            except BaseException as exc:
                raise annotate(exc, task.name, iter_idx)
        return ctx

    @_driving
    def run_serial(self, data_iter: Iterable[Any], verbose: bool = False, emit_nvtx: bool = False) -> float:
        """Run every batch serially (no threads, default stream) as a baseline; returns seconds."""
        if self._active_run() is not None:
            raise RuntimeError("run_serial() while pipelined iterations are in flight; call drain() first")
        self._nvtx = resolve_emit_nvtx(emit_nvtx)
        bar = ProgressLine(f"{type(self).__name__} (serial)", len_or_none(data_iter)) if verbose else None
        start = time.perf_counter()
        try:
            for idx, batch in enumerate(data_iter):
                self._serial_iter(batch, idx)
                if bar is not None:
                    bar.step()
            self.device.synchronize()
        finally:
            self._nvtx = False
            if bar is not None:
                bar.close()
        return time.perf_counter() - start

    # -- shortcuts -------------------------------------------------------------------------------

    def enable_shortcut(self, *names: str) -> None:
        """Shortcut these tasks: the next execution caches what each leaves on the context, later ones replay it.

        Settings and caches survive drain(); globally ordered tasks keep their turn.

        Raises:
            ValueError: an unknown task name.
            RuntimeError: iterations are in flight (call drain() first).
        """
        self._require_idle("enable_shortcut")
        self._shortcuts.enable(names)
        self._refresh_executors()

    def disable_shortcut(self, *names: str) -> None:
        """Run these tasks normally again and drop their caches."""
        self._require_idle("disable_shortcut")
        self._shortcuts.disable(names)
        self._refresh_executors()

    @property
    def shortcuts(self) -> List[str]:
        """The names of the shortcut tasks, sorted."""
        return sorted(self._shortcuts.enabled)

    def without_shortcuts(self) -> ContextManager[None]:
        """Within the block no task is shortcut and no cache exists; afterwards both are as before."""
        self._require_idle("without_shortcuts")
        return _Scoped(self._suspend_shortcuts, self._resume_shortcuts)

    def _suspend_shortcuts(self) -> Tuple[Set[str], Dict[str, Any]]:
        table = self._shortcuts
        saved = (set(table.enabled), dict(table.caches))
        table.enabled, table.caches = set(), {}
        self._refresh_executors()
        return saved

    def _resume_shortcuts(self, saved: Tuple[Set[str], Dict[str, Any]]) -> None:
        self._shortcuts.enabled, self._shortcuts.caches = saved
        self._refresh_executors()

    @property
    def serial_order(self) -> List[str]:
        """The tasks in the order a serial iteration runs them (topological; ties by stage, then name)."""
        return [t.name for t in self._serial_order]

    def _serial_names(self) -> List[str]:
        return self.serial_order

    def _refresh_executors(self) -> None:
        for task in self._tasks:
            task.exec_fn = self._shortcuts.executor(task.task)

    def _require_idle(self, what: str) -> None:
        if self._active_run() is not None:
            raise RuntimeError(f"{what}() while iterations are in flight; call drain() first")

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

    def __enter__(self) -> "_PipelineBase":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.drain()
        else:
            self.abandon()  # an exception (Ctrl-C too) abandons what is in flight instead of running it
