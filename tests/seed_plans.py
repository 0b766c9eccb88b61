"""The seed documents' pipelines as PipelinePlan builders, with the tables the seeds print for them.

Every builder follows seed 001 (``001_121b2acae0568298.txt``, "each TorchRec pipeline
as a PipelinePlan") literally: the same task names, stages, stream names, flags and
dependency lists, in the same declaration order. ``fused_sparse_dist_000`` is the
end-to-end example of seed 000, which differs from seed 001's FusedSparseDist only
in its inter-iteration dependencies.

By default a schedule is keyed by task *names*, which the library accepts for plans
that are only planned and printed. Pass ``make_fn`` (task name -> function of the
IterContext) to key it with ``PipelineTask`` objects instead, e.g. ``make_fn=noop``.

``SEED_TABLES`` holds the ``print_schedule`` outputs printed in the seeds, with the
whitespace collapsed exactly as the seeds (extracted from HTML) have it; compare
them token by token (``text.split()``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from swpipeline import IterContext, PipelinePlan, PipelineTask, TaskSchedule

__all__ = [
    "ALL_BUILDERS",
    "SEED_TABLES",
    "base",
    "build",
    "comp_autograd",
    "fused_sparse_dist",
    "fused_sparse_dist_000",
    "noop",
    "prefetch",
    "pt2",
    "semi_sync",
    "sparse_dist",
    "sparse_dist_lite",
    "sparse_dist_worked_example",
]

MakeFn = Callable[[str], Callable[[IterContext], Any]]
# (name, stage, stream, globally_ordered)
TaskSpec = Tuple[str, int, Optional[str], bool]
Pair = Tuple[str, str]


def noop(name: str) -> Callable[[IterContext], None]:
    """A ``make_fn`` whose tasks do nothing."""

    def fn(ctx: IterContext) -> None:
        return None

    fn.__name__ = f"noop_{name}"
    return fn


def build(tasks: Sequence[TaskSpec], intra: Sequence[Pair] = (), inter: Sequence[Pair] = (),
          pipeline_depth: Optional[int] = None, make_fn: Optional[MakeFn] = None,
          thread_groups: Optional[Dict[str, str]] = None) -> PipelinePlan:
    """A PipelinePlan from plain data; dependencies refer to the task objects when ``make_fn`` is given."""
    groups = thread_groups or {}
    keys: Dict[str, Any] = {}
    for name, _stage, _stream, _ordered in tasks:
        keys[name] = PipelineTask(name, make_fn(name)) if make_fn is not None else name
    schedule = {
        keys[name]: TaskSchedule(stage=stage, stream=stream, thread_group=groups.get(name, "default"),
                                 globally_ordered=ordered)
        for name, stage, stream, ordered in tasks
    }
    return PipelinePlan(
        schedule=schedule,
        intra_iter_deps=[(keys[t], keys[d]) for t, d in intra],
        inter_iter_deps=[(keys[t], keys[d]) for t, d in inter],
        pipeline_depth=pipeline_depth,
    )


# -- seed 001 -------------------------------------------------------------------------------------

def base(make_fn: Optional[MakeFn] = None) -> PipelinePlan:
    """TrainPipelineBase: depth 2, streams memcpy + default."""
    return build(
        [("H2D", 0, "memcpy", False),
         ("ZeroGrad", 1, "default", False),
         ("WaitBatch", 1, "default", False),
         ("Forward", 1, "default", False),
         ("Backward", 1, "default", False),
         ("OptimizerStep", 1, "default", False)],
        intra=[("WaitBatch", "H2D"), ("WaitBatch", "ZeroGrad"), ("Forward", "WaitBatch"),
               ("Backward", "Forward"), ("OptimizerStep", "Backward")],
        inter=[("Forward", "OptimizerStep")],
        pipeline_depth=2, make_fn=make_fn,
    )


def pt2(make_fn: Optional[MakeFn] = None) -> PipelinePlan:
    """TrainPipelinePT2: depth 1, default stream only, no dependencies declared (as in the seed)."""
    return build(
        [("LoadBatch", 0, "default", False),
         ("H2D", 0, "default", False),
         ("InputTransform", 0, "default", False),
         ("ZeroGrad", 0, "default", False),
         ("Forward", 0, "default", False),
         ("Backward", 0, "default", False),
         ("OptimizerStep", 0, "default", False)],
        pipeline_depth=1, make_fn=make_fn,
    )


_SPARSE_DIST_TASKS: List[TaskSpec] = [
    ("H2D", 0, "memcpy", False),
    ("InputDistStart", 1, "data_dist", True),
    ("InputDistWait", 1, "data_dist", False),
    ("ZeroGrad", 2, "default", False),
    ("WaitBatch", 2, "default", False),
    ("Forward", 2, "default", False),
    ("Backward", 2, "default", False),
    ("OptimizerStep", 2, "default", False),
]
_SPARSE_DIST_INTRA: List[Pair] = [
    ("InputDistStart", "H2D"),
    ("InputDistWait", "InputDistStart"),
    ("WaitBatch", "InputDistWait"),
    ("Forward", "InputDistWait"),
    ("WaitBatch", "ZeroGrad"),
    ("Forward", "WaitBatch"),
    ("Backward", "Forward"),
    ("OptimizerStep", "Backward"),
]


def sparse_dist(make_fn: Optional[MakeFn] = None) -> PipelinePlan:
    """TrainPipelineSparseDist: depth 3, streams memcpy, data_dist, default."""
    return build(_SPARSE_DIST_TASKS, _SPARSE_DIST_INTRA, [("Forward", "OptimizerStep")],
                 pipeline_depth=3, make_fn=make_fn)


def sparse_dist_worked_example(make_fn: Optional[MakeFn] = None) -> PipelinePlan:
    """Seed 000's ready-first worked example: SparseDist's 8 tasks, no inter_iter_deps."""
    return build(_SPARSE_DIST_TASKS, _SPARSE_DIST_INTRA, make_fn=make_fn)


def sparse_dist_lite(make_fn: Optional[MakeFn] = None) -> PipelinePlan:
    """TrainPipelineSparseDistLite: depth 2, InputDist on the default stream."""
    return build(
        [("H2D", 0, "memcpy", False),
         ("ZeroGrad", 1, "default", False),
         ("WaitBatch", 1, "default", False),
         ("InputDistStart", 1, "default", False),
         ("InputDistWait", 1, "default", False),
         ("Forward", 1, "default", False),
         ("Backward", 1, "default", False),
         ("OptimizerStep", 1, "default", False)],
        intra=[("WaitBatch", "H2D"), ("WaitBatch", "ZeroGrad"), ("InputDistStart", "WaitBatch"),
               ("InputDistWait", "InputDistStart"), ("Forward", "InputDistWait"), ("Backward", "Forward"),
               ("OptimizerStep", "Backward")],
        inter=[("Forward", "OptimizerStep")],
        pipeline_depth=2, make_fn=make_fn,
    )


_FUSED_TASKS: List[TaskSpec] = [
    ("H2D", 0, "memcpy", False),
    ("InputDistStart", 1, "data_dist", True),
    ("InputDistWait", 1, "data_dist", False),
    ("EmbLookup", 2, "emb_lookup", False),
    ("ZeroGrad", 2, "default", False),
    ("WaitBatch", 2, "default", False),
    ("Forward", 2, "default", False),
    ("Backward", 2, "default", False),
    ("OptimizerStep", 2, "default", False),
]
_FUSED_INTRA: List[Pair] = [
    ("InputDistStart", "H2D"),
    ("InputDistWait", "InputDistStart"),
    ("EmbLookup", "InputDistWait"),
    ("Forward", "EmbLookup"),
    ("WaitBatch", "ZeroGrad"),
    ("Forward", "WaitBatch"),
    ("Backward", "Forward"),
    ("OptimizerStep", "Backward"),
]


def fused_sparse_dist(make_fn: Optional[MakeFn] = None) -> PipelinePlan:
    """TrainPipelineFusedSparseDist (seed 001): depth 3, a separate emb_lookup stream."""
    return build(_FUSED_TASKS, _FUSED_INTRA, [("EmbLookup", "Backward"), ("Forward", "OptimizerStep")],
                 pipeline_depth=3, make_fn=make_fn)


def fused_sparse_dist_000(make_fn: Optional[MakeFn] = None) -> PipelinePlan:
    """Seed 000's end-to-end FusedSparseDist example (depth inferred; the seed's streams are named)."""
    return build(
        [("H2D", 0, "memcpy", False),
         ("InputDistStart", 1, "data_dist", True),
         ("InputDistWait", 1, "data_dist", False),
         ("EmbLookup", 2, "emb_lookup", False),
         ("ZeroGrad", 2, None, False),
         ("WaitBatch", 2, None, False),
         ("Forward", 2, None, False),
         ("Backward", 2, None, False),
         ("OptimizerStep", 2, None, False)],
        intra=[("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"), ("EmbLookup", "InputDistWait"),
               ("Forward", "EmbLookup"), ("WaitBatch", "ZeroGrad"), ("Forward", "WaitBatch"),
               ("Backward", "Forward"), ("OptimizerStep", "Backward")],
        inter=[("EmbLookup", "Backward")],
        make_fn=make_fn,
    )


def semi_sync(make_fn: Optional[MakeFn] = None) -> PipelinePlan:
    """TrainPipelineSemiSync: depth 4 (the seed prints it with print_schedule(6))."""
    return build(
        [("H2D", 0, "memcpy", False),
         ("InputDistStart", 1, "data_dist", True),
         ("InputDistWait", 1, "data_dist", False),
         ("EmbLookup", 2, "default", False),
         ("ZeroGrad", 3, "default", False),
         ("Forward", 3, "default", False),
         ("Backward", 3, "default", False),
         ("EmbBackward", 3, "default", False),
         ("OptimizerStep", 3, "default", False)],
        intra=[("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"), ("EmbLookup", "InputDistWait"),
               ("Forward", "EmbLookup"), ("Forward", "ZeroGrad"), ("Backward", "Forward"),
               ("EmbBackward", "Backward"), ("OptimizerStep", "EmbBackward")],
        inter=[("EmbLookup", "Backward")],
        pipeline_depth=4, make_fn=make_fn,
    )


def prefetch(make_fn: Optional[MakeFn] = None) -> PipelinePlan:
    """PrefetchTrainPipelineSparseDist: depth 3, streams memcpy, data_dist, prefetch, default."""
    return build(
        [("H2D", 0, "memcpy", False),
         ("InputDistStart", 0, "data_dist", True),
         ("InputDistWait", 1, "data_dist", False),
         ("EmbPrefetch", 1, "prefetch", False),
         ("ZeroGrad", 2, "default", False),
         ("WaitBatch", 2, "default", False),
         ("Forward", 2, "default", False),
         ("Backward", 2, "default", False),
         ("OptimizerStep", 2, "default", False)],
        intra=[("InputDistStart", "H2D"), ("InputDistWait", "InputDistStart"), ("EmbPrefetch", "InputDistWait"),
               ("WaitBatch", "EmbPrefetch"), ("WaitBatch", "ZeroGrad"), ("Forward", "WaitBatch"),
               ("Backward", "Forward"), ("OptimizerStep", "Backward")],
        inter=[("EmbPrefetch", "Forward"), ("Forward", "OptimizerStep")],
        pipeline_depth=3, make_fn=make_fn,
    )


def comp_autograd(make_fn: Optional[MakeFn] = None) -> PipelinePlan:
    """TrainPipelineSparseDistCompAutograd: SparseDist's plan (InputDistStart not globally ordered)."""
    tasks = [(n, s, st, False) for n, s, st, _ in _SPARSE_DIST_TASKS]
    return build(tasks, _SPARSE_DIST_INTRA, [("Forward", "OptimizerStep")], pipeline_depth=3, make_fn=make_fn)


ALL_BUILDERS: Dict[str, Callable[..., PipelinePlan]] = {
    "Base": base,
    "PT2": pt2,
    "SparseDist": sparse_dist,
    "SparseDistLite": sparse_dist_lite,
    "FusedSparseDist": fused_sparse_dist,
    "FusedSparseDist000": fused_sparse_dist_000,
    "SemiSync": semi_sync,
    "Prefetch": prefetch,
    "CompAutograd": comp_autograd,
}


# -- the tables the seeds print (whitespace collapsed as in the seeds) ---------------------------

_DASHES5 = "-- ----------------- ------- ------------ + ----- ----- ----- ----- -----"
_HEAD5 = "# Task Thread Stream | P0 P1 P2 P3 P4"

# name -> (num_periods, expected print_schedule(num_periods) text)
SEED_TABLES: Dict[str, Tuple[int, str]] = {
    "Base": (5, f"""{_HEAD5} {_DASHES5}
0 ZeroGrad default default | -- i0 i1 i2 i3 1 WaitBatch default default | -- i0 i1 i2 i3
2 Forward default default | -- i0 i1 i2 i3 3 Backward default default | -- i0 i1 i2 i3
4 OptimizerStep default default | -- i0 i1 i2 i3 5 H2D default memcpy | i0 i1 i2 i3 i4"""),
    "SparseDist": (5, f"""{_HEAD5} {_DASHES5}
0 ZeroGrad default default | -- -- i0 i1 i2 1 WaitBatch default default | -- -- i0 i1 i2
2 Forward default default | -- -- i0 i1 i2 3 Backward default default | -- -- i0 i1 i2
4 OptimizerStep default default | -- -- i0 i1 i2 5 InputDistStart default data_dist | -- i0 i1 i2 i3
6 InputDistWait default data_dist | -- i0 i1 i2 i3 7 H2D default memcpy | i0 i1 i2 i3 i4"""),
    "SparseDistLite": (5, f"""{_HEAD5} {_DASHES5}
0 ZeroGrad default default | -- i0 i1 i2 i3 1 WaitBatch default default | -- i0 i1 i2 i3
2 InputDistStart default default | -- i0 i1 i2 i3 3 InputDistWait default default | -- i0 i1 i2 i3
4 Forward default default | -- i0 i1 i2 i3 5 Backward default default | -- i0 i1 i2 i3
6 OptimizerStep default default | -- i0 i1 i2 i3 7 H2D default memcpy | i0 i1 i2 i3 i4"""),
    "FusedSparseDist": (5, f"""{_HEAD5} {_DASHES5}
0 EmbLookup default emb_lookup | -- -- i0 i1 i2 1 ZeroGrad default default | -- -- i0 i1 i2
2 WaitBatch default default | -- -- i0 i1 i2 3 Forward default default | -- -- i0 i1 i2
4 Backward default default | -- -- i0 i1 i2 5 OptimizerStep default default | -- -- i0 i1 i2
6 InputDistStart default data_dist | -- i0 i1 i2 i3 7 InputDistWait default data_dist | -- i0 i1 i2 i3
8 H2D default memcpy | i0 i1 i2 i3 i4"""),
    "SemiSync": (6, """# Task Thread Stream | P0 P1 P2 P3 P4 P5
-- ----------------- ------- ------------ + ----- ----- ----- ----- ----- -----
0 ZeroGrad default default | -- -- -- i0 i1 i2 1 Forward default default | -- -- -- i0 i1 i2
2 Backward default default | -- -- -- i0 i1 i2 3 EmbBackward default default | -- -- -- i0 i1 i2
4 OptimizerStep default default | -- -- -- i0 i1 i2 5 EmbLookup default default | -- -- i0 i1 i2 i3
6 InputDistStart default data_dist | -- i0 i1 i2 i3 i4 7 InputDistWait default data_dist | -- i0 i1 i2 i3 i4
8 H2D default memcpy | i0 i1 i2 i3 i4 i5"""),
    "Prefetch": (5, f"""{_HEAD5} {_DASHES5}
0 ZeroGrad default default | -- -- i0 i1 i2 1 WaitBatch default default | -- -- i0 i1 i2
2 Forward default default | -- -- i0 i1 i2 3 Backward default default | -- -- i0 i1 i2
4 OptimizerStep default default | -- -- i0 i1 i2 5 InputDistWait default data_dist | -- i0 i1 i2 i3
6 EmbPrefetch default prefetch | -- i0 i1 i2 i3 7 H2D default memcpy | i0 i1 i2 i3 i4
8 InputDistStart default data_dist | i0 i1 i2 i3 i4"""),
    "CompAutograd": (5, f"""{_HEAD5} {_DASHES5}
0 ZeroGrad default default | -- -- i0 i1 i2 1 WaitBatch default default | -- -- i0 i1 i2
2 Forward default default | -- -- i0 i1 i2 3 Backward default default | -- -- i0 i1 i2
4 OptimizerStep default default | -- -- i0 i1 i2 5 InputDistStart default data_dist | -- i0 i1 i2 i3
6 InputDistWait default data_dist | -- i0 i1 i2 i3 7 H2D default memcpy | i0 i1 i2 i3 i4"""),
}
# Seed 000's end-to-end example prints the same table as seed 001's FusedSparseDist.
SEED_TABLES["FusedSparseDist000"] = SEED_TABLES["FusedSparseDist"]
