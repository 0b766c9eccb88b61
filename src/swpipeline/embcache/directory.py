"""Which table row lives in which cache slot, and the swap plan of each batch.

The directory is the planning half of the cache: it decides, batch after batch, which
rows to swap in and which to evict, without touching a single row value (the swap
task moves the values later, ``cache.py``). Batches are planned one at a time, in
order, on one thread.

**Pinning.** The swap of batch j runs while batch j-1 trains (that overlap is the
point of the pipeline), so that swap may not evict a row that batch j-1 uses: that
row is still to be read and updated. Planning batch j therefore keeps batch j's own
rows and evicts other slots, free slots first, then the least recently used (ties by
slot number). Rows of batch j-2 and older are safe to evict at once: the plan runs the
swap of batch j only after batch j-1 has read its rows, hence after batch j-2's update
(``stages.py``)::

    period        p                        p+1
    default       Lookup(j-1) Fwd Bwd Upd  | [late(j)] Lookup(j) Fwd Bwd Upd
    swap          Swap(j) ------------     | Swap(j+1) -----------
                  evicts neither j-1's rows nor j's; moves rows last updated by j-2 or earlier

**When two batches do not fit together** (``|rows(j-1) u rows(j)| > cache_rows``),
the rows of batch j-1 that batch j does not use are evicted too, but *late*: the
swap of batch j moves what it can at once, and the rest of its rows (``num_late``,
always the last victims in least-recently-used order, which are exactly the slots of
batch j-1) are moved by batch j's own training step, at the start of its ``Lookup``,
which the plan runs after batch j-1's update. That is the only wait, and it is one the
plan already declares (``Lookup(j) <- SparseUpdate(j-1)``): a batch that does not fit
beside the previous one costs lookahead, never a deadlock. A batch whose own distinct
rows exceed ``cache_rows`` cannot be trained through the cache; planning it raises
``ValueError`` before anything of it runs, naming the size that would hold it.

Guarantees: a planned batch's rows are all resident once its swap (and its late part)
has run; a slot holds at most one row and a row at most one slot; the decisions depend
only on the sequence of batches, so a serial and a pipelined run make the same ones;
when every two consecutive batches fit together, no swap has a late part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

__all__: List[str] = []

FREE = -2  # last_use of a slot that holds no row: older than any batch, so free slots are taken first


@dataclass(frozen=True)
class SwapPlan:
    """What the swap of one batch does to one table's cache (host int64 tensors).

    Attributes:
        table: the table's name in the model.
        batch: the table's batch number (every batch planned for it, counted from 0).
        unique_ids: the distinct ids of the batch, ascending.
        slots: the cache slot of each of ``unique_ids`` once the swap has run.
        load_ids, load_slots: the rows swapped in (absent before), and where they go.
        evict_ids, evict_slots: the rows swapped out (written back to host memory) to make room.
        num_ids: how many ids the batch looks up, repeats included.
        num_late: how many of the swapped rows are moved late, by the batch's own training step
            once the previous batch has trained (the last ``num_late`` entries of ``load_ids`` /
            ``load_slots`` and of ``evict_ids`` / ``evict_slots``); 0 when the two batches fit together.
    """

    table: str
    batch: int
    unique_ids: torch.Tensor
    slots: torch.Tensor
    load_ids: torch.Tensor
    load_slots: torch.Tensor
    evict_ids: torch.Tensor
    evict_slots: torch.Tensor
    num_ids: int
    num_late: int = 0

    @property
    def num_unique(self) -> int:
        return int(self.unique_ids.numel())

    @property
    def num_loaded(self) -> int:
        return int(self.load_ids.numel())

    @property
    def num_evicted(self) -> int:
        return int(self.evict_ids.numel())

    @property
    def num_hits(self) -> int:
        """Distinct ids of the batch that were already in the cache."""
        return self.num_unique - self.num_loaded

    @property
    def waits(self) -> bool:
        """Whether part of the swap waits for the previous batch's training (the two did not fit together)."""
        return self.num_late > 0


class CacheDirectory:
    """The id <-> slot map of one table's cache, with pinning and least-recently-used eviction.

    Args:
        name: the table's name (for messages).
        num_embeddings: rows in the table.
        cache_rows: slots in the cache.
    """

    def __init__(self, name: str, num_embeddings: int, cache_rows: int) -> None:
        self.name = name
        self.cache_rows = cache_rows
        self.slot_of = torch.full((num_embeddings,), -1, dtype=torch.int64)  # row -> slot, -1: not planned in
        self.id_in_slot = torch.full((cache_rows,), -1, dtype=torch.int64)  # slot -> row, -1: free
        self.last_use = torch.full((cache_rows,), FREE, dtype=torch.int64)  # slot -> last batch that used it
        self.batches = 0  # batches planned so far: the next one is batch number `batches`

    def plan(self, unique_ids: torch.Tensor, num_ids: int) -> SwapPlan:
        """Plan the next batch, whose distinct ids (ascending, in range) are ``unique_ids``.

        Raises:
            ValueError: the batch alone has more distinct ids than the cache has slots (nothing is
                changed: the directory is as before the call).
        """
        j = self.batches
        if unique_ids.numel() > self.cache_rows:
            raise ValueError(
                f"cache_rows={self.cache_rows} of table {self.name!r} is too small for this batch: it looks up "
                f"{unique_ids.numel()} distinct ids ({num_ids} ids in all), and all the rows a batch trains on must "
                f"be in the cache at once; use cache_rows >= {unique_ids.numel()} (more, e.g. the distinct rows of "
                f"two consecutive batches, keeps every swap overlapped with the training), or smaller batches")
        slots = self.slot_of.index_select(0, unique_ids)
        miss = slots < 0
        load_ids = unique_ids[miss]
        self.last_use[slots[~miss]] = j  # pin the hits first: they must not be chosen as victims
        victims = self._victims(j, load_ids.numel())
        num_late = int((self.last_use.index_select(0, victims) == j - 1).sum()) if j > 0 else 0
        previous = self.id_in_slot.index_select(0, victims)
        occupied = previous >= 0
        evict_ids, evict_slots = previous[occupied], victims[occupied]
        self.slot_of[evict_ids] = -1
        self.slot_of[load_ids] = victims
        self.id_in_slot[victims] = load_ids
        self.last_use[victims] = j
        slots[miss] = victims
        self.batches = j + 1
        return SwapPlan(self.name, j, unique_ids, slots, load_ids, victims, evict_ids, evict_slots, num_ids,
                        num_late)

    def _victims(self, j: int, needed: int) -> torch.Tensor:
        """The ``needed`` slots to fill, least recently used first (free slots first; ties by slot number).

        Every slot not holding a row of batch j may be chosen (there are enough: the caller checked
        that the batch fits). Slots of batch j-1 come after every older one, so they are taken only
        when the others do not suffice, and they end the returned order (the late part of the swap).
        """
        if needed == 0:
            return torch.empty(0, dtype=torch.int64)
        evictable = (self.last_use < j).nonzero().squeeze(1)
        # One key per slot, unique: least recently used first, then the lower slot number.
        keys = self.last_use.index_select(0, evictable) * self.cache_rows + evictable
        chosen = torch.topk(keys, needed, largest=False, sorted=True).indices
        return evictable.index_select(0, chosen)

    def resync(self, resident_ids: torch.Tensor, batches_swapped: int) -> None:
        """Forget plans whose swap never ran (an abandoned run): match the slots' actual contents again.

        Args:
            resident_ids: slot -> the row it holds now (-1: free).
            batches_swapped: how many batches' swaps have run; planning continues from there.
        """
        self.id_in_slot = resident_ids.clone()
        occupied = self.id_in_slot >= 0
        self.slot_of.fill_(-1)
        self.slot_of[self.id_in_slot[occupied]] = occupied.nonzero().squeeze(1)
        self.last_use.clamp_(max=batches_swapped - 1)
        self.last_use[~occupied] = FREE
        self.batches = batches_swapped
