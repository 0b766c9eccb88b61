"""The sizes of the demo job, in one frozen value (``DemoConfig``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

__all__: List[str] = []


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo job.

    The defaults make PrepareBatch cost about as much as Forward + Backward + OptimizerStep
    on one core, so two cores can overlap them for close to a 2x speedup.
    """

    iters: int = 200
    batch_size: int = 2048
    warmup_iters: int = 10
    seed: int = 0
    num_dense: int = 13
    table_sizes: Tuple[int, ...] = (20_000, 10_000, 5_000, 20_000, 8_000, 2_000, 15_000, 4_000)
    max_events: int = 16  # raw events (ids) per sample and feature: 1..max_events
    distinct_ids: int = 4  # events of one sample and feature repeat these many distinct ids
    embedding_dim: int = 16
    bottom_mlp: Tuple[int, ...] = (64, 16)
    top_mlp: Tuple[int, ...] = (64,)
    learning_rate: float = 0.05

    @property
    def num_sparse(self) -> int:
        return len(self.table_sizes)
