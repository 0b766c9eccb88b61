"""_PipelineBase: the life cycle both engines share, driving one ``Run`` per fill.

An engine passes its release rule in (``release.py``: when a unit is handed to its
worker). What a pipeline is made of, and the public methods of its parts (the serial
baseline, shortcut settings, tracing), are ``parts._PipelineParts``'s; a run is made by
``assemble.py`` and lives in ``run.py`` and its parts. What is left here is the life
cycle: fill, progress, advance, drain, abandon, run, each a driving call (``driving.py``:
one thread at a time, never a task of its own), and the runs nobody stopped
(``shutdown.py``).

Any exception that leaves a driving call while iterations are in flight ends the
run: its iterations are abandoned (not drained) and its workers joined before the
exception reaches the caller. (Misuse refused at once, before anything is touched, is
the exception: a second thread, ``progress()`` before ``advance()``, a data argument
that is not an iterator.) The failure is raised without a reference cycle (``_fail``),
so what the caller's frames hold is freed when the caller drops the exception.

The step boundary. ``progress(it, advance=False)`` retires iteration k, then waits until
every unit already handed out that can run without more being handed out has returned
(``Run.wait_for_boundary``), and returns; nothing is handed out until ``advance()``. So in
between no task runs: a unit not waited for waits, directly or through others, for a
unit not handed out (the boundary is the fixpoint of "its dependencies, its thread
group's earlier units and its turns are done or will be"), and only ``advance()`` hands
out more. What has run is fixed by the plan and the iterations fetched, never by timing:
on ``SWPipeline`` the units of the periods released so far; on ``DataFlowPipeline`` also
the units of later iterations it ran ahead on (``dataflow.py``).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterable, Iterator, List, NoReturn, Optional

from . import shutdown
from ..devices.annotations import resolve_emit_nvtx
from ..observe.progress_line import ProgressLine, len_or_none
from ..observe.timeline import parse_trace
from ..plan.context import IterContext
from .assemble import assemble_run
from .driving import driving
from .modes import Modes
from .parts import _PipelineParts
from .run import Run
from .run_state import ABANDONED, FAILED, FINISHED, HELD, RUNNING, RunState

__all__: List[str] = []


class _PipelineBase(_PipelineParts):
    """The life cycle both engines share (see the module docstring); what a pipeline is made of, and the public
    methods of its parts, are ``parts._PipelineParts``'s."""

    # -- the run's life cycle ------------------------------------------------------------------

    def _start_run(self, data_iter: Iterator[Any], caller_group: Optional[str]) -> None:
        self._stragglers.check(self.join_timeout)
        labels = {t.index: self._shortcut.label(t.name) for t in self._tasks}
        run = assemble_run(self._run_settings, data_iter, caller_group, labels, self._nvtx,
                           self._tracing.new_recorder)
        self._run = run
        shutdown.track(run)
        try:
            run.start(self, Modes.capture(self._mode_types))
        except BaseException as exc:
            self._fail(run, exc)

    def _end(self, run: Run, state: RunState) -> None:
        """Stop ``run`` (idempotent), remembering any straggler."""
        try:
            stragglers = run.stop(state)
        finally:
            self._peak_live_contexts = run.feed.peak_live_contexts
        self._stragglers.adopt(stragglers, run.join_timeout)

    def _fail(self, run: Run, exc: BaseException) -> NoReturn:
        """End the run as failed (its threads joined) and raise ``exc`` in the caller.

        This frame is on the raised exception's traceback: it must not keep the exception as a
        local, or the two would form a reference cycle holding every frame of the traceback (the
        caller's locals among them) until a garbage collection.
        """
        run.life.record_failure(exc)
        try:
            self._end(run, FAILED)
            raise exc
        finally:
            del exc

    def _discard_run(self) -> None:
        """Forget the (stopped) run: the pipeline is idle again."""
        self._run = None

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
        feed = run.feed
        if run.life.state is HELD:  # refused before anything is touched (a data_iter that is no iterator: TypeError)
            feed.check(data_iter)
            raise RuntimeError("progress() while the last progress(advance=False) has not been followed by "
                               "advance(); call advance() first")
        if data_iter is not feed.source and data_iter is not None:
            feed.use(data_iter)
        draws = data_iter is not None
        if feed.next_retire >= feed.num_created:  # nothing in flight
            self._resume_or_finish(run, draws)
        try:
            run.handout.run_caller_units(advance)
            oldest = run.retire_oldest()
            if advance:
                run.handout.after_retire(oldest, draws, Modes.capture(self._mode_types))
            else:
                run.life.hold(oldest, draws)
                run.wait_for_boundary()
            return oldest
        except BaseException as exc:
            self._fail(run, exc)

    def _resume_or_finish(self, run: Run, draws: bool) -> None:
        """Nothing is in flight: fill again from the data if ``progress(None)`` emptied the pipeline before the
        data ended and this step ``draws``; else end the run (StopIteration)."""
        if draws and not run.feed.exhausted:
            try:
                run.handout.resume(Modes.capture(self._mode_types))
            except BaseException as exc:
                self._fail(run, exc)
            if run.feed.in_flight:
                return
        self._end(run, FINISHED)
        raise StopIteration

    def _running(self, data_iter: Optional[Iterator[Any]]) -> Run:
        run = self._run
        if run is None:
            raise RuntimeError("progress() called before fill_pipeline(); call fill_pipeline(data) first")
        state = run.life.state
        if state is RUNNING or state is HELD:
            return run
        if state is FINISHED:
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
        held = run.life.unhold() if run is not None else None
        if run is None or held is None:
            return
        oldest, draws = held
        try:
            run.handout.after_retire(oldest, draws and fetch, Modes.capture(self._mode_types))
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
        contexts = run.feed.contexts.copy()
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

    def __enter__(self) -> "_PipelineBase":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.drain()
        else:
            self.abandon()  # an exception (Ctrl-C too) abandons what is in flight instead of running it
