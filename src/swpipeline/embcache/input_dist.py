"""The input dist of a data-parallel run: every rank keeps the whole table and learns every rank's ids.

With a process group, each rank holds a full replica of every ``HostEmbeddingBag``
(host rows, optimizer state and its own cache) and trains on its own batches. For
the replicas to stay identical, every rank must update the same rows by the same
amounts in every step:

* ``exchange`` (the InputDist task): all-gather each table's ids, so that every rank
  plans its swap for the union of the step's ids across ranks; all ranks then make
  the same cache decisions, and each rank's lookup gathers the union's rows;
* ``reduce_grad`` (in the SparseUpdate task): all-reduce the union rows' gradient and
  divide by the number of ranks (the average, as DistributedDataParallel does for
  dense parameters), before the sparse update.

Both are collectives on the pipeline's process group, issued by two threads; their
tasks are ``globally_ordered``, so every rank issues them in the same order. Use a
process group of the pipeline's own (``torch.distributed.new_group()``), not the
one a DistributedDataParallel wrapper of the dense layers uses.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
import torch.distributed as dist

__all__: List[str] = []


class ReplicatedInputDist:
    """The collectives of a data-parallel embedding-cache run.

    Args:
        group: the process group (torch.distributed must be initialized).

    Raises:
        RuntimeError: torch.distributed is not initialized.
    """

    def __init__(self, group: Any) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("process_group given but torch.distributed is not initialized; call "
                               "torch.distributed.init_process_group first (or pass process_group=None)")
        self.group = group
        self.world_size = dist.get_world_size(group)

    def exchange(self, ids: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Each table's ids of every rank, concatenated in rank order (tables in name order on every rank)."""
        gathered = {}
        for name in sorted(ids):
            local = ids[name]
            count = torch.tensor([local.numel()], dtype=torch.int64)
            counts = [torch.empty_like(count) for _ in range(self.world_size)]
            dist.all_gather(counts, count, group=self.group)
            sizes = [int(c.item()) for c in counts]
            padded = torch.zeros(max(sizes), dtype=torch.int64)
            padded[:local.numel()] = local
            parts = [torch.empty_like(padded) for _ in range(self.world_size)]
            dist.all_gather(parts, padded, group=self.group)
            gathered[name] = torch.cat([part[:size] for part, size in zip(parts, sizes)])
        return gathered

    def reduce_grad(self, grad: torch.Tensor) -> None:
        """``grad`` (in place) := its average over the ranks."""
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=self.group)
        grad.div_(self.world_size)
