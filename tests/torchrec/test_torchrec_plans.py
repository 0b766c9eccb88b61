"""swpipeline.torchrec without a process group: the plans, their tables, the step boundary, the options.

The schedule tables of the variants equal seed 001's; the plans equal seed
001's except for the documented deviations; and PlannedTrainPipeline's step
logic (lockstep, execute_all_batches, iterator changes, failures) is checked on
toy plans whose tasks record what ran.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any, Callable, Dict, List, Tuple

import pytest

pytest.importorskip("torchrec.distributed")  # not "torchrec": without it, this folder imports as that name

import torch  # noqa: E402

import seed_plans  # noqa: E402
from engine_helpers import progress_until_stop  # noqa: E402
import swpipeline.torchrec as swtr  # noqa: E402
from swpipeline import IterContext, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule  # noqa: E402
from swpipeline.torchrec import plans as torchrec_plans  # noqa: E402
from swpipeline.torchrec.feed import BatchFeed  # noqa: E402

CPU = torch.device("cpu")

FACTORIES: Dict[str, Callable[..., Any]] = {
    "Base": swtr.TrainPipelineBase,
    "SparseDist": swtr.TrainPipelineSparseDist,
    "SparseDistLite": swtr.TrainPipelineSparseDistLite,
    "FusedSparseDist": swtr.TrainPipelineFusedSparseDist,
    "SemiSync": swtr.TrainPipelineSemiSync,
    "Prefetch": swtr.PrefetchTrainPipelineSparseDist,
    "CompAutograd": swtr.TrainPipelineSparseDistCompAutograd,
    "PT2": swtr.TrainPipelinePT2,
    "EvalSparseDist": swtr.EvalPipelineSparseDist,
    "EvalFusedSparseDist": swtr.EvalPipelineFusedSparseDist,
}


def pipeline(name: str, **kwargs: Any) -> Any:
    """A variant around a stand-in model: enough to plan and print, nothing runs."""
    return FACTORIES[name](torch.nn.Linear(1, 1), None, CPU, **kwargs)


# -- the plans against seed 001 ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["Base", "SparseDist", "SparseDistLite", "FusedSparseDist", "SemiSync", "Prefetch",
                                  "CompAutograd"])
def test_print_schedule_equals_seed_001(name: str) -> None:
    num_periods, expected = seed_plans.SEED_TABLES[name]
    if name == "SemiSync":  # EmbLookup at stage 1, after the stage-3 tasks on the default stream (plans.py)
        expected = SEMI_SYNC_TABLE
    assert pipeline(name).format_schedule(num_periods).split() == expected.split()


SEMI_SYNC_TABLE = """# Task Thread Stream | P0 P1 P2 P3 P4 P5
    -- ----------------- ------- ------------ + ----- ----- ----- ----- ----- -----
    0 ZeroGrad default default | -- -- -- i0 i1 i2 1 Forward default default | -- -- -- i0 i1 i2
    2 Backward default default | -- -- -- i0 i1 i2 3 EmbBackward default default | -- -- -- i0 i1 i2
    4 OptimizerStep default default | -- -- -- i0 i1 i2 5 InputDistStart default data_dist | -- i0 i1 i2 i3 i4
    6 InputDistWait default data_dist | -- i0 i1 i2 i3 i4 7 EmbLookup default default | -- i0 i1 i2 i3 i4
    8 H2D default memcpy | i0 i1 i2 i3 i4 i5"""


def _rows(plan: PipelinePlan) -> List[Tuple[str, int, str, bool]]:
    rows = []
    for task in plan.tasks:
        s = plan.schedules[task.name]
        rows.append((task.name, s.stage, s.stream or "default", s.globally_ordered))
    return sorted(rows)


def _deps(plan: PipelinePlan, kind: str) -> List[Tuple[str, str]]:
    if kind == "intra":
        return sorted((t, d) for t, ds in plan.intra.items() for d in ds)
    return sorted(plan.inter_entries())


# What differs from seed 001's plan (see plans.py and docs/torchrec.md)
SAME_AS_SEED = ["Base", "SparseDistLite", "Prefetch"]
WAIT_AFTER_FORWARD = ["SparseDist", "FusedSparseDist", "CompAutograd"]  # + (InputDistWait, WaitBatch)


@pytest.mark.parametrize("name", SAME_AS_SEED + WAIT_AFTER_FORWARD + ["SemiSync", "PT2"])
def test_plan_equals_seed_001_except_the_documented_deviations(name: str) -> None:
    ours = pipeline(name).plan
    seed = seed_plans.ALL_BUILDERS[name]()
    if name == "SemiSync":  # EmbLookup two stages below the embedding update (plans.py)
        assert _rows(ours) == [r if r[0] != "EmbLookup" else ("EmbLookup", 1, "default", False) for r in _rows(seed)]
    else:
        assert _rows(ours) == _rows(seed)
    if name in SAME_AS_SEED + WAIT_AFTER_FORWARD:
        extra = [("InputDistWait", "WaitBatch")] if name in WAIT_AFTER_FORWARD else []
        copy_wait = [("WaitBatch", "H2D")] if name == "FusedSparseDist" else []  # found by analyze()
        assert _deps(ours, "intra") == sorted(_deps(seed, "intra") + copy_wait)
        assert _deps(ours, "inter") == sorted(_deps(seed, "inter") + extra)
    elif name == "SemiSync":  # the stages order EmbLookup against the update: no inter-iteration pair
        assert _deps(ours, "intra") == _deps(seed, "intra")
        assert _deps(seed, "inter") == [("EmbLookup", "Backward")]
        assert _deps(ours, "inter") == []
    else:  # PT2: the seed declares no dependencies; ours chains TorchRec's order
        assert _deps(seed, "intra") == []
        assert [t for t in SWPipeline(ours, device="cpu").enqueue_order] == [
            "LoadBatch", "H2D", "InputTransform", "ZeroGrad", "Forward", "Backward", "OptimizerStep"]


@pytest.mark.parametrize("name", WAIT_AFTER_FORWARD)
def test_collectives_are_issued_in_torchrecs_order(name: str) -> None:
    # TorchRec: InputDistStart(i+1), Forward(i), InputDistWait(i+1), Backward(i)
    order = [t for t in pipeline(name).engine.enqueue_order
             if t in ("InputDistStart", "Forward", "InputDistWait", "Backward")]
    assert order == ["InputDistStart", "Forward", "InputDistWait", "Backward"]


def test_semi_sync_looks_up_between_the_two_previous_embedding_updates() -> None:
    # Semi-sync: batch i+1 reads the embeddings after batch i-1's update (EmbBackward) and before
    # batch i's, one update old. The seed's plan (EmbLookup one stage below the update, on the same
    # stream) runs every lookup after the previous update: synchronous.
    for plan, stale in ((torchrec_plans.SEMI_SYNC.build(lambda n: note(n), lambda role: role), True),
                        (seed_plans.semi_sync(make_fn=lambda n: note(n)), False)):
        order.clear()
        SWPipeline(plan, device="cpu").run(range(8))
        pos = {unit: k for k, unit in enumerate(order)}
        for i in range(1, 7):
            assert pos[("EmbBackward", i - 1)] < pos[("EmbLookup", i + 1)]
            assert (pos[("EmbLookup", i + 1)] < pos[("EmbBackward", i)]) is stale


order: List[Tuple[str, int]] = []


def note(name: str) -> Callable[[IterContext], None]:
    return lambda ctx: order.append((name, ctx.iter_idx))


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_the_default_thread_group_ends_each_period_with_the_retiring_iteration(name: str) -> None:
    # This is what makes lockstep exact on a worker thread: when progress() has retired iteration k,
    # the default worker has nothing left of the period (its last unit was k's last task). SemiSync's
    # lookup ends its period instead, so it runs lockstep on the calling thread only.
    pipe = pipeline(name)
    plan = pipe.plan
    last = [n for n in pipe.engine.enqueue_order if plan.schedules[n].thread_group == "default"][-1]
    if name == "SemiSync":
        assert last == "EmbLookup"
        with pytest.raises(ValueError, match="caller_thread=False: the default thread group's last task of a "
                                             "period, 'EmbLookup'"):
            pipeline(name, caller_thread=False)
    else:
        assert plan.stage(last) == plan.depth - 1


EXTRA_TABLES = {
    "PT2": ("PT2", {}, 2, """# Task Thread Stream | P0 P1 -- ----------------- ------- ------------ + ----- -----
        0 LoadBatch default default | i0 i1 1 H2D default default | i0 i1 2 InputTransform default default | i0 i1
        3 ZeroGrad default default | i0 i1 4 Forward default default | i0 i1 5 Backward default default | i0 i1
        6 OptimizerStep default default | i0 i1"""),
    "EvalSparseDist": ("EvalSparseDist", {}, 3, """# Task Thread Stream | P0 P1 P2
        -- ----------------- ------- ------------ + ----- ----- -----
        0 InputDistStart default data_dist | -- i0 i1 1 InputDistWait default data_dist | -- i0 i1
        2 WaitBatch default default | -- i0 i1 3 Forward default default | -- i0 i1 4 H2D loader memcpy | i0 i1 i2"""),
    "EvalFusedSparseDist": ("EvalFusedSparseDist", {}, 4, """# Task Thread Stream | P0 P1 P2 P3
        -- ----------------- ------- ------------ + ----- ----- ----- -----
        0 EmbLookup default emb_lookup | -- -- i0 i1 1 WaitBatch default default | -- -- i0 i1
        2 Forward default default | -- -- i0 i1 3 InputDistStart default data_dist | -- i0 i1 i2
        4 InputDistWait default data_dist | -- i0 i1 i2 5 H2D default memcpy | i0 i1 i2 i3"""),
    "enqueue_batch_after_forward": ("SparseDist", {"enqueue_batch_after_forward": True}, 4, """
        # Task Thread Stream | P0 P1 P2 P3 -- ----------------- ------- ------------ + ----- ----- ----- -----
        0 ZeroGrad default default | -- -- i0 i1 1 WaitBatch default default | -- -- i0 i1
        2 Forward default default | -- -- i0 i1 3 Backward default default | -- -- i0 i1
        4 OptimizerStep default default | -- -- i0 i1 5 H2D default memcpy | -- i0 i1 i2
        6 InputDistStart default data_dist | -- i0 i1 i2 7 InputDistWait default data_dist | -- i0 i1 i2"""),
    "prep thread": ("SparseDist", {"thread_groups": {"H2D": "prep"}}, 3, """
        # Task Thread Stream | P0 P1 P2 -- ----------------- ------- ------------ + ----- ----- -----
        0 ZeroGrad default default | -- -- i0 1 WaitBatch default default | -- -- i0
        2 Forward default default | -- -- i0
        3 Backward default default | -- -- i0 4 OptimizerStep default default | -- -- i0
        5 InputDistStart default data_dist | -- i0 i1 6 InputDistWait default data_dist | -- i0 i1
        7 H2D prep memcpy | i0 i1 i2"""),
}


@pytest.mark.parametrize("key", sorted(EXTRA_TABLES))
def test_tables_of_the_plans_the_seed_does_not_print(key: str) -> None:
    name, kwargs, num_periods, expected = EXTRA_TABLES[key]
    assert pipeline(name, **kwargs).format_schedule(num_periods).split() == expected.split()


@pytest.mark.parametrize("stream,label", [("new", "emb_lookup"), ("data_dist", "data_dist"), ("current", "default")])
def test_fused_emb_lookup_stream_option(stream: str, label: str) -> None:
    table = pipeline("FusedSparseDist", emb_lookup_stream=stream).format_schedule(3)
    assert f"EmbLookup default {label} |" in " ".join(table.split())


# -- options that are refused --------------------------------------------------------------------

def test_only_h2d_may_leave_the_default_thread_group() -> None:
    with pytest.raises(ValueError, match=r"\['Forward'\] must stay on the 'default' thread group"):
        pipeline("SparseDist", thread_groups={"Forward": "other"})
    with pytest.raises(ValueError, match="unknown task"):
        pipeline("SparseDist", thread_groups={"LoadBatch": "prep"})


def test_unknown_options_and_values_are_named() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        pipeline("SparseDist", lockstepp=False)
    with pytest.raises(ValueError, match="emb_lookup_stream must be one of"):
        pipeline("FusedSparseDist", emb_lookup_stream="other")
    with pytest.raises(NotImplementedError, match="InputDistStart"):
        pipeline("FusedSparseDist", embedding_lookup_after_data_dist=True)
    with pytest.raises(ValueError, match="pipeline_stages is empty"):
        swtr.StagedTrainPipeline([])


# -- PlannedTrainPipeline's step logic on toy plans ----------------------------------------------

def toy(depth: int, log: List[Tuple[str, int]]) -> PlannedTrainPipeline:
    """One recording task per stage, each depending on the previous stage's; output = the batch."""
    def record(name: str) -> Callable[[IterContext], None]:
        def fn(ctx: IterContext) -> None:
            log.append((name, ctx.iter_idx))
            ctx.output = ctx.batch
        return fn

    tasks = [PipelineTask(f"S{k}", record(f"S{k}")) for k in range(depth)]
    plan = PipelinePlan(schedule={t: TaskSchedule(stage=k) for k, t in enumerate(tasks)},
                        intra_iter_deps=[(tasks[k], tasks[k - 1]) for k in range(1, depth)])
    return swtr.PlannedTrainPipeline(plan, None, CPU)


PlannedTrainPipeline = swtr.PlannedTrainPipeline


drain = progress_until_stop


@pytest.mark.parametrize("count", [0, 1, 2, 3, 4, 7])
@pytest.mark.parametrize("execute_all", [True, False])
def test_steps_and_stop_iteration(count: int, execute_all: bool) -> None:
    log: List[Tuple[str, int]] = []
    pipe = toy(3, log)
    pipe.execute_all_batches = execute_all
    outputs = drain(pipe, iter(range(count)))
    steps = count if execute_all else max(count - 2, 0)
    assert outputs == list(range(steps))
    assert ("S2", steps) not in log  # a dropped batch never reaches the last stage
    with pytest.raises(StopIteration):  # and it stays stopped
        pipe.progress(iter([]))


def test_lockstep_runs_nothing_of_the_next_step_before_the_next_call() -> None:
    log: List[Tuple[str, int]] = []
    pipe = toy(3, log)
    it = iter(range(6))
    assert pipe.progress(it) == 0
    assert sorted(log) == sorted([("S0", 0), ("S0", 1), ("S0", 2), ("S1", 0), ("S1", 1), ("S2", 0)])
    assert pipe.progress(it) == 1
    assert ("S2", 1) in log and ("S0", 3) in log and ("S0", 4) not in log


def test_without_lockstep_the_next_step_is_enqueued_before_returning() -> None:
    log: List[Tuple[str, int]] = []
    pipe = toy(3, log)
    pipe.lockstep = False
    it = iter(range(6))
    assert pipe.progress(it) == 0
    assert drain(pipe, it) == [1, 2, 3, 4, 5]
    assert ("S0", 3) in log


@pytest.mark.parametrize("lockstep,caller_thread,on_caller", [(True, True, True), (True, False, False),
                                                              (False, True, False)])
def test_where_the_default_thread_group_runs(lockstep: bool, caller_thread: bool, on_caller: bool) -> None:
    threads = set()

    def step(ctx: IterContext) -> None:
        threads.add(threading.get_ident())
        ctx.output = ctx.batch

    plan = PipelinePlan(schedule={PipelineTask("Step", step): TaskSchedule()})
    pipe = swtr.PlannedTrainPipeline(plan, None, CPU, lockstep=lockstep, caller_thread=caller_thread)
    assert drain(pipe, iter(range(4))) == [0, 1, 2, 3]
    assert (threads == {threading.get_ident()}) == on_caller


def test_later_batches_come_from_the_latest_iterator() -> None:
    pipe = toy(2, [])  # as TorchRec: batches in flight stay, the next ones come from the new iterator
    first = iter([10, 11, 12])
    assert pipe.progress(first) == 10
    assert drain(pipe, iter([20, 21])) == [11, 20, 21]
    assert next(first) == 12


def test_a_failed_step_needs_reset() -> None:
    def boom(ctx: IterContext) -> None:
        if ctx.batch == 2:
            raise ValueError("bad batch")
        ctx.output = ctx.batch

    plan = PipelinePlan(schedule={PipelineTask("Step", boom): TaskSchedule()})
    pipe = swtr.PlannedTrainPipeline(plan, None, CPU)
    it = iter(range(5))
    assert [pipe.progress(it), pipe.progress(it)] == [0, 1]
    with pytest.raises(ValueError, match="bad batch"):
        pipe.progress(it)
    with pytest.raises(RuntimeError, match="call reset"):
        pipe.progress(it)
    pipe.reset()
    assert drain(pipe, it) == [3, 4]


def test_batch_feed_looks_ahead_pauses_and_reports_the_end() -> None:
    ended: List[bool] = []
    feed = BatchFeed(iter([1, 2, 3]))
    feed.on_exhausted = lambda: ended.append(True)
    assert feed.has(2) and next(feed) == 1
    feed.paused = True
    assert not feed.has(1)
    with pytest.raises(StopIteration):
        next(feed)
    feed.paused = False
    assert list(feed) == [2, 3] and ended == [True] and feed.drawn == 3


def test_import_swpipeline_does_not_import_torchrec() -> None:
    code = "import sys, swpipeline; assert 'torchrec' not in sys.modules, 'torchrec imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_failing_iterator_is_an_error_not_the_end_of_the_data() -> None:
    def batches() -> Any:
        yield 0
        yield 1
        raise OSError("disk gone")

    pipe = toy(2, [])
    it = batches()
    with pytest.raises(OSError, match="disk gone"):
        drain(pipe, it)
    with pytest.raises(RuntimeError, match="call reset"):
        pipe.progress(it)


def test_an_exhausted_iterator_is_not_asked_again() -> None:
    calls = []

    class Counting:
        def __iter__(self) -> "Counting":
            return self

        def __next__(self) -> int:
            calls.append(1)
            raise StopIteration

    pipe, it = toy(2, []), Counting()
    for _ in range(3):
        with pytest.raises(StopIteration):
            pipe.progress(it)
    assert len(calls) == 1


def test_public_names() -> None:
    assert set(swtr.__all__) == {
        "EvalPipelineFusedSparseDist", "EvalPipelineSparseDist", "PLAN_SPECS", "PlanSpec", "PlannedTrainPipeline",
        "PrefetchTrainPipelineSparseDist", "RankAgreement", "StagedPipeline", "StagedTrainPipeline",
        "TrainPipelineBase", "TrainPipelineFusedSparseDist", "TrainPipelinePT2", "TrainPipelineSemiSync",
        "TrainPipelineSparseDist", "TrainPipelineSparseDistCompAutograd", "TrainPipelineSparseDistLite"}
    import importlib

    for mod in ("blocks", "compiled", "feed", "model_state", "pipeline", "plans", "staged", "tasks",
                "variants"):
        assert importlib.import_module(f"swpipeline.torchrec.{mod}").__all__ == []


def test_staged_on_the_cpu_takes_cpu_streams_or_none() -> None:
    from torchrec.distributed.train_pipeline.pipeline_stage import PipelineStage

    stages = [PipelineStage("double", lambda x: 2 * x, torch.cpu.Stream()),
              PipelineStage("inc", lambda x: x + 1, None)]
    pipe = swtr.StagedTrainPipeline(stages)
    it = iter(range(5))
    outs = []
    while (out := pipe.progress(it)) is not None:
        outs.append(out)
    assert outs == [1, 3, 5, 7, 9]
    assert pipe.progress(it) is None
