"""What each task of the two plans does to one cell: partition ``k`` on micro-batch ``m``.

A pass over one mini-batch is a ``MiniBatch``: the settings every task reads (grad
mode, which micro-batches are checkpointed, who needs gradients), the
``MicroBatch`` records the engine hands the tasks as batches, and the gradient
sums. Partition ``k`` keeps a ``Cell`` per micro-batch between forward and backward.

Forward, in micro-batch order::

    Copy{k}(m)       activations of partition k-1 -> partition k's device     (stream copy{k})
    Forward{k}(m)    leaves <- activations; outputs <- partition k(leaves)    (stream compute{k})

Backward, in reverse micro-batch order::

    Recompute{k}(m)  checkpointed cells only: outputs <- partition k(leaves), graph recorded
    CopyGrad{k}(m)   gradients of partition k+1's inputs -> partition k's device
    Backward{k}(m)   autograd.grad(outputs -> leaves and parameters); parameter
                     gradients are summed per partition, in the order the micro-batches
                     come (m = chunks-1 first)

Each cell's graph starts at its own leaves: its detached inputs, and detached
aliases of the partition's parameters (the partition is called through
``torch.func.functional_call`` with them). So a partition's backward never reaches
into another partition's graph, the gradient crossing the boundary as a tensor (by
``CopyGrad``) like the activations in forward; and it never reaches the parameters
themselves, so their hooks and ``.grad`` see only the summed gradient that the
gathered output's autograd node hands autograd, once per backward.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.func import functional_call

from .checkpoint import checkpointing, enter, make_leaves, modified_in_place, recomputing, versions
from .microbatch import Tensors, from_tuple, to_tuple
from .randomness import CellRandomness, RunSeed
from .streams import PartitionStreams

__all__: List[str] = []

Grads = Tuple[Optional[Tensor], ...]


@dataclass(eq=False)
class Cell:
    """Partition ``k`` on one micro-batch, between its forward and its backward."""

    leaves: Tensors  # the partition's inputs, detached; those that need a gradient require grad
    atomic: bool  # whether the partition was called with one tensor (else with the tuple)
    outputs: Tensors  # what it returned, with its graph (empty for a checkpointed cell until recomputed)
    param_leaves: Tensors  # the aliases of the parameters the graph was recorded with
    checkpointed: bool
    leaf_versions: Tuple[int, ...]  # the leaves' version counters after the forward
    changed_in_forward: Optional[int] = None  # a checkpointed forward wrote to this input in place


class GradSum:
    """A running sum of one parameter's gradients, added in the order they come.

    The first gradient is kept as autograd returned it (it may be a view of another
    tensor); the second makes a tensor of our own; later ones are added to it in place,
    so a pass allocates one sum per parameter, not one per micro-batch.
    """

    __slots__ = ("total", "owned")

    def __init__(self) -> None:
        self.total: Optional[Tensor] = None
        self.owned = False

    def add(self, grad: Tensor) -> None:
        if self.total is None:
            self.total = grad
        elif self.owned:
            self.total.add_(grad)
        else:
            self.total, self.owned = self.total + grad, True


@dataclass(eq=False)
class MicroBatch:
    """One micro-batch: what the engine hands every task of its iteration as ``ctx.batch``."""

    index: int
    mini: "MiniBatch"
    value: Tensors  # what lies at the current boundary: the input, then each partition's output (detached)
    atomic: bool
    cells: List[Cell] = field(default_factory=list)
    grad: Grads = ()  # backward: the gradient at the current boundary


@dataclass(eq=False)
class MiniBatch:
    """One forward pass over a mini-batch (and later its backward)."""

    inputs: Tensors  # the mini-batch as the caller gave it
    partitions: Sequence[nn.Module]
    devices: Sequence[torch.device]
    streams: PartitionStreams
    grad_enabled: bool
    checkpoint_stop: int  # micro-batches below this index are checkpointed
    needs_grad: List[bool]  # per partition: whether gradients flow into its input
    params: List[List[nn.Parameter]]  # per partition: the parameters that receive gradients
    param_names: List[List[str]]  # their names in the partition
    seed: Optional[RunSeed]  # training mode: every cell draws from its own generator
    autocast: Tuple[Tuple[str, torch.dtype], ...]  # the caller's enabled autocast regions: (device type, dtype)
    micro_batches: List[MicroBatch] = field(default_factory=list)
    output_atomic: bool = True  # whether the last partition returned a tensor (else a tuple)
    grad_sums: List[List[GradSum]] = field(default_factory=list)

    @property
    def records_graph(self) -> bool:
        """Whether a backward pass can follow (some input or parameter receives gradients)."""
        return self.needs_grad[-1] or bool(self.params[-1])

    def cell_state(self, micro_batch: int, partition: int) -> contextlib.ExitStack:
        """The caller's autocast regions, and the cell's own random numbers, for a cell's (re)computation.

        Grad mode is set by each step itself (it differs between forward and recompute). Autocast
        caches no weight casts: torch's cache is one for the whole process, and a recomputation runs
        on autograd's thread while other partitions run on theirs.
        """
        stack = contextlib.ExitStack()
        for device_type, dtype in self.autocast:
            stack.enter_context(torch.autocast(device_type, dtype=dtype, cache_enabled=False))
        if self.seed is not None:
            stack.enter_context(CellRandomness(self.seed, micro_batch, partition))
        return stack

    def call(self, k: int, inputs: Tensors, atomic: bool) -> Tuple[Any, Tensors]:
        """Partition k on ``inputs``; with a graph, through fresh parameter aliases (also returned)."""
        partition, value = self.partitions[k], from_tuple(inputs, atomic)
        if not (self.params[k] and torch.is_grad_enabled()):
            return partition(value), ()
        aliases = tuple(p.detach().requires_grad_() for p in self.params[k])
        return functional_call(partition, dict(zip(self.param_names[k], aliases)), (value,)), aliases


def copy_cell(mb: MicroBatch, k: int) -> None:
    """Copy{k}: bring the activations to partition k's device."""
    mini = mb.mini
    mb.value = tuple(t for t in mini.streams.move(mb.value, mini.devices[k], k) if t is not None)


def forward_cell(mb: MicroBatch, k: int) -> None:
    """Forward{k}: run partition k on the micro-batch, checkpointed or not; keep the cell for backward."""
    mini = mb.mini
    flowing = mini.needs_grad[k]
    leaves = make_leaves(mb.value, (lambda t: t.requires_grad) if k == 0 else (lambda t: flowing))
    checkpointed = mb.index < mini.checkpoint_stop
    changed: Optional[int] = None
    with mini.cell_state(mb.index, k):
        if checkpointed:
            with torch.no_grad(), checkpointing():
                before = versions(leaves)
                result, aliases = mini.call(k, leaves, mb.atomic)
            changed = modified_in_place(leaves, before)  # refused by the recomputation (as torchgpipe does)
        else:
            with torch.set_grad_enabled(mini.grad_enabled):
                result, aliases = mini.call(k, enter(leaves), mb.atomic)
    outputs, atomic = to_tuple(result, f"partition {k} (micro-batch {mb.index}) returned")
    if mini.grad_enabled:
        kept = () if checkpointed else outputs
        mb.cells.append(Cell(leaves, mb.atomic, kept, aliases, checkpointed, versions(leaves), changed))
    mb.value, mb.atomic = tuple(t.detach() for t in outputs), atomic


def recompute_cell(mb: MicroBatch, k: int) -> None:
    """Recompute{k}: for a checkpointed cell, run partition k again, recording the graph."""
    cell = mb.cells[k]
    if not cell.checkpointed:
        return
    if cell.changed_in_forward is not None:
        raise _changed_in_forward(cell, cell.changed_in_forward, k, mb.index)
    _check_unmodified(cell.leaves, cell.leaf_versions, k, mb.index, "between its forward and its backward",
                      "change the input (or the tensor it came from) only after backward, or clone it first")
    mini = mb.mini
    with mini.cell_state(mb.index, k), torch.enable_grad(), recomputing():
        result, cell.param_leaves = mini.call(k, enter(cell.leaves), cell.atomic)
    cell.outputs = to_tuple(result, f"partition {k} (micro-batch {mb.index}) returned, when recomputed,")[0]


def copy_grad_cell(mb: MicroBatch, k: int) -> None:
    """CopyGrad{k}: bring the gradient of partition k+1's input to partition k's device."""
    mini = mb.mini
    mb.grad = mini.streams.move(mb.grad, mini.devices[k], k)


def backward_cell(mb: MicroBatch, k: int) -> None:
    """Backward{k}: backpropagate the cell; add its parameter gradients to the partition's sums."""
    mini, cell = mb.mini, mb.cells[k]
    pairs = [(y, g) for y, g in zip(cell.outputs, mb.grad) if g is not None and y.requires_grad]
    wanted = [position for position, leaf in enumerate(cell.leaves) if leaf.requires_grad]
    targets = [cell.leaves[p] for p in wanted] + list(cell.param_leaves)
    grads: Sequence[Optional[Tensor]] = (None,) * len(targets)
    if pairs and targets:
        grads = torch.autograd.grad([y for y, _ in pairs], targets, [g for _, g in pairs], allow_unused=True)
    input_grads: List[Optional[Tensor]] = [None] * len(cell.leaves)
    for position, grad in zip(wanted, grads):
        input_grads[position] = grad if grad is not None or k > 0 else torch.zeros_like(cell.leaves[position])
    for total, grad in zip(mini.grad_sums[k], grads[len(wanted):]):
        if grad is not None:
            total.add(grad)
    mb.grad = tuple(input_grads)
    cell.leaves, cell.outputs, cell.param_leaves = (), (), ()  # the cell is done: free its activations now


def _changed_in_forward(cell: Cell, position: int, k: int, m: int) -> RuntimeError:
    """The error for a checkpointed cell whose forward wrote to its input: it cannot be recomputed from it."""
    # torch's own words for the same operation on the recomputation's leaf, which torchgpipe raises here
    torch_words = ("a leaf Variable that requires grad is being used in an in-place operation: "
                   if cell.leaves[position].requires_grad else "")
    return RuntimeError(f"{torch_words}input {position} of partition {k} (micro-batch {m}) was modified in place "
                        f"during its checkpointed forward, and its recomputation in backward needs that input as it "
                        f"was; make the layer that writes to it out-of-place (e.g. ReLU(inplace=False) as a "
                        f"partition's first layer), or use checkpoint='never'")


def _check_unmodified(leaves: Tensors, before: Tuple[int, ...], k: int, m: int, when: str, fix: str) -> None:
    position = modified_in_place(leaves, before)
    if position is not None:
        raise RuntimeError(f"input {position} of partition {k} (micro-batch {m}) was modified in place {when}; a "
                           f"checkpointed partition is recomputed from its input, which must stay as it was: {fix}")
