"""Per-run statistics of an embedding-cache pipeline: hit rate, rows swapped per batch, time per stage.

The tasks report into the run's ``RunRecorder`` as they go (each list has one
writer: a task always runs on the same thread), for pipelined and serial runs
alike; ``EmbCacheTrainPipeline.stats()`` summarizes it as ``EmbCacheStats``.

Definitions:

* a batch's *hits* are its distinct ids that were already in the cache when its swap
  was planned; the *hit rate* is hits over distinct ids, summed over the run's batches
  (the first batches of a cold cache are misses);
* *swapped in* / *swapped out*: rows copied from host to cache / written back from
  cache to host by a batch's swap;
* *waited*: batches that did not fit in the cache beside the previous batch, so part of
  their swap (*late* rows) waited until the previous batch had trained and ran in their
  own training step, on the training thread (less lookahead, same results);
  ``pair_rows`` is the cache size at which none would have waited;
* a stage's *time* is the summed run time of its tasks' functions (on whichever
  thread ran them); in a pipelined run the stages overlap, so these add up to more
  than the wall time.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch

from .directory import SwapPlan
from ..observe.tables import text_table as _table

__all__: List[str] = []

@dataclass(frozen=True)
class TableStats:
    """One table's cache traffic over a run.

    Attributes:
        table: the module name.
        batches: batches planned.
        ids: ids looked up, repeats included; ``unique``: distinct ids, summed over batches.
        hits: distinct ids already in the cache.
        swapped_in, swapped_out: per batch, rows swapped in / written back.
        swapped_late: per batch, how many of its swapped-in rows waited for the previous batch's
            training (0: the swap overlapped it entirely).
        pair_rows: the most distinct ids two consecutive batches of the run had together: with
            ``cache_rows`` at least this, no swap waits.
    """

    table: str
    batches: int
    ids: int
    unique: int
    hits: int
    swapped_in: Tuple[int, ...]
    swapped_out: Tuple[int, ...]
    swapped_late: Tuple[int, ...] = ()
    pair_rows: int = 0

    @property
    def waited(self) -> int:
        """Batches whose swap waited, in part, for the previous batch's training."""
        return sum(1 for late in self.swapped_late if late)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.unique if self.unique else 1.0

    @property
    def swapped_in_per_batch(self) -> float:
        return sum(self.swapped_in) / self.batches if self.batches else 0.0

    @property
    def swapped_out_per_batch(self) -> float:
        return sum(self.swapped_out) / self.batches if self.batches else 0.0


@dataclass(frozen=True)
class StageTime:
    """The time one stage's tasks ran: summed (seconds) and the median per batch (seconds)."""

    stage: str
    tasks: Tuple[str, ...]
    total: float
    median_per_batch: float


@dataclass(frozen=True)
class EmbCacheStats:
    """The summary of one run; ``str(stats)`` prints it as tables.

    Attributes:
        mode: ``"pipelined"`` or ``"serial"``.
        steps: training steps completed.
        wall: seconds from the run's start to its last completed step.
        tables: one TableStats per HostEmbeddingBag, by module name.
        stages: the time of each stage of the plan, in stage order.
    """

    mode: str
    steps: int
    wall: float
    tables: Tuple[TableStats, ...]
    stages: Tuple[StageTime, ...]

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.wall if self.wall > 0 else 0.0

    def table(self, name: str) -> TableStats:
        for stats in self.tables:
            if stats.table == name:
                return stats
        raise KeyError(f"no table {name!r}; tables: {[t.table for t in self.tables]}")

    def format(self) -> str:
        head = (f"{self.mode} run: {self.steps} steps in {self.wall:.3f} s, {self.steps_per_second:.1f} steps/s")
        rows = [[t.table, str(t.batches), f"{t.ids / max(t.batches, 1):.1f}", f"{t.unique / max(t.batches, 1):.1f}",
                 f"{t.hit_rate:.1%}", f"{t.swapped_in_per_batch:.1f}", f"{t.swapped_out_per_batch:.1f}",
                 str(t.waited)] for t in self.tables]
        lines = [head, ""] + _table(["table", "batches", "ids/batch", "distinct/batch", "hit rate", "in/batch",
                                     "out/batch", "waited"], rows, left=1)
        for t in self.tables:
            if t.waited:
                lines.append(f"{t.table}: {t.waited} of {t.batches} batches did not fit in the cache beside the "
                             f"previous batch, so part of their swap waited for it to train (less overlap, same "
                             f"results); cache_rows >= {t.pair_rows} keeps every swap overlapped")
        rows = [[s.stage, " ".join(s.tasks), f"{s.total:.3f}", f"{s.median_per_batch * 1e3:.3f}"]
                for s in self.stages]
        lines += [""] + _table(["stage", "tasks", "total s", "median ms/batch"], rows, left=2)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _pair_rows(plans: Sequence[SwapPlan]) -> int:
    """The most distinct ids of two consecutive batches together (of one batch, for a single batch)."""
    most = max((p.num_unique for p in plans), default=0)
    for before, after in zip(plans, plans[1:]):
        most = max(most, int(torch.unique(torch.cat([before.unique_ids, after.unique_ids])).numel()))
    return most


class RunRecorder:
    """What one run's tasks report.

    Args:
        mode: ``"pipelined"`` or ``"serial"``.
        stages: (stage label, its task names) in stage order.
        tables: the table names.
    """

    def __init__(self, mode: str, stages: Sequence[Tuple[str, Sequence[str]]], tables: Sequence[str]) -> None:
        self.mode = mode
        self.stages = [(label, tuple(tasks)) for label, tasks in stages]
        self.swaps: Dict[str, List[SwapPlan]] = {name: [] for name in tables}
        self.seconds: Dict[str, List[float]] = {t: [] for _, tasks in self.stages for t in tasks}
        self.start = time.perf_counter()
        self.last_step = self.start
        self.steps = 0

    def planned(self, plan: SwapPlan) -> None:
        self.swaps[plan.table].append(plan)

    def step_done(self) -> None:
        self.steps += 1
        self.last_step = time.perf_counter()

    def summary(self) -> EmbCacheStats:
        tables = []
        for name, plans in self.swaps.items():
            plans = list(plans)
            tables.append(TableStats(
                table=name, batches=len(plans), ids=sum(p.num_ids for p in plans),
                unique=sum(p.num_unique for p in plans), hits=sum(p.num_hits for p in plans),
                swapped_in=tuple(p.num_loaded for p in plans), swapped_out=tuple(p.num_evicted for p in plans),
                swapped_late=tuple(p.num_late for p in plans), pair_rows=_pair_rows(plans)))
        stages = []
        for label, tasks in self.stages:
            runs = [list(self.seconds[t]) for t in tasks]
            per_batch = [sum(times) for times in zip(*runs)]
            stages.append(StageTime(label, tasks, sum(sum(r) for r in runs),
                                    statistics.median(per_batch) if per_batch else 0.0))
        return EmbCacheStats(self.mode, self.steps, self.last_step - self.start, tuple(tables), tuple(stages))
