"""The synthetic click log: batch ``k`` is a function of ``seed + k`` alone.

A raw batch is what an event log would hold (heavy-tailed dense counts, raw 31-bit ids
that repeat within a sample, click labels drawn from one fixed "true" model), not yet
usable by the model: ``prepare.py`` turns it into a ``ModelBatch``.
"""

from __future__ import annotations

from typing import List, NamedTuple

import torch

from .config import DemoConfig

__all__: List[str] = []

MASK31 = 2**31 - 1  # raw ids are 31-bit, and so are the hash states in prepare.py: their products fit in an int64


class RawBatch(NamedTuple):
    """One batch as it comes from the event log: raw ids and counts, not yet usable by the model.

    ``ids`` holds every event's raw id, feature-major then sample-major; ``lengths[f, s]``
    is how many of them belong to feature ``f`` of sample ``s``. A sample's events repeat
    a few distinct ids (a user clicks the same items again), so most ids are repeats.
    """

    dense: torch.Tensor  # float32 [B, num_dense], non-negative heavy-tailed counts
    ids: torch.Tensor  # int32 [sum(lengths)], raw 31-bit ids
    lengths: torch.Tensor  # int64 [num_sparse, B], 1..max_events
    labels: torch.Tensor  # float32 [B], 0 or 1


def make_raw_batch(cfg: DemoConfig, index: int) -> RawBatch:
    """Batch ``index`` of the synthetic click log; a function of ``cfg.seed + index`` only."""
    gen = torch.Generator().manual_seed(cfg.seed + index)
    num_bags = cfg.num_sparse * cfg.batch_size
    dense = torch.empty(cfg.batch_size, cfg.num_dense).exponential_(0.05, generator=gen).floor_()
    lengths = torch.randint(1, cfg.max_events + 1, (cfg.num_sparse, cfg.batch_size), generator=gen)
    popular = torch.randint(0, 1000, (num_bags, cfg.distinct_ids), generator=gen)  # seen in many samples
    rare = torch.randint(0, MASK31, (num_bags, cfg.distinct_ids), generator=gen)
    candidates = torch.where(torch.rand(num_bags, cfg.distinct_ids, generator=gen) < 0.5, popular, rare)
    bag = torch.repeat_interleave(torch.arange(num_bags), lengths.flatten())
    ids = candidates[bag, torch.randint(0, cfg.distinct_ids, (bag.numel(),), generator=gen)].int()
    truth = torch.Generator().manual_seed(cfg.seed)  # the same "true" click model for every batch
    weights = torch.randn(cfg.num_dense, generator=truth)
    dense_score = torch.log1p(dense) @ weights / cfg.num_dense**0.5
    sparse_score = (candidates[: cfg.batch_size, 0] % 2).float() - 0.5  # feature 0's first candidate
    logits = dense_score - dense_score.mean() + sparse_score
    labels = torch.bernoulli(torch.sigmoid(logits), generator=gen)
    return RawBatch(dense, ids, lengths, labels)


def raw_batch_bytes(batch: RawBatch) -> int:
    """Memory held by one raw batch's tensors."""
    return sum(t.numel() * t.element_size() for t in batch)
