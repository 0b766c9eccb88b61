"""Where a TorchRec plan's batches come from: the user's iterator, a look-ahead, and rank agreement.

``BatchFeed`` is the iterator the engine draws from. It can look ahead (so a
pipeline with ``execute_all_batches=False`` knows, before it starts a step,
that the step's new batch does not exist, and stops there as TorchRec does), it
follows the iterator ``progress()`` was last called with, and with
``RankAgreement`` every rank sees the end of the data at the same batch.

Uneven data (TorchRec issues #1014, #4158): when one rank's iterator runs out
first, that rank stops calling the collectives the others are blocked in, and
the job hangs. ``RankAgreement`` all-reduces "I have a batch" (MIN) for every
batch on a process group of its own, so collectives the pipeline issues on the
model's group in worker threads never interleave with it; all ranks then end at
the shortest rank's batch count. A rank with more data drops the batch it drew
for the failed round and leaves the rest in its iterator.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Deque, Iterator, List, Optional

import torch
import torch.distributed as dist

__all__: List[str] = []


class RankAgreement:
    """One all-reduce per batch so every rank ends its data at the same batch.

    Args:
        group: the process group to agree on; ``None`` creates a new gloo group over
            all ranks (a collective call: every rank must build its pipeline in the
            same order).
    """

    def __init__(self, group: Optional[Any] = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("stop_together needs torch.distributed to be initialized "
                               "(call torch.distributed.init_process_group first)")
        if group is None:
            group = dist.new_group(backend="gloo")
            if not isinstance(group, dist.ProcessGroup):  # new_group() says so with a sentinel
                raise RuntimeError("stop_together: this rank is not a member of the new process group")
        self.group: dist.ProcessGroup = group
        self.rounds = 0

    def all_have(self, have: bool) -> bool:
        """True when every rank has a batch this round."""
        flag = torch.tensor([1 if have else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        self.rounds += 1
        return bool(flag.item() == 1)


class BatchFeed:
    """An iterator over the current source's batches, with look-ahead and optional rank agreement."""

    def __init__(self, source: Iterator[Any], agreement: Optional[RankAgreement] = None) -> None:
        self.source = source
        self.agreement = agreement
        self._ahead: Deque[Any] = collections.deque()
        self.exhausted = False
        self.paused = False  # while True the feed looks empty (StagedTrainPipeline's flush)
        self.drawn = 0  # batches handed to the engine
        self.on_exhausted: Optional[Callable[[], None]] = None  # called once, at the end of the data

    def __iter__(self) -> "BatchFeed":
        return self

    def __next__(self) -> Any:
        if self.paused or (not self._ahead and not self._pull()):
            raise StopIteration
        self.drawn += 1
        return self._ahead.popleft()

    def has(self, count: int) -> bool:
        """Whether at least ``count`` more batches will come (draws them ahead as needed)."""
        if self.paused:
            return False
        while len(self._ahead) < count:
            if not self._pull():
                return False
        return True

    def _pull(self) -> bool:
        """Draw one batch from the source into the look-ahead; False at the end of the data."""
        if self.exhausted:
            return False
        try:
            batch = next(self.source)
            have = True
        except StopIteration:
            batch, have = None, False
        if self.agreement is not None:
            have = self.agreement.all_have(have)
        if not have:
            self.exhausted = True
            if self.on_exhausted is not None:
                self.on_exhausted()
            return False
        self._ahead.append(batch)
        return True
