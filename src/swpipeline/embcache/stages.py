"""The embedding-cache training pipeline as a plan: its tasks, stages, streams, threads and dependencies.

Five stages, each batch moving one stage per period (the input dist only with a
process group; without one the plan has four)::

    stage  task(s)                                        thread      stream
    0      H2D           batch to the device              prep        memcpy
    1      InputDist     exchange the ids between ranks   dist        data_dist
    2      ComputeSwap   which rows to swap in and out    prep        swap_plan
    3      Swap          move the rows: cache <-> host    swap        swap
    4      ZeroGrad Lookup Forward Backward SparseUpdate DenseStep
                         gather the batch's rows from the cache, train, update them in place
                                                          default     default

In one period the swap of batch i+1 runs on its own thread and stream while batch i
trains, and the next batches are copied and their swap plans computed on a third
thread (``prep``), so the training thread does nothing but train::

    period p     default:   ZeroGrad(i) Lookup(i) Forward(i) Backward(i) SparseUpdate(i) DenseStep(i)
                 swap:                  |-> Swap(i+1) ..........................
                 prep:      H2D(i+3) ComputeSwap(i+2) ......

The dependencies that make this exact (besides each batch's chain through its stages):

* ``Lookup(i+1)`` after ``SparseUpdate(i)``: batch i+1 gathers its rows, those it
  shares with batch i included, only once batch i's update has been written into the
  cache. Batch i+1's swap never moves a row that batch i uses (the directory pins
  them, ``directory.py``), so the rows the two batches share stay in the cache and
  this is how batch i+1 sees batch i's updates of them.
* ``Swap(i+1)`` after ``Lookup(i)``: the swap of batch i+1 starts once batch i has
  gathered its rows, which it did after batch i-1's update; so every row the swap
  writes back has its last update (from batch i-1 or earlier) in it, and no row it
  overwrites is still to be read.
* ``ZeroGrad(i+1)`` after ``DenseStep(i)``: the dense optimizer steps in batch order.
* ``DenseStep(i)`` after ``SparseUpdate(i)`` (the same thread and stream, so it costs no
  wait): a step's updates land in the same order in every engine and in ``run_serial``,
  tables first, which is what lets ``steps.py`` keep every step whole.

On a GPU each pair across streams is an event wait, so the swap stream waits for
Lookup(i) only, never for the rest of batch i's compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ..plan.context import IterContext
from ..plan.model import PipelinePlan, PipelineTask, TaskSchedule

__all__: List[str] = []

TaskFn = Callable[[IterContext], None]

TRAIN_TASKS = ("ZeroGrad", "Lookup", "Forward", "Backward", "SparseUpdate", "DenseStep")


@dataclass(frozen=True)
class TaskRow:
    """One task of the plan: where and when it runs."""

    name: str
    stage: int
    stream: Optional[str]  # a stream role; None: the default stream
    thread_group: str
    globally_ordered: bool = False


def task_rows(input_dist: bool) -> List[TaskRow]:
    """The plan's tasks; with ``input_dist`` the InputDist stage is there and the later stages move one down."""
    d = 1 if input_dist else 0
    rows = [TaskRow("H2D", 0, "memcpy", "prep")]
    if input_dist:
        rows.append(TaskRow("InputDist", 1, "data_dist", "dist", globally_ordered=True))
    rows += [TaskRow("ComputeSwap", 1 + d, "swap_plan", "prep"), TaskRow("Swap", 2 + d, "swap", "swap")]
    rows += [TaskRow(name, 3 + d, None, "default", globally_ordered=input_dist and name == "SparseUpdate")
             for name in TRAIN_TASKS]
    return rows


def stage_labels(input_dist: bool) -> List[Tuple[str, Sequence[str]]]:
    """(stage label, its tasks), in stage order: the rows of the statistics' time-per-stage table."""
    labels = [("batch to device", ("H2D",))]
    if input_dist:
        labels.append(("input dist", ("InputDist",)))
    return labels + [("compute swap", ("ComputeSwap",)), ("swap", ("Swap",)), ("forward/backward/update", TRAIN_TASKS)]


INTRA: Tuple[Tuple[str, str], ...] = (
    ("Swap", "ComputeSwap"), ("Lookup", "Swap"), ("Forward", "ZeroGrad"), ("Forward", "Lookup"), ("Forward", "H2D"),
    ("Backward", "Forward"), ("SparseUpdate", "Backward"),
    ("DenseStep", "SparseUpdate"),  # a step's updates land in one order everywhere: the tables, then the dense layers
)
INTER: Tuple[Tuple[str, str], ...] = (
    ("Lookup", "SparseUpdate"),  # batch i+1 sees batch i's updates of the rows they share
    ("Swap", "Lookup"),  # batch i+1's swap moves only rows whose updates are all done
    ("ZeroGrad", "DenseStep"),
)


def build_plan(fn: Callable[[str], TaskFn], stream: Callable[[Optional[str]], Any], input_dist: bool) -> PipelinePlan:
    """The PipelinePlan: ``fn(name)`` gives each task's function, ``stream(role)`` its ``TaskSchedule.stream``."""
    rows = task_rows(input_dist)
    tasks = {row.name: PipelineTask(row.name, fn(row.name)) for row in rows}
    schedule = {tasks[row.name]: TaskSchedule(stage=row.stage, stream=stream(row.stream), thread_group=row.thread_group,
                                              globally_ordered=row.globally_ordered) for row in rows}
    intra = list(INTRA) + ([("ComputeSwap", "InputDist")] if input_dist else [])
    return PipelinePlan(schedule=schedule, intra_iter_deps=[(tasks[t], tasks[d]) for t, d in intra],
                        inter_iter_deps=[(tasks[t], tasks[d]) for t, d in INTER])
