"""PlannedTrainPipeline: a PipelinePlan behind TorchRec's ``progress(dataloader_iter)``.

One class runs every variant; what differs between variants is the plan and its
task functions (``plans.py``, ``tasks.py``), never this code. Each call::

    progress(it)   first call: fill_pipeline (periods 0 .. depth-1)
                   later calls: advance() (period k + depth - 1, drawing one batch)
                   wait for iteration k, retire it, return its ``ctx.output``
                   no iteration left: StopIteration

A pipeline is reused across epochs as TorchRec's SparseDist family is: a call with a
new iterator draws from it from then on, keeping the batches the pipeline holds
(after the end of the data it refills); batches are numbered from construction or
``reset()`` on, across iterators, as TorchRec numbers its contexts (SemiSync's
``start_batch`` counts them).

With ``lockstep=True`` (the default, TorchRec's behaviour) nothing of the next
step starts before the next call, so code between calls (an LR scheduler,
metrics, a checkpoint, detach()/attach()) sees the model exactly as TorchRec
would leave it; only tasks on other thread groups than ``default`` (batch
preparation) may still be running. The ``default`` group's tasks then run on the
calling thread itself (the engine's ``caller_thread_group``), like TorchRec's step.
``lockstep=False`` enqueues the next step before returning, so it overlaps whatever
the caller does between calls; the caller must then not touch the model, the
optimizer or the process group.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, List, Optional

import torch

from ..plan.context import IterContext
from ..plan.model import PipelinePlan
from .feed import BatchFeed, RankAgreement
from ..engine.clocked import SWPipeline
from .model_state import ModelRuntime
from .tasks import batch_of

__all__: List[str] = []

logger = logging.getLogger("swpipeline.torchrec")


def _output_of(ctx: IterContext) -> Any:
    return ctx.output


class PlannedTrainPipeline:
    """A TorchRec-compatible train pipeline that runs a PipelinePlan on the clock-driven engine.

    Args:
        plan: the variant's plan (tasks already bound to ``runtime``).
        runtime: the model-side state the tasks share (None for plans without a model, e.g. Staged).
        device: the engine's device (``torch.device("cpu")``, ``torch.device("cuda", rank)``).
        execute_all_batches: False stops as soon as a step's new batch is missing,
            without running the batches in flight (TorchRec's option); as in TorchRec they
            stay, and run first when progress() is called with a new iterator (``reset()``
            drops them).
        lockstep: True (default, as TorchRec): nothing of the next step starts before the
            next call, so code between calls sees the model as TorchRec would leave it;
            False: the next step is enqueued before returning and overlaps the caller's
            code, which must then not touch the model, optimizer or process group.
        stop_together: agree with the other ranks on the end of the data (uneven data),
            on ``stop_together_group`` or a new gloo group.
        caller_thread: with ``lockstep``, run the ``default`` thread group's tasks on the
            thread that calls progress(), as TorchRec does (no thread hand-offs); other
            thread groups keep their worker threads.
        output_of: what progress() returns for a retired iteration (default ``ctx.output``).
        signal_timeout, progress_timeout: the engine's timeouts (seconds).
    """

    def __init__(self, plan: PipelinePlan, runtime: Optional[ModelRuntime], device: torch.device, *,
                 execute_all_batches: bool = True, lockstep: bool = True, stop_together: bool = False,
                 stop_together_group: Optional[Any] = None, caller_thread: bool = True,
                 output_of: Callable[[IterContext], Any] = _output_of, signal_timeout: float = 30.0,
                 progress_timeout: float = 600.0) -> None:
        self.plan = plan
        self.runtime = runtime
        self.execute_all_batches = execute_all_batches
        self.lockstep = lockstep
        self._output_of = output_of
        self._agreement = RankAgreement(stop_together_group) if stop_together else None
        self.engine = SWPipeline(plan, device=device, signal_timeout=signal_timeout,
                                 progress_timeout=progress_timeout,
                                 caller_thread_group="default" if lockstep and caller_thread else None)
        if lockstep and not caller_thread:
            self._check_lockstep_on_a_worker()
        self._feed: Optional[BatchFeed] = None
        self._running = False
        self._failed = False
        self._stop_next = False
        self.steps = 0  # outputs returned so far

    # -- TorchRec's API ------------------------------------------------------------------------

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        """Run one training step; returns the model output of the oldest batch in flight.

        Raises:
            StopIteration: no batch is left (or, with ``execute_all_batches=False``, this
                step's new batch is missing: the batches in flight then wait for the next
                iterator, see ``_step``).
            RuntimeError: an earlier step failed (call reset()).
        """
        ctx = self._step(dataloader_iter)
        self.steps += 1
        return self._output_of(ctx)

    def _step(self, dataloader_iter: Iterator[Any]) -> IterContext:
        """One step: start or advance the engine, retire the oldest iteration and return its context.

        With ``execute_all_batches=False`` a step whose new batch is missing raises
        StopIteration without running anything and without dropping anything: the
        batches in flight (and any batch drawn ahead) stay, and the next call, with a
        new iterator, carries on with them, as TorchRec's pipelines do; ``reset()``
        drops them.
        """
        if self._failed:
            raise RuntimeError("progress() after a failed step (its exception was raised then); "
                               "call reset() to start again")
        if self.runtime is not None and not self.runtime.attached:
            self.attach()
        try:
            if not self._running:
                self._start(dataloader_iter)
            else:
                self._use(dataloader_iter)
                if self.lockstep or self._stop_next:
                    self._advance()
            if self._stop_next:
                raise StopIteration
            self.engine.progress(self._feed, advance=False)
            ctx = self.engine.last_context
            if ctx is None:  # cannot happen: progress() just retired an iteration
                raise RuntimeError("the engine retired an iteration but kept no context")
            if not self.lockstep:
                self._advance()
        except StopIteration:
            if not self._stop_next:  # the data ended: the engine's run is over
                self._running = False
            raise
        except BaseException:
            self._failed, self._running = True, False
            raise
        return ctx

    def _check_lockstep_on_a_worker(self) -> None:
        """On a worker thread, lockstep is exact only if each period's last default task retires the step."""
        default = [n for n in self.engine.enqueue_order if self.plan.schedules[n].thread_group == "default"]
        if default and self.plan.stage(default[-1]) != self.engine.depth - 1:
            raise ValueError(
                f"caller_thread=False: the default thread group's last task of a period, {default[-1]!r}, works on "
                f"a newer batch than the step being retired, so it would still run on the worker after "
                f"progress() returns; use caller_thread=True (the default) or lockstep=False")

    def _start(self, dataloader_iter: Iterator[Any]) -> None:
        feed = self._use(dataloader_iter)
        if feed.exhausted:
            raise StopIteration  # as TorchRec: never call next() on an iterator known to be exhausted
        self._stop_next = not self.execute_all_batches and not feed.has(self.engine.depth)
        if not self._stop_next:
            if self.runtime is not None:  # TorchRec numbers the batches from construction (or reset()) on
                self.runtime.index_base = feed.drawn
            self.engine.fill_pipeline(feed)
            self._running = True

    def _use(self, dataloader_iter: Iterator[Any]) -> BatchFeed:
        """The feed, drawing from ``dataloader_iter`` from now on.

        TorchRec reads later batches from whatever iterator the latest call passed, and
        keeps the batches it holds: those in flight and, here, any drawn ahead.
        """
        feed = self._feed
        if feed is None:
            feed = self._feed = BatchFeed(dataloader_iter, self._agreement)
        elif feed.source is not dataloader_iter:
            feed.source, feed.exhausted = dataloader_iter, False
        return feed

    def _advance(self) -> None:
        """Enqueue the next step's period, unless its batch is missing and in-flight batches are to wait."""
        feed = self._feed
        self._stop_next = not self.execute_all_batches and feed is not None and not feed.has(1)
        if not self._stop_next:
            self.engine.advance()

    def _abandon(self) -> None:
        self.engine.abandon()
        self._running, self._stop_next = False, False

    def reset(self) -> None:
        """Drop everything in flight (without running it) and forget the iterator."""
        self._abandon()
        self._feed, self._failed = None, False

    def detach(self) -> torch.nn.Module:
        """Give the model its original forwards back (e.g. to evaluate it between steps); returns it.

        In-flight batches are kept: the next progress() re-attaches and carries on.
        """
        if self.runtime is None:
            raise RuntimeError("detach(): this pipeline has no model")
        if self._running and not self.lockstep:
            raise RuntimeError("detach() while the next step runs (lockstep=False); use lockstep=True to "
                               "detach between steps, or reset() first")
        return self.runtime.detach()

    def attach(self, model: Optional[torch.nn.Module] = None, sparse_dist: bool = True) -> None:
        """Pipeline the model again (or a new one) after detach()."""
        if self.runtime is None:
            raise RuntimeError("attach(): this pipeline has no model")
        oldest = self._oldest_in_flight()
        self.runtime.attach(model, oldest.context if oldest is not None else None,
                            batch_of(oldest) if oldest is not None and sparse_dist else None)

    def _oldest_in_flight(self) -> Optional[IterContext]:
        if not self._running:
            return None
        for ctx in self.engine.contexts_in_flight():
            if hasattr(ctx, "context"):
                return ctx
        return None

    # -- inspection ---------------------------------------------------------------------------

    def format_schedule(self, num_periods: int) -> str:
        return self.engine.format_schedule(num_periods)

    def print_schedule(self, num_periods: int) -> None:
        self.engine.print_schedule(num_periods)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lockstep={self.lockstep}, steps={self.steps})\n{self.engine!r}"
