"""EmbCacheTrainPipeline: training through host-resident embedding tables, a plan behind TorchRec's calling convention.

::

    pipeline = EmbCacheTrainPipeline(model, dense_optimizer, device, ids_of=ids_of)
    while True:
        try:
            output = pipeline.progress(dataloader_iter)   # one training step; the oldest batch's output
        except StopIteration:                            # the data is drained
            break

Each ``progress`` call is one period of the plan (``stages.py``): the first call
fills the pipeline (one batch per stage), every call then retires the oldest batch
and returns its model output. With ``lockstep=True`` (the default, clock-driven
engine) the training tasks run on the calling thread and nothing of the next step
starts before the next call, so between calls the model, the dense optimizer and
``full_weight()`` show exactly the state after the returned step (the swap and swap
plan of the next batches may still be running on their threads; they do not change
any row value). ``run_serial`` runs the same tasks one batch at a time, as the
baseline; both make the same cache decisions and compute the same bits.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Dict, Iterable, Iterator, List, Mapping, Optional, Union

import torch

from ..clocked import SWPipeline
from ..dataflow import DataFlowPipeline
from ..timeline import Timeline
from .input_dist import ReplicatedInputDist
from .stages import build_plan, stage_labels
from .stats import EmbCacheStats, RunRecorder
from .table import HostEmbeddingBag
from .tasks import CacheTasks

__all__: List[str] = []

ENGINES = ("clocked", "dataflow")


class _Feed:
    """The iterator the engine draws from: the one the latest ``progress`` call passed."""

    def __init__(self, source: Iterator[Any]) -> None:
        self.source = source
        self.exhausted = False

    def __iter__(self) -> "_Feed":
        return self

    def __next__(self) -> Any:
        try:
            return next(self.source)
        except StopIteration:
            self.exhausted = True
            raise


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
        process_group: data-parallel training on several ranks (every rank keeps whole
            tables; see ``input_dist.py``); adds the InputDist stage.
        engine: ``"clocked"`` (SWPipeline, the default) or ``"dataflow"`` (DataFlowPipeline;
            later batches may then train while the caller is between calls).
        max_depth: the data-flow engine's bound on batches in flight (default: the plan's depth).
        lockstep: with the clocked engine, run the training tasks on the caller's thread and
            start nothing of the next step before the next call (TorchRec's step boundary).
        check_ids: check in each forward that a table gets exactly the ids ``ids_of`` named.
        signal_timeout, progress_timeout: the engine's timeouts, in seconds.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: no HostEmbeddingBag in the model, an unknown engine, a bad max_depth.
    """

    def __init__(self, model: torch.nn.Module, dense_optimizer: Optional[Any], device: Union[str, torch.device], *,
                 ids_of: Callable[[Any], Mapping[str, Any]], process_group: Optional[Any] = None,
                 engine: str = "clocked", max_depth: Optional[int] = None, lockstep: bool = True,
                 check_ids: bool = True, signal_timeout: float = 30.0, progress_timeout: float = 600.0) -> None:
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
        if engine == "clocked":
            self.engine = SWPipeline(self.plan, device=self.device, signal_timeout=signal_timeout,
                                     progress_timeout=progress_timeout,
                                     caller_thread_group="default" if self.lockstep else None)
        else:
            self.engine = DataFlowPipeline(self.plan, max_depth if max_depth is not None else self.plan.depth,
                                           device=self.device, signal_timeout=signal_timeout,
                                           progress_timeout=progress_timeout)
        for name, table in tables.items():  # the engine accepted the device: move the caches there
            table.adopt(name, self.device)
        self._feed: Optional[_Feed] = None
        self._running = False
        self._failed = False
        self._last: Optional[RunRecorder] = None
        self.steps = 0  # outputs returned by progress() so far

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
            self.engine.progress(self._feed, advance=not self.lockstep)
        except StopIteration:
            self._end()
            raise
        except BaseException:
            self._failed = True
            self.engine.abandon()
            self._end()
            raise
        ctx = self.engine.last_context
        if ctx is None:  # cannot happen: progress() just retired a batch
            raise RuntimeError("the engine retired a batch but kept no context")
        self.steps += 1
        return ctx.output

    def _start(self, dataloader_iter: Iterator[Any]) -> None:
        feed = self._feed
        if feed is not None and feed.source is dataloader_iter and feed.exhausted:
            raise StopIteration  # never call next() on an iterator known to be exhausted
        self._feed = feed = _Feed(dataloader_iter)
        self._begin("pipelined")
        self._running = True
        self.engine.fill_pipeline(feed)

    def _begin(self, mode: str) -> None:
        for table in self.tables.values():
            table.begin_run(self)
        self._last = self.tasks.recorder = RunRecorder(mode, self._stages, list(self.tables))

    def _end(self) -> None:
        self._running = False
        for table in self.tables.values():
            table.end_run(self)

    def reset(self) -> None:
        """Drop the batches in flight (without training them) and forget the iterator; ready to start again."""
        self.engine.abandon()
        self._end()
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
