"""Batch preparation, the demo's stage 0: raw ids hashed into their tables, repeats dropped, offsets built.

This is the CPU work the pipeline overlaps with training; ``ModelBatch.to`` is stage 1's copy.
"""

from __future__ import annotations

from typing import List, NamedTuple, Sequence, Tuple

import torch

from .data import MASK31, RawBatch

__all__: List[str] = []

_HASH_MULTIPLIER = 0x45D9F3B  # a well-mixing odd constant for 32-bit integer hashes


class ModelBatch(NamedTuple):
    """A batch the model can consume: one (ids, offsets) pair per embedding bag."""

    dense: torch.Tensor  # float32 [B, num_dense], standardised log-counts
    ids: Tuple[torch.Tensor, ...]  # per feature: int64 rows of its table, no repeats within a sample
    offsets: Tuple[torch.Tensor, ...]  # per feature: int64 [B], where each sample's bag starts in ids
    labels: torch.Tensor  # float32 [B, 1]

    def to(self, device: torch.device) -> "ModelBatch":
        """The batch on ``device`` (a no-op returning the same tensors when it is already there)."""
        return ModelBatch(self.dense.to(device, non_blocking=True),
                          tuple(t.to(device, non_blocking=True) for t in self.ids),
                          tuple(t.to(device, non_blocking=True) for t in self.offsets),
                          self.labels.to(device, non_blocking=True))

    def tensors(self) -> List[torch.Tensor]:
        """Every tensor of the batch, as a flat list."""
        return [self.dense, *self.ids, *self.offsets, self.labels]


def hash_ids(ids: torch.Tensor, feature: torch.Tensor, table_sizes: Sequence[int]) -> torch.Tensor:
    """Row of each raw id in its feature's table: a feature-salted 31-bit integer hash, mod the table size."""
    salts = torch.tensor([(0x9E3779B1 * (f + 1)) & MASK31 for f in range(len(table_sizes))])
    state = (ids.long() ^ salts[feature]) & MASK31
    for _ in range(2):
        state = ((state >> 16) ^ state) * _HASH_MULTIPLIER & MASK31
    state = (state >> 16) ^ state
    return state % torch.tensor(list(table_sizes))[feature]


def prepare_batch(raw: RawBatch, table_sizes: Sequence[int]) -> ModelBatch:
    """Hash raw ids into their tables, drop repeated ids within a bag, build offsets, standardise dense.

    The work is done for all features at once: each event gets the key
    ``bag * stride + row`` (``bag = feature * B + sample``), so one sorted ``unique``
    both removes the repeats and groups the rows by feature, then by sample.
    """
    num_sparse, size = raw.lengths.shape
    bag = torch.repeat_interleave(torch.arange(num_sparse * size), raw.lengths.flatten())
    rows = hash_ids(raw.ids, torch.div(bag, size, rounding_mode="floor"), table_sizes)
    stride = max(table_sizes)
    keys = torch.unique(bag * stride + rows)
    per_bag = torch.bincount(torch.div(keys, stride, rounding_mode="floor"), minlength=num_sparse * size)
    per_bag = per_bag.view(num_sparse, size)
    ids = (keys % stride).split(per_bag.sum(1).tolist())
    offsets = (per_bag.cumsum(1) - per_bag).unbind(0)
    log_dense = torch.log1p(raw.dense)
    dense = (log_dense - log_dense.mean(0)) / (log_dense.std(0) + 1e-6)
    return ModelBatch(dense, tuple(ids), tuple(offsets), raw.labels.unsqueeze(1))
