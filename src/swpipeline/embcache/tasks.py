"""The task functions of the embedding-cache plan: each is one step of one batch.

Every function takes the batch's ``IterContext`` and keeps that batch's state on it::

    ctx.batch    the batch as the iterator yielded it (read-only)
    ctx.data     the batch on the device (H2D)
    ctx.ids      table -> this rank's ids of the batch, flat int64 on the host
    ctx.plans    table -> PlannedBatch: the swap plan, and each id's row among the batch's distinct ids
    ctx.placed   table -> the device tensors the swap made for the lookup (slots, relabelled ids)
    ctx.rows     table -> BatchRows: the rows gathered from the cache for forward and update
    ctx.loss, ctx.output   what the model returned

Shared state (model, optimizers, tables, the run's recorder, the step ledger and gate,
``steps.py``) is ``CacheTasks``'s. The engine runs each function with its stream current
and after its dependencies, so no function waits for another itself (a training task
on a worker thread waits only at the gate, for the caller).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch

from ..plan.context import IterContext
from .batches import record_stream, to_device
from .directory import SwapPlan
from .input_dist import ReplicatedInputDist
from .stages import TRAIN_TASKS
from .stats import RunRecorder
from .steps import StepLedger, TrainGate
from .table import BatchRows, HostEmbeddingBag, check_offsets

__all__: List[str] = []

TaskFn = Callable[[IterContext], None]
IdsOf = Callable[[Any], Mapping[str, Any]]


@dataclass(frozen=True)
class PlannedBatch:
    """One table's part of a batch after ComputeSwap (host tensors)."""

    swap: SwapPlan
    inverse: torch.Tensor  # each id of this rank's batch -> its row among swap.unique_ids
    ids: torch.Tensor  # this rank's ids, flat


@dataclass(frozen=True)
class Placed:
    """One table's device tensors for the lookup, made by the swap."""

    slots: torch.Tensor
    inverse: torch.Tensor
    ids: Optional[torch.Tensor]
    swap: SwapPlan  # for its late part, moved by the lookup


@dataclass(frozen=True)
class RowUpdate:
    """One table's updated rows (and optimizer state) of one batch, computed and not yet written."""

    table: HostEmbeddingBag
    slots: torch.Tensor
    values: torch.Tensor
    state: Optional[torch.Tensor]


class CacheTasks:
    """The task functions, bound to one pipeline's model, optimizer, tables and device.

    Args:
        model: the model; ``model(batch)`` returns ``(loss, output)``.
        dense_optimizer: steps the model's parameters (the tables have none), or None.
        device: where the batch, the model and the caches are.
        ids_of: ``ids_of(batch)`` -> ``{table name: (ids, offsets)}`` (or ``{name: ids}``).
        tables: the model's HostEmbeddingBags by module name.
        input_dist: the collectives of a data-parallel run, or None.
        check_ids: check in forward that each table gets exactly the ids ``ids_of`` named.
    """

    def __init__(self, model: torch.nn.Module, dense_optimizer: Optional[Any], device: torch.device, ids_of: IdsOf,
                 tables: Dict[str, HostEmbeddingBag], input_dist: Optional[ReplicatedInputDist],
                 check_ids: bool) -> None:
        self.model = model
        self.dense_optimizer = dense_optimizer
        self.device = device
        self.ids_of = ids_of
        self.tables = tables
        self.input_dist = input_dist
        self.check_ids = check_ids
        self.recorder: Optional[RunRecorder] = None  # the current run's; set before the run starts
        self.ledger = StepLedger()
        self.gate: Optional[TrainGate] = None  # the current run's, when training runs on a worker thread
        self._by_name: Dict[str, TaskFn] = {
            "H2D": self.h2d, "InputDist": self.exchange_ids, "ComputeSwap": self.compute_swap, "Swap": self.swap,
            "ZeroGrad": self.zero_grad, "Lookup": self.lookup, "Forward": self.forward, "Backward": self.backward,
            "SparseUpdate": self.sparse_update, "DenseStep": self.dense_step,
        }

    def fn(self, name: str) -> TaskFn:
        """Task ``name``'s function, timed into the current run's recorder (a training task behind the gate)."""
        body = self._by_name[name]
        gated = name in TRAIN_TASKS
        clock = time.perf_counter

        def timed(ctx: IterContext) -> None:
            gate = self.gate
            if gated and gate is not None:
                gate.wait(ctx.iter_idx)
            recorder = self.recorder
            start = clock()
            body(ctx)
            if recorder is not None:
                recorder.seconds[name].append(clock() - start)

        return timed

    @property
    def training(self) -> bool:
        return bool(self.model.training)

    # -- stage 0-2: the batch, its ids, the swap plan --------------------------------------------

    def h2d(self, ctx: IterContext) -> None:
        ctx.data = to_device(ctx.batch, self.device)

    def _local_ids(self, ctx: IterContext) -> Dict[str, torch.Tensor]:
        """``ids_of(ctx.batch)``, checked: one entry per table, ids in range."""
        named = self.ids_of(ctx.batch)
        if not isinstance(named, Mapping):
            raise TypeError(f"ids_of(batch) must return a dict of table name -> (ids, offsets), got "
                            f"{type(named).__name__}")
        if set(named) != set(self.tables):
            raise ValueError(f"ids_of(batch) returned tables {sorted(named)}, but the model's HostEmbeddingBags are "
                             f"{sorted(self.tables)}; return one (ids, offsets) per HostEmbeddingBag, by module name")
        ids = {}
        for name, value in named.items():
            raw = value[0] if isinstance(value, (tuple, list)) else value
            where = f"ids_of(batch)[{name!r}]"
            ids[name] = self.tables[name].check_ids(raw, where)
            if isinstance(value, (tuple, list)) and len(value) > 1 and value[1] is not None:
                check_offsets(value[1], ids[name].numel(), where)
        return ids

    def exchange_ids(self, ctx: IterContext) -> None:
        """InputDist: this rank's ids, and every rank's (data-parallel runs only)."""
        if self.input_dist is None:
            raise RuntimeError("InputDist runs only with a process group")
        ctx.ids = self._local_ids(ctx)
        ctx.planned_ids = self.input_dist.exchange(ctx.ids)

    def compute_swap(self, ctx: IterContext) -> None:
        """ComputeSwap: each table's distinct ids, which of them to swap in, and what to evict for them."""
        local = ctx.ids if self.input_dist is not None else self._local_ids(ctx)
        everyone = ctx.planned_ids if self.input_dist is not None else local
        plans = {}
        for name, table in self.tables.items():
            unique, inverse = torch.unique(everyone[name], sorted=True, return_inverse=True)
            if self.input_dist is not None:
                inverse = torch.searchsorted(unique, local[name])
            plan = table.plan_swap(unique, int(everyone[name].numel()))
            if self.recorder is not None:
                self.recorder.planned(plan)
            plans[name] = PlannedBatch(plan, inverse, local[name])
        ctx.plans = plans

    # -- stage 3: the swap ------------------------------------------------------------------------

    def swap(self, ctx: IterContext) -> None:
        """Swap: write the evicted rows back to the host, bring the missing ones in; stage the lookup's indices."""
        placed = {}
        for name, planned in ctx.plans.items():
            self.tables[name].rows.swap(planned.swap)
            placed[name] = Placed(self._to_device(planned.swap.slots), self._to_device(planned.inverse),
                                  self._to_device(planned.ids) if self.check_ids else None, planned.swap)
        ctx.placed = placed
        del ctx.plans

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device, non_blocking=True)

    # -- stage 4: training on the cached rows -------------------------------------------------------

    def zero_grad(self, ctx: IterContext) -> None:
        if self.training and self.dense_optimizer is not None:
            self.dense_optimizer.zero_grad()

    def lookup(self, ctx: IterContext) -> None:
        """Lookup: gather each table's rows of the batch from the cache (after the previous batch's update).

        First the late part of the batch's swap, if it has one: the rows of the previous batch that
        this one evicts, which the swap could not move while the previous batch trained.
        """
        rows = {}
        for name, placed in ctx.placed.items():
            cache = self.tables[name].rows
            cache.finish_swap(placed.swap)
            cache.keep_for_stream(*(t for t in (placed.slots, placed.inverse, placed.ids) if t is not None))
            weight = cache.gather(placed.slots)
            if self.training:
                weight.requires_grad_(True)
            rows[name] = BatchRows(weight, placed.inverse, placed.slots, placed.ids)
        ctx.rows = rows
        del ctx.placed

    def forward(self, ctx: IterContext) -> None:
        """Forward: the model on the device batch, each HostEmbeddingBag reading its gathered rows."""
        if self.device.type == "cuda":
            record_stream(ctx.data, torch.cuda.current_stream(self.device))  # made on the memcpy stream
        for name, table in self.tables.items():
            table.activate(ctx.rows[name])
        try:
            if self.training:
                result = self.model(ctx.data)
            else:
                with torch.no_grad():
                    result = self.model(ctx.data)
        finally:
            for table in self.tables.values():
                table.activate(None)
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.Tensor)):
            raise TypeError(f"model(batch) must return (loss, output) with loss a tensor, as TorchRec models do; "
                            f"got {type(result).__name__}")
        ctx.loss, ctx.output = result

    def backward(self, ctx: IterContext) -> None:
        if self.training:
            loss = ctx.loss
            (loss if loss.dim() == 0 else loss.sum()).backward()
        del ctx.loss

    def sparse_update(self, ctx: IterContext) -> None:
        """SparseUpdate: the tables' optimizer on the batch's rows, written back into the cache.

        Every table's new rows are computed first; then all are written and the ledger notes it,
        as one piece (``StepLedger.write_tables``).
        """
        updates: List[RowUpdate] = []
        if self.training:
            with torch.no_grad():
                for name, rows in ctx.rows.items():
                    update = self._update(self.tables[name], rows)
                    if update is not None:
                        updates.append(update)

        def write() -> None:
            for update in updates:
                update.table.rows.write(update.slots, update.values, update.state)

        self.ledger.write_tables(write)
        del ctx.rows

    def _update(self, table: HostEmbeddingBag, rows: BatchRows) -> Optional[RowUpdate]:
        """The table's updated rows (and state) for this batch, not written yet; None if the table got no gradient."""
        grad = rows.weight.grad
        if self.input_dist is not None:
            grad = grad if grad is not None else torch.zeros_like(rows.weight)
            self.input_dist.reduce_grad(grad)  # every rank calls it, with or without a gradient of its own
        if grad is None:
            return None  # the model did not use the table: torch.optim skips a parameter without gradient
        values = rows.weight.detach()
        state = table.rows.gather_state(rows.slots)
        table.optimizer.update(values, grad, state)
        return RowUpdate(table, rows.slots, values, state)

    def dense_step(self, ctx: IterContext) -> None:
        self.ledger.begin_dense_step()
        self.step_dense()
        self.ledger.end_step()

    def step_dense(self) -> None:
        """The dense optimizer's step of one batch (also run by ``StepLedger.settle`` to complete a step)."""
        if self.training and self.dense_optimizer is not None:
            self.dense_optimizer.step()
        if self.recorder is not None:
            self.recorder.step_done()
