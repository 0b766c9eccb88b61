"""Every TorchRec training pipeline as a PipelinePlan: plain data, one entry per variant.

Each ``PlanSpec`` puts TorchRec's step functions (tasks) at the stage of the
batch they work on in TorchRec's ``progress()``, on TorchRec's streams and thread
groups (with ``globally_ordered`` flags), chained in TorchRec's order. Where a
plan adds to that plain assignment or changes it, the reason is that the engine
would otherwise not run TorchRec's steps in TorchRec's order
(docs/torchrec.md marks each with a delta):

* PT2, EvalSparseDist, EvalFusedSparseDist: the chains TorchRec's ``progress()``
  follows are declared as dependencies. The stages alone order nothing across
  streams and thread groups, and within one stage and stream they would leave the
  order to the order the tasks happen to be listed in.
* SemiSync: ``EmbLookup`` is at stage 1, two stages below the embedding update
  (EmbBackward, stage 3), with no inter-iteration pair. TorchRec's semi-sync looks
  batch i+1 up *before* batch i's embedding update and after batch i-1's. On one
  stream the engine runs each period's older iterations first (stage-descending),
  on both engines, whatever the tasks are called, so a lookup one stage below the
  update would follow the previous batch's update (synchronous training); two
  stages below, it runs in the period before. The order follows from the stages
  alone, with nothing left to a tie between task names.
* SparseDist, FusedSparseDist, CompAutograd: ``InputDistWait(i)`` after
  ``WaitBatch(i-1)``, an ordering pair that puts InputDistWait(i+1) right after
  Forward(i) as in TorchRec; without it the ready-first order puts it before
  Forward(i), where its wait for the splits cannot overlap anything.
* FusedSparseDist: ``WaitBatch(i)`` after ``H2D(i)``. WaitBatch reads the batch
  copied on the memcpy stream (TorchRec's step waits for that stream there); no other
  chain orders it after the copy, which would race with ``H2D`` on a thread group of
  its own, and on an accelerator wait for no event.
* ``enqueue_batch_after_forward``: H2D(i) then runs after Forward(i-1), so it
  moves to stage 1 (the engine's dependencies reach one iteration back; TorchRec
  copies batch i+2 after forward i, two back).

tests/torchrec/test_torchrec_plans.py checks the print_schedule tables of the default plans.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from ..plan.context import IterContext
from ..plan.model import PipelinePlan, PipelineTask, TaskSchedule

__all__: List[str] = []

# (task, stage, stream role or None for the default stream, globally_ordered)
TaskRow = Tuple[str, int, Optional[str], bool]
Pair = Tuple[str, str]


@dataclass(frozen=True)
class PlanSpec:
    """A pipeline variant as data: its tasks and their schedule, and the dependencies between them."""

    tasks: Tuple[TaskRow, ...]
    intra: Tuple[Pair, ...] = ()
    inter: Tuple[Pair, ...] = ()
    thread_groups: Mapping[str, str] = field(default_factory=dict)

    @property
    def task_names(self) -> List[str]:
        return [row[0] for row in self.tasks]

    def with_thread_groups(self, groups: Mapping[str, str]) -> "PlanSpec":
        return replace(self, thread_groups={**self.thread_groups, **groups})

    def with_role(self, task: str, role: Optional[str]) -> "PlanSpec":
        """The same plan with ``task`` on another stream role."""
        rows = tuple((n, s, role if n == task else r, o) for n, s, r, o in self.tasks)
        return replace(self, tasks=rows)

    def h2d_after_forward(self) -> "PlanSpec":
        """``enqueue_batch_after_forward``: H2D(i) waits for Forward(i-1), one stage later (stage 1)."""
        rows = tuple((n, 1 if n == "H2D" else s, r, o) for n, s, r, o in self.tasks)
        return replace(self, tasks=rows, inter=self.inter + (("H2D", "Forward"),))

    def build(self, fn: Callable[[str], Callable[[IterContext], None]],
              stream: Callable[[Optional[str]], object]) -> PipelinePlan:
        """The PipelinePlan: ``fn(name)`` gives each task's function, ``stream(role)`` its TaskSchedule.stream."""
        tasks = {name: PipelineTask(name, fn(name)) for name in self.task_names}
        schedule = {
            tasks[name]: TaskSchedule(stage=stage, stream=stream(role),
                                      thread_group=self.thread_groups.get(name, "default"), globally_ordered=ordered)
            for name, stage, role, ordered in self.tasks
        }
        return PipelinePlan(schedule=schedule, intra_iter_deps=[(tasks[t], tasks[d]) for t, d in self.intra],
                            inter_iter_deps=[(tasks[t], tasks[d]) for t, d in self.inter])


_STEP: Tuple[Pair, ...] = (("Forward", "WaitBatch"), ("Backward", "Forward"), ("OptimizerStep", "Backward"))

BASE = PlanSpec(
    tasks=(("H2D", 0, "memcpy", False), ("ZeroGrad", 1, None, False), ("WaitBatch", 1, None, False),
           ("Forward", 1, None, False), ("Backward", 1, None, False), ("OptimizerStep", 1, None, False)),
    intra=(("WaitBatch", "H2D"), ("WaitBatch", "ZeroGrad")) + _STEP,
    inter=(("Forward", "OptimizerStep"),),
)

PT2 = PlanSpec(
    tasks=(("LoadBatch", 0, None, False), ("H2D", 0, None, False), ("InputTransform", 0, None, False),
           ("ZeroGrad", 0, None, False), ("Forward", 0, None, False), ("Backward", 0, None, False),
           ("OptimizerStep", 0, None, False)),
    intra=(("H2D", "LoadBatch"), ("InputTransform", "H2D"), ("ZeroGrad", "InputTransform"), ("Forward", "ZeroGrad"),
           ("Backward", "Forward"), ("OptimizerStep", "Backward")),
)

_SPARSE_DIST_TASKS: Tuple[TaskRow, ...] = (
    ("H2D", 0, "memcpy", False), ("InputDistStart", 1, "data_dist", True), ("InputDistWait", 1, "data_dist", False),
    ("ZeroGrad", 2, None, False), ("WaitBatch", 2, None, False), ("Forward", 2, None, False),
    ("Backward", 2, None, False), ("OptimizerStep", 2, None, False),
)
_SPARSE_DIST_INTRA: Tuple[Pair, ...] = (
    ("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"), ("WaitBatch", "InputDistWait"),
    ("Forward", "InputDistWait"), ("WaitBatch", "ZeroGrad"),
) + _STEP

# InputDistWait(i) after WaitBatch(i-1): an ordering pair. It puts InputDistWait(i+1) right after Forward(i)
# in the period, TorchRec's order, so the splits all-to-all of batch i+1 overlaps the forward of batch i.
_WAIT_AFTER_FORWARD: Tuple[Pair, ...] = (("InputDistWait", "WaitBatch"),)

SPARSE_DIST = PlanSpec(tasks=_SPARSE_DIST_TASKS, intra=_SPARSE_DIST_INTRA,
                       inter=(("Forward", "OptimizerStep"),) + _WAIT_AFTER_FORWARD)

SPARSE_DIST_LITE = PlanSpec(
    tasks=(("H2D", 0, "memcpy", False), ("ZeroGrad", 1, None, False), ("WaitBatch", 1, None, False),
           ("InputDistStart", 1, None, False), ("InputDistWait", 1, None, False), ("Forward", 1, None, False),
           ("Backward", 1, None, False), ("OptimizerStep", 1, None, False)),
    intra=(("WaitBatch", "H2D"), ("WaitBatch", "ZeroGrad"), ("InputDistStart", "WaitBatch"),
           ("InputDistWait", "InputDistStart"), ("Forward", "InputDistWait"), ("Backward", "Forward"),
           ("OptimizerStep", "Backward")),
    inter=(("Forward", "OptimizerStep"),),
)

FUSED_SPARSE_DIST = PlanSpec(
    tasks=(("H2D", 0, "memcpy", False), ("InputDistStart", 1, "data_dist", True),
           ("InputDistWait", 1, "data_dist", False), ("EmbLookup", 2, "emb_lookup", False),
           ("ZeroGrad", 2, None, False), ("WaitBatch", 2, None, False), ("Forward", 2, None, False),
           ("Backward", 2, None, False), ("OptimizerStep", 2, None, False)),
    intra=(("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"), ("EmbLookup", "InputDistWait"),
           ("Forward", "EmbLookup"), ("WaitBatch", "H2D"), ("WaitBatch", "ZeroGrad")) + _STEP,
    inter=(("EmbLookup", "Backward"), ("Forward", "OptimizerStep")) + _WAIT_AFTER_FORWARD,
)

# EmbLookup at stage 1, two stages before the embedding update (EmbBackward, stage 3), both on the default
# stream: EmbLookup(i+1) runs in the period before EmbBackward(i) and after EmbBackward(i-1), so batch i+1
# reads embeddings one update old, as TorchRec's semi-sync does (see the module docstring).
SEMI_SYNC = PlanSpec(
    tasks=(("H2D", 0, "memcpy", False), ("InputDistStart", 1, "data_dist", True),
           ("InputDistWait", 1, "data_dist", False), ("EmbLookup", 1, None, False), ("ZeroGrad", 3, None, False),
           ("Forward", 3, None, False), ("Backward", 3, None, False), ("EmbBackward", 3, None, False),
           ("OptimizerStep", 3, None, False)),
    intra=(("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"), ("EmbLookup", "InputDistWait"),
           ("Forward", "EmbLookup"), ("Forward", "ZeroGrad"), ("Backward", "Forward"), ("EmbBackward", "Backward"),
           ("OptimizerStep", "EmbBackward")),
)

PREFETCH = PlanSpec(
    tasks=(("H2D", 0, "memcpy", False), ("InputDistStart", 0, "data_dist", True),
           ("InputDistWait", 1, "data_dist", False), ("EmbPrefetch", 1, "prefetch", False),
           ("ZeroGrad", 2, None, False), ("WaitBatch", 2, None, False), ("Forward", 2, None, False),
           ("Backward", 2, None, False), ("OptimizerStep", 2, None, False)),
    intra=(("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"), ("EmbPrefetch", "InputDistWait"),
           ("WaitBatch", "EmbPrefetch"), ("WaitBatch", "ZeroGrad")) + _STEP,
    inter=(("EmbPrefetch", "Forward"), ("Forward", "OptimizerStep")),
)

EVAL_SPARSE_DIST = PlanSpec(
    tasks=(("H2D", 0, "memcpy", False), ("InputDistStart", 1, "data_dist", True),
           ("InputDistWait", 1, "data_dist", False), ("WaitBatch", 1, None, False), ("Forward", 1, None, False)),
    intra=(("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"), ("WaitBatch", "InputDistWait"),
           ("Forward", "WaitBatch")),
    thread_groups={"H2D": "loader"},
)

EVAL_FUSED_SPARSE_DIST = PlanSpec(
    tasks=(("H2D", 0, "memcpy", False), ("InputDistStart", 1, "data_dist", True),
           ("InputDistWait", 1, "data_dist", False), ("EmbLookup", 2, "emb_lookup", False),
           ("WaitBatch", 2, None, False), ("Forward", 2, None, False)),
    intra=(("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"), ("EmbLookup", "InputDistWait"),
           ("WaitBatch", "EmbLookup"), ("Forward", "WaitBatch")),
)

COMP_AUTOGRAD = PlanSpec(
    tasks=tuple((n, s, r, False) for n, s, r, _ in _SPARSE_DIST_TASKS),
    intra=_SPARSE_DIST_INTRA, inter=(("Forward", "OptimizerStep"),) + _WAIT_AFTER_FORWARD,
)

SPECS: Dict[str, PlanSpec] = {
    "Base": BASE, "PT2": PT2, "SparseDist": SPARSE_DIST, "SparseDistLite": SPARSE_DIST_LITE,
    "FusedSparseDist": FUSED_SPARSE_DIST, "SemiSync": SEMI_SYNC, "Prefetch": PREFETCH,
    "EvalSparseDist": EVAL_SPARSE_DIST, "EvalFusedSparseDist": EVAL_FUSED_SPARSE_DIST,
    "CompAutograd": COMP_AUTOGRAD,
}
