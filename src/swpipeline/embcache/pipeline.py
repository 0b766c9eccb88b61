"""EmbCacheTrainPipeline: training through host-resident embedding tables, a plan behind TorchRec's calling convention.

::

    pipeline = EmbCacheTrainPipeline(model, dense_optimizer, device, ids_of=ids_of)
    while True:
        try:
            output = pipeline.progress(dataloader_iter)   # one training step; the oldest batch's output
        except StopIteration:                            # the data is drained
            break

Each ``progress`` call is one period of the plan (``stages.py``): the first call
fills the pipeline (one batch per stage), every call then trains the oldest batch,
retires it and returns its model output. On every engine a batch trains only inside
the ``progress()`` call that returns its output (``steps.py``), so between calls the
model, the dense optimizer and ``full_weight()`` show exactly the state after the
returned step, and ``reset()`` drops the batches in flight untrained (the swaps and
swap plans of the next batches may still run between calls, on their threads: they
change no row value). With ``lockstep=True`` (the default, clock-driven engine) not
even those are handed out before the next call. ``steps`` counts the steps in the
model, also after a failure or a Ctrl-C: resume from batch ``steps``.

``run_serial`` runs the same tasks one batch at a time, as the baseline; both make
the same cache decisions and compute the same bits.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, ContextManager, Dict, Iterable, Iterator, List, Mapping, Optional, Union

import torch

from ..engine.clocked import SWPipeline
from ..engine.dataflow import DataFlowPipeline
from ..errors import add_note
from ..observe.timeline import Timeline
from .input_dist import ReplicatedInputDist
from .stages import build_plan, stage_labels
from .stats import EmbCacheStats, RunRecorder
from .steps import TrainGate
from .table import HostEmbeddingBag
from .tasks import CacheTasks

__all__: List[str] = []

ENGINES = ("clocked", "dataflow")


class _Feed:
    """The iterator the engine draws from: the one the latest ``progress`` call passed.

    If it raises (or a Ctrl-C lands while it runs), ``on_error`` is called first: the
    engine then stops the run, and a training task waiting at the gate must not hold it up.
    """

    def __init__(self, source: Iterator[Any], on_error: Callable[[], None]) -> None:
        self.source = source
        self.exhausted = False
        self._on_error = on_error

    def __iter__(self) -> "_Feed":
        return self

    def __next__(self) -> Any:
        try:
            return next(self.source)
        except StopIteration:
            self.exhausted = True
            raise
        except BaseException:
            self._on_error()
            raise


def _nothing() -> None:
    """Nothing."""


def _run_over(engine: "weakref.ReferenceType[Union[SWPipeline, DataFlowPipeline]]") -> bool:
    """Whether the engine's run has stopped (or the engine is gone): its in-flight list empties when it stops."""
    alive = engine()
    return alive is None or not alive.contexts_in_flight()


class EmbCacheTrainPipeline:
    """Train a model whose embedding tables are HostEmbeddingBags, with the swaps overlapping the training.

    Args:
        model: an ``nn.Module`` with one or more ``HostEmbeddingBag`` submodules;
            ``model(batch)`` returns ``(loss, output)``, and each table is called once per step.
        dense_optimizer: the optimizer of the model's parameters (the tables update
            themselves, with their own ``optimizer``), or None.
        device: where the batch, the dense model and the tables' caches live.
        ids_of: ``ids_of(batch)`` -> ``{module name: (ids, offsets)}``: for every table, the
            ids it will be called with in this batch (called on the batch as the iterator
            yields it, on the ``prep`` thread, or the ``dist`` thread with a process group).
        process_group: data-parallel training on several ranks: every rank keeps whole
            tables and all-gathers each table's ids, so that every rank makes the same cache
            decisions, and the rows' gradients are averaged across ranks before the sparse
            update; adds the InputDist stage. Give the pipeline a process group of its own
            (``torch.distributed.new_group()``).
        engine: ``"clocked"`` (SWPipeline, the default) or ``"dataflow"`` (DataFlowPipeline:
            the swaps and swap plans of later batches run ahead as far as ``max_depth`` allows).
        max_depth: the data-flow engine's bound on batches in flight (default: the plan's depth).
        lockstep: with the clocked engine, start nothing of the next step before the next call
            (TorchRec's step boundary); with False the next batches' swaps and swap plans are
            handed out as a step returns. On every engine a batch trains only inside the
            ``progress()`` call that returns it.
        check_ids: check in each forward that a table gets exactly the ids ``ids_of`` named, and valid offsets.
        signal_timeout, progress_timeout, join_timeout: the engine's timeouts, in seconds.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: no HostEmbeddingBag in the model, an unknown engine, a bad max_depth.
    """

    def __init__(self, model: torch.nn.Module, dense_optimizer: Optional[Any], device: Union[str, torch.device], *,
                 ids_of: Callable[[Any], Mapping[str, Any]], process_group: Optional[Any] = None,
                 engine: str = "clocked", max_depth: Optional[int] = None, lockstep: bool = True,
                 check_ids: bool = True, signal_timeout: float = 30.0, progress_timeout: float = 600.0,
                 join_timeout: float = 10.0) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if dense_optimizer is not None and not (callable(getattr(dense_optimizer, "step", None))
                                                and callable(getattr(dense_optimizer, "zero_grad", None))):
            raise TypeError(f"dense_optimizer must be an optimizer (with step() and zero_grad()) or None, got "
                            f"{type(dense_optimizer).__name__}")
        if not callable(ids_of):
            raise TypeError(f"ids_of must be a function of the batch, got {type(ids_of).__name__}")
        if engine not in ENGINES:
            raise ValueError(f"engine={engine!r} is unknown; use one of {list(ENGINES)}")
        self.device = torch.device(device) if isinstance(device, str) else device
        if not isinstance(self.device, torch.device):
            raise TypeError(f"device must be a torch.device or a str such as 'cpu' or 'cuda:0', got {device!r}")
        tables = {name: m for name, m in model.named_modules() if isinstance(m, HostEmbeddingBag)}
        if not tables:
            raise ValueError(f"model {type(model).__name__} has no HostEmbeddingBag; this pipeline trains "
                             f"host-resident tables (use another pipeline for a model without one)")
        self.tables: Dict[str, HostEmbeddingBag] = tables
        dist = ReplicatedInputDist(process_group) if process_group is not None else None
        self._stages = stage_labels(dist is not None)
        self.tasks = CacheTasks(model, dense_optimizer, self.device, ids_of, tables, dist, check_ids)
        self.plan = build_plan(self.tasks.fn, lambda role: role, dist is not None)
        self.lockstep = lockstep and engine == "clocked"
        self.engine: Union[SWPipeline, DataFlowPipeline]
        # The training tasks run on the caller's thread, inside progress(), wherever the engine allows
        # it; the data-flow engine does not below the plan's depth, and there a gate holds them instead.
        self._gated = False
        if engine == "clocked":
            self.engine = SWPipeline(self.plan, device=self.device, caller_thread_group="default",
                                     signal_timeout=signal_timeout, progress_timeout=progress_timeout,
                                     join_timeout=join_timeout)
        else:
            depth = max_depth if max_depth is not None else self.plan.depth
            self._gated = isinstance(depth, int) and not isinstance(depth, bool) and depth < self.plan.depth
            self.engine = DataFlowPipeline(self.plan, depth, device=self.device,
                                           caller_thread_group=None if self._gated else "default",
                                           signal_timeout=signal_timeout, progress_timeout=progress_timeout,
                                           join_timeout=join_timeout)
        for name, table in tables.items():  # the engine accepted the device: move the caches there
            table.adopt(name, self.device)
        self._feed: Optional[_Feed] = None
        self._running = False
        self._failed = False
        self._last: Optional[RunRecorder] = None

    @property
    def steps(self) -> int:
        """Training steps whole in the model (tables and dense optimizer), over every run of this pipeline.

        It equals the outputs ``progress()``/``run()`` returned plus the batches ``run_serial()`` trained,
        except after a step that failed or was interrupted once its tables were updated: that step
        is completed (its dense step run) and counted, though its output never came back. After
        ``reset()``, continue from batch ``steps`` (counted from the first batch this pipeline saw).
        """
        return self.tasks.ledger.completed

    # -- TorchRec's API --------------------------------------------------------------------------

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        """Run one training step; returns the model output of the oldest batch in flight.

        Raises:
            StopIteration: no batch is left.
            RuntimeError: an earlier step failed (call reset()).
            Exception: whatever a task raised (noted with the task and the batch); the run is
                then over, its batches in flight dropped.
        """
        if self._failed:
            raise RuntimeError("progress() after a failed step (its exception was raised then); call reset() to "
                               "start again")
        try:
            if not self._running:
                self._start(dataloader_iter)
            else:
                if self._feed is not None:
                    self._feed.source = dataloader_iter
                if self.lockstep:
                    self.engine.advance()
            gate = self.tasks.gate
            if gate is not None:  # the oldest batch in flight may train: this call returns it
                last = self.engine.last_context
                gate.admit(0 if last is None else last.iter_idx + 1)
            self.engine.progress(self._feed, advance=not self.lockstep)
        except StopIteration:
            self._end()
            raise
        except BaseException as exc:
            self._failed = True
            try:
                self._stop()
            except Exception as secondary:  # never replace the step's own exception (a Ctrl-C still surfaces)
                add_note(exc, f"swpipeline.embcache: then, while ending the run, {type(secondary).__name__}: "
                              f"{secondary}")
            raise
        ctx = self.engine.last_context
        if ctx is None:  # cannot happen: progress() just retired a batch
            raise RuntimeError("the engine retired a batch but kept no context")
        return ctx.output

    def _start(self, dataloader_iter: Iterator[Any]) -> None:
        feed = self._feed
        if feed is not None and feed.source is dataloader_iter and feed.exhausted:
            raise StopIteration  # never call next() on an iterator known to be exhausted
        self._begin("pipelined")
        gate = self.tasks.gate  # the feed must not hold the pipeline (the engine's run keeps the feed)
        self._feed = feed = _Feed(dataloader_iter, gate.close if gate is not None else _nothing)
        self._running = True
        self.engine.fill_pipeline(feed)

    def _begin(self, mode: str) -> None:
        for table in self.tables.values():
            table.begin_run(self)
        self._last = self.tasks.recorder = RunRecorder(mode, self._stages, list(self.tables))
        self.tasks.ledger.open()
        if self._gated and mode == "pipelined":
            engine = weakref.ref(self.engine)
            self.tasks.gate = TrainGate(lambda: _run_over(engine))

    def _close_gate(self) -> None:
        gate = self.tasks.gate
        if gate is not None:
            gate.close()

    def _stop(self) -> None:
        """End the run in flight without training its batches (a gated task gives up at once)."""
        self._close_gate()
        self.engine.abandon()
        self._end()

    def _end(self) -> None:
        """The run is over (its workers stopped): complete a half-applied step, let the tables forget stale plans."""
        self._running = False
        self._close_gate()
        self.tasks.gate = None
        try:
            self.tasks.ledger.settle(self.tasks.step_dense)
        finally:
            for table in self.tables.values():
                table.end_run(self)

    def reset(self) -> None:
        """Drop the batches in flight (without training them) and forget the iterator; ready to start again.

        The model then holds exactly ``steps`` training steps (see ``steps``).
        """
        self._stop()
        self._feed, self._failed = None, False

    # -- whole runs ------------------------------------------------------------------------------

    def run(self, data: Iterable[Any]) -> List[Any]:
        """Train on every batch of ``data``, pipelined (``progress`` until StopIteration); returns the outputs."""
        it = iter(data)
        outputs = []
        while True:
            try:
                outputs.append(self.progress(it))
            except StopIteration:
                return outputs

    def run_serial(self, data: Iterable[Any]) -> List[Any]:
        """Train on each batch of ``data`` one at a time, every task on this thread (the baseline); returns the outputs.

        Raises:
            RuntimeError: a pipelined run is in flight (finish it or reset() first).
        """
        if self._running:
            raise RuntimeError("run_serial() while a pipelined run is in flight; finish it (progress() until "
                               "StopIteration) or call reset() first")
        self._begin("serial")
        outputs = []
        try:
            for index, batch in enumerate(data):
                outputs.append(self.engine.run_one_serial_iter(batch, index).output)
        finally:
            if self.device.type != "cpu":
                torch.accelerator.synchronize(self.device.index)
            self._end()
        return outputs

    # -- what happened -----------------------------------------------------------------------------

    def stats(self) -> EmbCacheStats:
        """Hit rate, rows swapped in and out per batch and time per stage of the current or last run.

        Raises:
            RuntimeError: nothing has run yet.
        """
        if self._last is None:
            raise RuntimeError("stats(): no run yet; call progress(), run() or run_serial() first")
        return self._last.summary()

    def tracing(self) -> ContextManager[None]:
        """Record the timeline of the runs started in the block (read ``timeline`` afterwards)."""
        return self.engine.tracing()

    @property
    def timeline(self) -> Optional[Timeline]:
        """What the last traced run ran where and when (see ``tracing()``), else None."""
        return self.engine.timeline

    def format_schedule(self, num_periods: int) -> str:
        """The plan's schedule: which task works on which batch in each period (the clocked engine's table)."""
        if isinstance(self.engine, SWPipeline):
            return self.engine.format_schedule(num_periods)
        return SWPipeline(self.plan, device="cpu").format_schedule(num_periods)

    def print_schedule(self, num_periods: int) -> None:
        print(self.format_schedule(num_periods))

    def __repr__(self) -> str:
        tables = ", ".join(f"{name}: {table.extra_repr()}" for name, table in self.tables.items())
        return f"{type(self).__name__}(engine={type(self.engine).__name__}, lockstep={self.lockstep}, {tables})"
