"""GPipe's forward and backward passes as two PipelinePlans: an iteration is a micro-batch.

Forward: partition ``k`` is at stage ``k``, so the clock-driven engine runs it on
micro-batch ``m`` in period ``m + k``: GPipe's clock cycle. Each partition has its
own thread group (``partition{k}``) and streams (``compute{k}``, ``copy{k}``)::

    period         0      1      2      3      4      5          (n = 3 partitions, 4 micro-batches)
    partition 0    F0(0)  F0(1)  F0(2)  F0(3)
    partition 1           F1(0)  F1(1)  F1(2)  F1(3)
    partition 2                  F2(0)  F2(1)  F2(2)  F2(3)

    Forward{k}(m) <- Copy{k}(m) <- Forward{k-1}(m)        (intra-iteration dependencies)

Backward: the iterations are the micro-batches in reverse order (iteration ``r`` is
micro-batch ``chunks-1-r``) and partition ``k`` is at stage ``n-1-k``, so gradients
flow from the last partition to the first on the same kind of clock. A
checkpointed cell is recomputed one stage *before* its backward (stage ``n-2-k``),
while the partition after it is still backpropagating the same micro-batch, so the
gradient does not wait for the recomputation::

    period         0              1              2              3           (4 micro-batches;
    partition 2    R2(3) B2(3)    R2(2) B2(2)    R2(1) B2(1)    R2(0) B2(0)  R = Recompute,
    partition 1    R1(3)          B1(3) R1(2)    B1(2) R1(1)    B1(1) R1(0)  B = Backward)
    partition 0                   R0(3)          B0(3) R0(2)    B0(2) R0(1)  ...

    Backward{k}(m) <- CopyGrad{k}(m) <- Backward{k+1}(m);  Backward{k}(m) <- Recompute{k}(m)

On one stream a period runs its older iteration first, so partition ``k`` runs
``B{k}(m)`` before ``R{k}(m-1)``. Parameter gradients are summed by each partition's
own task, micro-batch ``chunks-1`` first: the order in which torchgpipe's autograd
graph accumulates them.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Dict, List, Optional, Tuple

from ..plan.context import IterContext
from ..plan.model import PipelinePlan, PipelineTask, TaskSchedule
from .cells import backward_cell, copy_cell, copy_grad_cell, forward_cell, recompute_cell
from .streams import compute_stream, copy_stream

__all__: List[str] = []

CellStep = Callable[..., None]


def thread_group(partition: int) -> str:
    return f"partition{partition}"


def _run_step(step: CellStep, k: int, ctx: IterContext) -> None:
    try:
        step(ctx.batch, k)
    except Exception as exc:  # name the cell: in backward the engine's iteration is not the micro-batch
        try:
            exc.add_note(f"swpipeline.gpipe: in partition {k}, micro-batch {ctx.batch.index}")
        except Exception:  # an exception that refuses notes is raised as it is
            pass
        raise


def _task(name: str, step: CellStep, k: int) -> PipelineTask:
    return PipelineTask(name, partial(_run_step, step, k))


def forward_plan(num_partitions: int) -> PipelinePlan:
    """Copy{k} and Forward{k} at stage k for every partition k (no Copy0: the input is used where it is)."""
    schedule: Dict[PipelineTask, TaskSchedule] = {}
    intra: List[Tuple[PipelineTask, PipelineTask]] = []
    previous: Optional[PipelineTask] = None
    for k in range(num_partitions):
        forward = _task(f"Forward{k}", forward_cell, k)
        if previous is not None:
            copy = _task(f"Copy{k}", copy_cell, k)
            schedule[copy] = TaskSchedule(stage=k, stream=copy_stream(k), thread_group=thread_group(k))
            intra += [(copy, previous), (forward, copy)]
        schedule[forward] = TaskSchedule(stage=k, stream=compute_stream(k), thread_group=thread_group(k))
        previous = forward
    return PipelinePlan(schedule=schedule, intra_iter_deps=intra)


def backward_plan(num_partitions: int, one_thread: Optional[str] = None) -> PipelinePlan:
    """Recompute{k}, CopyGrad{k} and Backward{k} for every partition k, the last partition at stage 0.

    Args:
        num_partitions: how many partitions.
        one_thread: put every task on this thread group (for an accelerator: the autograd
            engine's device thread must run them, see ``GPipe``); None: one per partition.
    """
    last = num_partitions - 1
    schedule: Dict[PipelineTask, TaskSchedule] = {}
    intra: List[Tuple[PipelineTask, PipelineTask]] = []
    later: Optional[PipelineTask] = None
    for k in range(last, -1, -1):
        group = one_thread or thread_group(k)
        stage = last - k
        recompute = _task(f"Recompute{k}", recompute_cell, k)
        backward = _task(f"Backward{k}", backward_cell, k)
        schedule[recompute] = TaskSchedule(stage=max(stage - 1, 0), stream=compute_stream(k), thread_group=group)
        if later is not None:
            copy = _task(f"CopyGrad{k}", copy_grad_cell, k)
            schedule[copy] = TaskSchedule(stage=stage, stream=copy_stream(k), thread_group=group)
            intra += [(copy, later), (backward, copy)]
        schedule[backward] = TaskSchedule(stage=stage, stream=compute_stream(k), thread_group=group)
        intra.append((backward, recompute))
        later = backward
    return PipelinePlan(schedule=schedule, intra_iter_deps=intra)
