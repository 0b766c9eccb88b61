"""_PipelineBase: everything both engines share; no scheduling policy.

Subclasses decide *when* a task of an iteration is handed to its worker
(``_do_fill``, ``_do_retire``, ``_after_task_complete``); this class owns the
rest: worker threads, contexts, CPU signals, device events, the submission
sequencer, error handling and the serial baseline.

Life cycle (``_state``)::

    idle --fill_pipeline()--> running --progress() raises StopIteration--> finished
      ^                          |  \\--a task/iterator fails--> failed
      |                          |                                |
      +------- drain() ----------+--------------------------------+

Every path out of ``running`` stops and joins the worker threads.

A work unit runs the two-phase protocol for each dependency, then the task::

    for dep in deps:                    # intra: iteration i; inter: iteration i-1
        board.wait_task(dep, it)        # phase 1: CPU signal (returns at once if done)
        device.wait(stream, event)      # phase 2: only if dep ran on another stream
    device.launch(stream, fn, ctx)      # fn(ctx) with the task's stream current
    device.record(event, stream)        # only if a consumer is on another stream
    board.complete(task, i)             # sets the CPU signal

A traced fill hands the workers ``_run_unit_recorded`` instead, which times the
phase-1 waits, runs ``_run_unit`` and records the unit (see ``timeline.py``); an
untraced one runs exactly the code above.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from functools import partial
from typing import Any, Callable, Dict, Iterable, Iterator, List, NoReturn, Optional, Tuple

import torch

from . import ordering
from .annotations import emit_nvtx_context, profiler_active, resolve_emit_nvtx, run_annotated
from .device import DeviceSpec, resolve_device
from .errors import PipelineAborted, ProgressTimeoutError, annotate
from .plan import IterContext, PipelinePlan
from .progress_line import ProgressLine, len_or_none
from .runtime import TaskRuntime, build_tasks
from .shortcut import ShortcutTable
from .signals import CompletionBoard, SubmissionSequencer
from .stats import RunStats
from .timeline import Recorder, Timeline, TraceSpec, parse_trace
from .worker import InlineWorker, Worker, WorkerLike

__all__: List[str] = []

_JOIN_TIMEOUT_S = 10.0


class _PipelineBase:
    """Shared infrastructure of the pipeline engines (see the module docstring)."""

    def __init__(self, plan: PipelinePlan, num_slots: int, device: DeviceSpec = None, *,
                 signal_timeout: float = 30.0, progress_timeout: float = 60.0,
                 worker_init: Optional[Callable[[str], None]] = None) -> None:
        if not isinstance(plan, PipelinePlan):
            raise TypeError(f"plan must be a PipelinePlan, got {type(plan).__name__}")
        for arg, value in (("signal_timeout", signal_timeout), ("progress_timeout", progress_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{arg} must be a positive number of seconds, got {value!r}")
        if worker_init is not None and not callable(worker_init):
            raise TypeError(f"worker_init must be a callable taking the thread group name, got {worker_init!r}")
        self.plan = plan
        self.worker_init = worker_init
        self.device = resolve_device(device)
        self.signal_timeout = float(signal_timeout)
        self.progress_timeout = float(progress_timeout)
        self._num_slots = num_slots
        self._event_slots = num_slots + 1  # see build_tasks: inter consumers may lag one iteration
        self._tasks = build_tasks(plan, self.device, self._event_slots)
        self._by_name = {t.name: t for t in self._tasks}
        self._serial_order = [self._by_name[n] for n in ordering.serial_order(plan)]
        self._groups = list(dict.fromkeys(t.group for t in self._tasks))
        self._board = CompletionBoard([t.name for t in self._tasks])
        self._sequencer = SubmissionSequencer()
        self._shortcuts = ShortcutTable(plan.tasks)
        self._workers: Dict[str, WorkerLike] = {}
        self._caller_group: Optional[str] = None  # a thread group run by the caller of progress()
        self._inline_worker: Optional[InlineWorker] = None
        self._error_lock = threading.Lock()
        self._nvtx = False
        self._tracing = False  # record a timeline at the next fill (run(trace=...), tracing())
        self._recorder: Optional[Recorder] = None  # the last fill's, if it was traced
        self.peak_live_contexts = 0
        self._reset_state()

    # -- construction ----------------------------------------------------------------------

    def _reset_state(self) -> None:
        self._board.reset()
        self._sequencer.reset()
        self._contexts: Dict[int, IterContext] = {}
        self._state = "idle"
        self._error: Optional[BaseException] = None
        self._next_retire = 0
        self._num_created = 0
        self._exhausted = False
        self._last_ctx: Optional[IterContext] = None
        self._deferred: Optional[Tuple[int, Optional[Iterator[Any]]]] = None  # see progress(advance=False)

    # -- public API ----------------------------------------------------------------------------

    def fill_pipeline(self, data_iter: Iterable[Any]) -> Iterator[Any]:
        """Start the workers and submit the first iterations; returns the iterator to pass to progress().

        Args:
            data_iter: any iterable of batches.

        Raises:
            RuntimeError: the pipeline is already filled (call drain() first).
            TypeError: ``data_iter`` is not iterable.
        """
        if self._state == "running":
            raise RuntimeError(
                "fill_pipeline() called while iterations are still in flight; call drain() first "
                "(or keep calling progress() until StopIteration)"
            )
        try:
            it = iter(data_iter)
        except TypeError:
            raise TypeError(f"fill_pipeline: data_iter must be iterable, got {type(data_iter).__name__}") from None
        self._reset_state()
        self.peak_live_contexts = 0  # most IterContexts alive at once during this fill (kept after drain)
        self._start_workers()
        self._state = "running"
        self._do_fill(it)
        return it

    def progress(self, data_iter: Optional[Iterator[Any]] = None, *, advance: bool = True) -> int:
        """Retire the oldest in-flight iteration and advance; returns its iter_idx.

        Args:
            data_iter: where the next batch comes from; ``None`` retires without fetching.
            advance: False retires only: nothing new starts until ``advance()`` is called,
                so the caller may touch the model in between (TorchRec's step boundary).

        Raises:
            StopIteration: no iteration is left in flight (the worker threads are then joined).
            RuntimeError: progress() before fill_pipeline(), or after a failure.
            ProgressTimeoutError: the oldest iteration did not complete in ``progress_timeout``.
            Exception: whatever a task or the data iterator raised, annotated with the task and iteration.
        """
        if self._state != "running":
            self._raise_not_running()
        if self._deferred is not None:
            raise RuntimeError("progress() while the last progress(advance=False) has not been followed by "
                               "advance(); call advance() first")
        oldest = self._next_retire
        if oldest >= self._num_created:
            self._stop_workers()
            self._state = "finished"
            raise StopIteration
        if self._inline_worker is not None:
            self._inline_worker.run_queued()
        self._wait_retire(oldest)
        if advance:
            self._do_retire(oldest, data_iter)
        else:
            self._deferred = (oldest, data_iter)
        return oldest

    def advance(self, fetch: bool = True) -> None:
        """Start what the last ``progress(advance=False)`` held back (its batch too, unless ``fetch`` is False)."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None and self._state == "running":
            oldest, data_iter = deferred
            self._do_retire(oldest, data_iter if fetch else None)

    def abandon(self) -> None:
        """Stop now without running the iterations in flight (their batches are dropped); ready for a new fill."""
        self._wake_all_waiters()
        self._stop_workers()
        self.device.synchronize()
        self._reset_state()

    def contexts_in_flight(self) -> List[IterContext]:
        """The IterContexts of the iterations in flight, oldest first."""
        return [self._contexts[i] for i in sorted(self._contexts)]

    def drain(self) -> None:
        """Retire every in-flight iteration, stop and join the workers, and reset for a new fill.

        Shortcut settings and caches are kept. After a failure it only cleans up.
        """
        try:
            self.advance(fetch=False)
            if self._state == "running":
                while True:
                    try:
                        self.progress(None)
                    except StopIteration:
                        break
        finally:
            self._stop_workers()
            if self._state != "failed":
                self.device.synchronize()
            self._reset_state()

    def run(self, data_iter: Iterable[Any], verbose: bool = False, emit_nvtx: bool = False,
            trace: TraceSpec = None) -> float:
        """Run every batch of ``data_iter`` through the pipeline; returns wall-clock seconds.

        Args:
            data_iter: any iterable of batches.
            verbose: show a progress line on stderr, record the timeline and print ``stats()`` at the end.
            emit_nvtx: emit NVTX ranges ``SWP/{Task}/iter{N}`` (CUDA only; ignored elsewhere).
            trace: ``True`` records the run's timeline (``pipe.timeline``, ``pipe.stats()``); a path
                also writes it there as Chrome/Perfetto trace JSON. Off (``None``) costs nothing.
        """
        record, trace_path = parse_trace(trace)
        self._nvtx = resolve_emit_nvtx(emit_nvtx)
        was_tracing, self._tracing = self._tracing, self._tracing or record or verbose
        bar = ProgressLine(type(self).__name__, len_or_none(data_iter)) if verbose else None
        nvtx_ctx = emit_nvtx_context() if self._nvtx else contextlib.nullcontext()
        start = time.perf_counter()
        try:
            with nvtx_ctx:
                it = self.fill_pipeline(data_iter)
                while True:
                    try:
                        self.progress(it)
                    except StopIteration:
                        break
                    if bar is not None:
                        bar.step()
                self.drain()
            elapsed = time.perf_counter() - start
        finally:
            self._nvtx = False
            self._tracing = was_tracing
            if self._state != "idle":
                self.drain()
            if self._recorder is not None:
                self._recorder.close()
            if bar is not None:
                bar.close()
        if self._recorder is not None and trace_path is not None:
            self._recorder.timeline().save_chrome_trace(trace_path)
        if verbose:
            print(self.stats().format(), file=sys.stderr)
        return elapsed

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """Record the timeline of every ``fill_pipeline()`` started in the block; read ``pipe.timeline`` after.

        For step-by-step loops; ``run(data, trace=True)`` is the one-call form.
        """
        was_tracing, self._tracing = self._tracing, True
        try:
            yield
        finally:
            self._tracing = was_tracing
            if self._recorder is not None:
                self._recorder.close()

    @property
    def timeline(self) -> Optional[Timeline]:
        """What the last fill ran where and when, if it was traced (see ``run(trace=...)``), else None."""
        return self._recorder.timeline() if self._recorder is not None else None

    def stats(self) -> RunStats:
        """Per-task and per-run statistics of the last traced run (``print(pipe.stats())`` shows a table).

        Raises:
            RuntimeError: the last run was not traced.
        """
        timeline = self.timeline
        if timeline is None:
            raise RuntimeError("stats(): the last run was not traced; use run(data, trace=True) (or verbose=True, "
                               "or fill_pipeline() inside `with pipe.tracing():`) to record what stats() summarizes")
        return timeline.stats()

    def run_one_serial_iter(self, batch: Any, iter_idx: int = 0) -> IterContext:
        """Run one iteration serially on the calling thread, tasks in topological order.

        Needs no fill_pipeline() and leaves no state behind. Returns the IterContext.
        """
        if self._state == "running":
            raise RuntimeError("run_one_serial_iter() while pipelined iterations are in flight; call drain() first")
        ctx = IterContext(batch, iter_idx)
        annotate_ranges = self._nvtx or profiler_active()
        for task in self._serial_order:
            try:
                if annotate_ranges:
                    run_annotated(f"SWP_serial/{self._label(task)}/iter{iter_idx}", task.exec_fn, ctx, self._nvtx)
                else:
                    task.exec_fn(ctx)
            except BaseException as exc:
                raise annotate(exc, task.name, iter_idx)
        return ctx

    def run_serial(self, data_iter: Iterable[Any], verbose: bool = False, emit_nvtx: bool = False) -> float:
        """Run every batch serially (no threads, default stream) as a baseline; returns seconds."""
        self._nvtx = resolve_emit_nvtx(emit_nvtx)
        bar = ProgressLine(f"{type(self).__name__} (serial)", len_or_none(data_iter)) if verbose else None
        start = time.perf_counter()
        try:
            for idx, batch in enumerate(data_iter):
                self.run_one_serial_iter(batch, idx)
                if bar is not None:
                    bar.step()
            self.device.synchronize()
        finally:
            self._nvtx = False
            if bar is not None:
                bar.close()
        return time.perf_counter() - start

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

    def _refresh_executors(self) -> None:
        for task in self._tasks:
            task.exec_fn = self._shortcuts.executor(task.task)

    def _require_idle(self, what: str) -> None:
        if self._state == "running":
            raise RuntimeError(f"{what}() while iterations are in flight; call drain() first")

    @property
    def last_context(self) -> Optional[IterContext]:
        """The IterContext of the iteration the last progress() call retired."""
        return self._last_ctx

    def __enter__(self) -> "_PipelineBase":
        return self

    def __exit__(self, *exc: object) -> None:
        self.drain()

    # -- hooks for the engines -----------------------------------------------------------------

    def _do_fill(self, data_iter: Iterator[Any]) -> None:
        raise NotImplementedError

    def _do_retire(self, oldest: int, data_iter: Optional[Iterator[Any]]) -> None:
        raise NotImplementedError

    def _after_task_complete(self, task: TaskRuntime, iter_idx: int) -> None:
        """Called on the worker thread right after a task's CPU signal is set."""

    # -- iterations --------------------------------------------------------------------------------

    def _fetch(self, data_iter: Optional[Iterator[Any]]) -> Optional[IterContext]:
        """Create the next iteration's context from the next batch, or None when there is none."""
        if data_iter is None or self._exhausted:
            return None
        idx = self._num_created
        try:
            batch = next(data_iter)
        except StopIteration:
            self._exhausted = True
            return None
        except BaseException as exc:
            in_flight = sorted(self._contexts)
            exc.add_note(f"swpipeline: the data iterator raised while fetching the batch for iteration {idx}; "
                         f"in-flight iterations {in_flight} were abandoned")
            self._fail(exc)
        ctx = IterContext(batch, idx)
        self._contexts[idx] = ctx
        self.peak_live_contexts = max(self.peak_live_contexts, len(self._contexts))
        self._board.open_iteration(idx, len(self._tasks))
        self._num_created = idx + 1
        return ctx

    def _wait_retire(self, oldest: int) -> None:
        board = self._board
        if self._error is not None or not board.is_iteration_done(oldest):
            if not board.wait_iteration(oldest, self.progress_timeout, self._has_failed):
                self._fail(ProgressTimeoutError(oldest, board.unfinished(oldest), self.progress_timeout,
                                                self._blocked_waits(oldest)))
            if self._error is not None:
                self._fail(self._error)
        if self.device.uses_events:
            default = self.device.default_stream()
            slot = oldest % self._event_slots
            for task in self._tasks:
                if task.waits_at_retire and task.events is not None:
                    self.device.wait(default, task.events[slot])
        board.retire(oldest)
        self._last_ctx = self._contexts.pop(oldest)
        self._next_retire = oldest + 1

    def _blocked_waits(self, iter_idx: int) -> List[str]:
        """For each unfinished task of ``iter_idx``, the dependencies it is still missing."""
        done, names = self._board.done, self._board.names
        waits = []
        for task in self._tasks:
            if done[task.index] > iter_idx:
                continue
            missing = [f"{names[d]!r} (iteration {iter_idx})" for d, _ in task.intra if done[d] <= iter_idx]
            if iter_idx > 0:
                missing += [f"{names[d]!r} (iteration {iter_idx - 1})" for d, _ in task.inter if done[d] < iter_idx]
            if missing:
                waits.append(f"{task.name!r} waits for {', '.join(missing)}")
        return waits

    def _has_failed(self) -> bool:
        return self._error is not None

    # -- workers -----------------------------------------------------------------------------------

    def _start_workers(self) -> None:
        torch_threads = torch.get_num_threads()

        def enter_thread(group: str) -> None:
            # Torch's intra-op thread count is per OS thread: give workers the caller's setting.
            torch.set_num_threads(torch_threads)
            self.device.enter_thread()
            if self.worker_init is not None:
                self.worker_init(group)

        run_unit: Callable[..., None] = self._run_unit  # an untraced run takes no recording branch anywhere
        self._recorder = self._new_recorder() if self._tracing else None
        if self._recorder is not None:
            run_unit = partial(self._run_unit_recorded, self._recorder)
        self._workers = {
            g: Worker(g, run_unit, self._on_worker_error, self._is_aborted, partial(enter_thread, g))
            for g in self._groups if g != self._caller_group
        }
        self._inline_worker = None
        if self._caller_group is not None:
            self._inline_worker = InlineWorker(self._caller_group, run_unit, self._on_worker_error,
                                               self._is_aborted)
            self._workers[self._caller_group] = self._inline_worker

    def _new_recorder(self) -> Recorder:
        device = self.device
        new_event = None
        if device.has_timing_events:
            device.synchronize()  # the recorder's reference event then marks "now" on the device
            new_event = device.new_timing_event
        return Recorder(self._tasks, [t.name for t in self._serial_order], type(self).__name__, str(device),
                        new_event, device.default_stream())

    def _stop_workers(self) -> None:
        workers, self._workers = self._workers, {}
        for w in workers.values():
            w.stop()
        for w in workers.values():
            w.join(_JOIN_TIMEOUT_S)

    def _is_aborted(self) -> bool:
        return self._board.aborted

    def _on_worker_error(self, exc: BaseException, unit: Tuple[Any, ...]) -> None:
        if isinstance(exc, PipelineAborted):
            return
        if unit:
            annotate(exc, unit[0].name, unit[1].iter_idx)
        self._record_failure(exc)

    def _fail(self, exc: BaseException) -> NoReturn:
        """Stop everything, join the workers, and raise ``exc`` in the caller."""
        self._record_failure(exc)
        self._stop_workers()
        self._state = "failed"
        raise exc

    def _record_failure(self, exc: BaseException) -> None:
        """Keep the first failure, and wake every thread waiting on the pipeline."""
        with self._error_lock:
            if self._error is None:
                self._error = exc
        self._wake_all_waiters()

    def _wake_all_waiters(self) -> None:
        """Abort the signals and the sequencer: every wait raises PipelineAborted from now on."""
        self._board.abort()
        self._sequencer.abort()

    def _raise_not_running(self) -> NoReturn:
        if self._state == "finished":
            raise StopIteration
        if self._state == "failed":
            raise RuntimeError("progress() after the pipeline failed (the error was raised earlier); "
                               "call drain() and fill_pipeline() to start again")
        raise RuntimeError("progress() called before fill_pipeline(); call fill_pipeline(data) first")

    # -- one unit of work (runs on a worker thread) -------------------------------------------

    def _run_unit(self, task: TaskRuntime, ctx: IterContext, seq: int) -> None:
        i = ctx.iter_idx
        board, device = self._board, self.device
        done = board.done
        for dep, dep_events in task.intra:
            if done[dep] <= i:
                board.wait_task(dep, i, self.signal_timeout, task.name, i)
            if dep_events is not None:
                device.wait(task.stream, dep_events[i % self._event_slots])
        if i > 0:
            for dep, dep_events in task.inter:
                if done[dep] < i:
                    board.wait_task(dep, i - 1, self.signal_timeout, task.name, i)
                if dep_events is not None:
                    device.wait(task.stream, dep_events[(i - 1) % self._event_slots])
        if seq >= 0:
            self._sequencer.execute_ordered(seq, partial(self._launch, task, ctx), self.signal_timeout,
                                            task.name, i)
        else:
            self._launch(task, ctx)
        if task.events is not None:
            device.record(task.events[i % self._event_slots], task.stream)
        board.complete(task.index, i)
        self._after_task_complete(task, i)

    def _run_unit_recorded(self, recorder: Recorder, task: TaskRuntime, ctx: IterContext, seq: int) -> None:
        """``_run_unit`` for traced runs: times the phase-1 waits itself, then runs the unit and records it."""
        i = ctx.iter_idx
        period = self._unit_period(task, ctx)  # before the unit: SWPipeline forgets it at retirement
        board, clock = self._board, time.perf_counter
        done = board.done
        ready = deps_done = clock()
        waits = []
        for dep, _ in task.intra:
            if done[dep] <= i:
                board.wait_task(dep, i, self.signal_timeout, task.name, i)
                waits.append((dep, i, deps_done, clock()))
                deps_done = waits[-1][3]
        if i > 0:
            for dep, _ in task.inter:
                if done[dep] < i:
                    board.wait_task(dep, i - 1, self.signal_timeout, task.name, i)
                    waits.append((dep, i - 1, deps_done, clock()))
                    deps_done = waits[-1][3]
        recorder.begin(task.index)
        self._run_unit(recorder.runtimes[task.index], ctx, seq)  # its phase-1 waits now return at once
        recorder.add(task.index, i, period, ready, deps_done, waits or None)

    def _unit_period(self, task: TaskRuntime, ctx: IterContext) -> Optional[int]:
        """The clock period a unit belongs to, for timelines (None: the engine has no clock)."""
        return None

    def _launch(self, task: TaskRuntime, ctx: IterContext) -> None:
        fn = task.exec_fn
        if self._nvtx or profiler_active():
            label = f"SWP/{self._label(task)}/iter{ctx.iter_idx}"
            fn = partial(run_annotated, label, fn, nvtx=self._nvtx)
        self.device.launch(task.stream, fn, ctx, task.name)

    def _label(self, task: TaskRuntime) -> str:
        return f"{task.name} [skip]" if task.name in self._shortcuts.enabled else task.name
