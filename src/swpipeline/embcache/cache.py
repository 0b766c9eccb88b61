"""Host rows and the device cache of one table, and the swap that moves rows between them.

``RowCache`` owns the values: every row and its optimizer state in host memory
(pinned when the cache is on an accelerator, so copies to and from it are
asynchronous), and ``cache_rows`` rows (and state) on the cache's device. A row
lives in exactly one of two places at a time: while it is resident, the cache holds
its current value and its host copy is stale.

The swap of one batch (``swap``), run by the swap task with the swap stream current:

    1. gather the evicted slots' rows and state on the device, copy them to the host,
       and write them into the host rows (the "swap out");
    2. gather the incoming rows and state from the host rows, copy them to the
       device, and write them into their slots (the "swap in").

A plan with a late part (``SwapPlan.num_late``: the batch did not fit beside the
previous one) moves its last ``num_late`` rows later, in ``finish_swap``, which the
batch's training step calls first, once the previous batch has trained (``directory.py``).
Swaps run in plan order: the swap of batch j+1 starts after batch j's training step
began, hence after batch j's late part.

Only the swap changes which row is resident (``resident_ids``); it holds the cache's
lock while it does, and so do ``full_weight`` and ``lookup``, which read both places.
Row *values* in the cache are also changed by the training step (``write``), which the
plan orders after this batch's swap and before any swap that could evict those rows.

Accelerator notes: the device-side index tensors made here on the swap stream are used
later on the default stream; the task that uses them calls ``keep_for_stream`` so the
caching allocator does not hand their memory out again before that stream is done.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

import torch

from .directory import SwapPlan

__all__: List[str] = []


class RowCache:
    """The rows (and optimizer state) of one table: in host memory, and ``cache_rows`` of them on a device.

    Args:
        weight: the initial ``[num_embeddings, dim]`` float rows (taken over, not copied).
        cache_rows: slots in the device cache.
        with_state: whether each row has optimizer state of its own shape (Adagrad's sum).
    """

    def __init__(self, weight: torch.Tensor, cache_rows: int, with_state: bool) -> None:
        self.host_weight = weight
        self.host_state: Optional[torch.Tensor] = torch.zeros_like(weight) if with_state else None
        self.device = torch.device("cpu")
        dim = weight.shape[1]
        self.cache_weight = torch.zeros(cache_rows, dim, dtype=weight.dtype)
        self.cache_state: Optional[torch.Tensor] = torch.zeros(cache_rows, dim) if with_state else None
        self.resident_ids = torch.full((cache_rows,), -1, dtype=torch.int64)  # slot -> row it holds, -1: free
        self.resident_slot = torch.full((weight.shape[0],), -1, dtype=torch.int64)  # row -> slot, -1: on host
        self.batches_swapped = 0
        self.pending_late: Optional[SwapPlan] = None  # the swapped batch whose late part has not run yet
        self.lock = threading.Lock()

    def __getstate__(self) -> Dict[str, Any]:
        """For copy.deepcopy and pickling: everything but the lock (a copy gets a new one)."""
        state = dict(self.__dict__)
        del state["lock"]
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()

    @property
    def on_accelerator(self) -> bool:
        return self.device.type != "cpu"

    def attach(self, device: torch.device) -> None:
        """Put the cache on ``device`` (its contents move along); pin the host rows when it is an accelerator."""
        with self.lock:
            if device == self.device:
                return
            self.cache_weight = self.cache_weight.to(device)
            if self.cache_state is not None:
                self.cache_state = self.cache_state.to(device)
            if device.type == "cuda" and not self.host_weight.is_pinned():
                self.host_weight = self.host_weight.pin_memory()
                if self.host_state is not None:
                    self.host_state = self.host_state.pin_memory()
            self.device = device

    # -- the swap -------------------------------------------------------------------------------

    def swap(self, plan: SwapPlan) -> None:
        """Swap out ``plan``'s evicted rows and swap in its incoming ones (on the current stream), but its late part."""
        with self.lock:
            if plan.batch != self.batches_swapped or self.pending_late is not None:
                raise RuntimeError(f"table {plan.table!r}: the swap of batch {plan.batch} ran after "
                                   f"{self.batches_swapped} swaps (late part pending: "
                                   f"{self.pending_late is not None}); swaps must run in the order they were planned")
            self._move(plan, slice(0, plan.num_evicted - plan.num_late), slice(0, plan.num_loaded - plan.num_late))
            self.batches_swapped += 1
            self.pending_late = plan if plan.num_late else None

    def finish_swap(self, plan: SwapPlan) -> None:
        """The late part of ``plan``'s swap, if it has one (after the previous batch's update, on the current
        stream)."""
        if not plan.num_late:
            return
        with self.lock:
            if self.pending_late is not plan:
                raise RuntimeError(f"table {plan.table!r}: the late part of batch {plan.batch}'s swap ran out of "
                                   f"order (after {self.batches_swapped} swaps); it must follow that batch's swap")
            self._move(plan, slice(plan.num_evicted - plan.num_late, None),
                       slice(plan.num_loaded - plan.num_late, None))
            self.pending_late = None

    def _move(self, plan: SwapPlan, evicted: slice, loaded: slice) -> None:
        evict_ids, evict_slots = plan.evict_ids[evicted], plan.evict_slots[evicted]
        load_ids, load_slots = plan.load_ids[loaded], plan.load_slots[loaded]
        if evict_ids.numel():
            self._swap_out(evict_ids, evict_slots)
        if load_ids.numel():
            self._swap_in(load_ids, load_slots)
        self.resident_slot[evict_ids] = -1
        self.resident_ids[load_slots] = load_ids
        self.resident_slot[load_ids] = load_slots

    def forget_pending(self) -> None:
        """A run ended: a late part that never ran is dropped (its rows stay where they are)."""
        with self.lock:
            self.pending_late = None

    def _swap_out(self, ids: torch.Tensor, slots: torch.Tensor) -> None:
        on_device = slots.to(self.device, non_blocking=True)
        for cached, host in self._pairs():
            rows = cached.index_select(0, on_device)
            if self.on_accelerator:
                rows = rows.to("cpu")  # waits for the gather on this stream
            host.index_copy_(0, ids, rows)

    def _swap_in(self, ids: torch.Tensor, slots: torch.Tensor) -> None:
        on_device = slots.to(self.device, non_blocking=True)
        for cached, host in self._pairs():
            if self.on_accelerator:
                staged = torch.empty((ids.numel(), host.shape[1]), dtype=host.dtype, pin_memory=True)
                torch.index_select(host, 0, ids, out=staged)
                rows = staged.to(self.device, non_blocking=True)  # the pinned block is kept until the copy ran
            else:
                rows = host.index_select(0, ids)
            cached.index_copy_(0, on_device, rows)

    def _pairs(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        pairs = [(self.cache_weight, self.host_weight)]
        if self.cache_state is not None and self.host_state is not None:
            pairs.append((self.cache_state, self.host_state))
        return pairs

    # -- the training step's access -----------------------------------------------------------

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        """A copy of the rows in ``slots`` (device indices), for one batch."""
        return self.cache_weight.index_select(0, slots)

    def gather_state(self, slots: torch.Tensor) -> Optional[torch.Tensor]:
        """A copy of the optimizer state of the rows in ``slots`` (None without state)."""
        return self.cache_state.index_select(0, slots) if self.cache_state is not None else None

    def write(self, slots: torch.Tensor, rows: torch.Tensor, state: Optional[torch.Tensor]) -> None:
        """Write one batch's updated rows (and state) back into their slots."""
        self.cache_weight.index_copy_(0, slots, rows)
        if self.cache_state is not None and state is not None:
            self.cache_state.index_copy_(0, slots, state)

    def keep_for_stream(self, *tensors: torch.Tensor) -> None:
        """Tell the caching allocator that the current stream uses these (made on the swap stream)."""
        if self.device.type != "cuda":
            return
        stream = torch.cuda.current_stream(self.device)
        for tensor in tensors:
            tensor.record_stream(stream)

    # -- whole-table views ------------------------------------------------------------------------

    def _merged(self, host: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
        """``host`` with the resident rows replaced by their cached values (a new host tensor)."""
        if self.on_accelerator:
            torch.accelerator.synchronize(self.device.index)
        merged = host.clone()
        slots = (self.resident_ids >= 0).nonzero().squeeze(1)
        merged[self.resident_ids[slots]] = cached.index_select(0, slots.to(self.device)).to("cpu")
        return merged

    def full_weight(self) -> torch.Tensor:
        with self.lock:
            return self._merged(self.host_weight, self.cache_weight)

    def full_state(self) -> Optional[torch.Tensor]:
        with self.lock:
            if self.host_state is None or self.cache_state is None:
                return None
            return self._merged(self.host_state, self.cache_state)

    def lookup(self, unique_ids: torch.Tensor) -> torch.Tensor:
        """The current rows of ``unique_ids`` (host ids), on the cache's device."""
        with self.lock:
            rows = self.host_weight.index_select(0, unique_ids).to(self.device)
            slots = self.resident_slot.index_select(0, unique_ids)
            cached = (slots >= 0).nonzero().squeeze(1)
            if cached.numel():
                at = cached.to(self.device)
                rows.index_copy_(0, at, self.cache_weight.index_select(0, slots[cached].to(self.device)))
            return rows

    def load(self, weight: Optional[torch.Tensor], state: Optional[torch.Tensor]) -> None:
        """Empty the cache (writing its rows back) and then set the whole table's rows and/or state."""
        with self.lock:
            slots = (self.resident_ids >= 0).nonzero().squeeze(1)
            if slots.numel():
                self._swap_out(self.resident_ids[slots], slots)
            self.resident_slot.fill_(-1)
            self.resident_ids.fill_(-1)
            self.pending_late = None
            if weight is not None:
                self.host_weight.copy_(weight)
            if state is not None and self.host_state is not None:
                self.host_state.copy_(state)
