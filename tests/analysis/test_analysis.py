"""analyze(): a plan checked against what its tasks touch, with the exact dependency to add.

Broken plans (a missing intra dependency, a missing inter dependency on model weights,
a write-after-read on ``.grad``, a conflict on DeclaredIO state, a race hidden by a
shared thread group) are each reported exactly, with the fix, and the fixed plan is
reported clean. Correct plans (the demo's, the seed-shaped worked examples, every
swpipeline.torchrec plan on its 2-rank model) report no missing dependency.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import pytest
import torch

from engine_helpers import Fn, Spec, plan_of
import seed_plans
from swpipeline import DeclaredIO, IterContext, PipelinePlan, PipelineTask, TaskSchedule
from swpipeline import PlanAnalysis, analyze
from swpipeline.cli.demo import DemoConfig, TrainingJob, make_raw_batch
from swpipeline.devices.device import resolve_device



def pairs(entries: Sequence[Tuple[str, str, str, str]]) -> List[Tuple[str, str, str]]:
    return [(task, dep, kind) for task, dep, kind, _ in entries]


class Loop:
    """A tiny training loop: prepare, forward, backward, optimizer step (zeroing the gradients)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(2, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def prepare(self, ctx: IterContext) -> None:
        ctx.x = ctx.batch * 2.0

    def forward(self, ctx: IterContext) -> None:
        ctx.loss = self.model(ctx.x).sum()

    def backward(self, ctx: IterContext) -> None:
        ctx.loss.backward()

    def step(self, ctx: IterContext) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad()

    def spec(self, groups: Tuple[str, str, str] = ("default", "default", "default")) -> Spec:
        return {"Prepare": (0, "prep", "prep", self.prepare), "Forward": (1, None, groups[0], self.forward),
                "Backward": (1, None, groups[1], self.backward), "OptimizerStep": (1, None, groups[2], self.step)}


BATCH = torch.ones(4, 2)
STEP = [("Backward", "Forward"), ("OptimizerStep", "Backward")]

SMALL_REPORT = (  # the long lines are split here in the source only
    "plan analysis (one serial iteration, iter_idx 0): Prepare, Forward, Backward, OptimizerStep\n"
    "missing dependencies: 1\n"
    "  - Forward reads `ctx.x`, which Prepare writes; in a pipelined run Forward(i) may run before Prepare(i): "
    "add (\"Forward\", \"Prepare\") to intra_iter_deps\n"
    "warnings (ordered only by the placement): 1\n"
    "  - Forward reads `model.bias`, `model.weight`, which OptimizerStep writes; Forward(i+1) runs after "
    "OptimizerStep(i) only because both run on thread group 'default' and the default stream, and would race on "
    "other thread groups or streams: add (\"Forward\", \"OptimizerStep\") to inter_iter_deps\n"
    "what each task touched:\n"
    "  Prepare        reads -; writes `ctx.x`\n"
    "  Forward        reads `ctx.x`, `model.bias`, `model.weight`; writes `ctx.loss`\n"
    "  Backward       reads `ctx.loss`; writes `model.bias.grad`, `model.weight.grad`\n"
    "  OptimizerStep  reads `model.bias.grad`, `model.weight.grad`; writes `model.bias`, `model.bias.grad`, "
    "`model.weight`, `model.weight.grad`")


def test_the_report_of_a_small_plan() -> None:
    loop = Loop()
    analysis = analyze(plan_of(loop.spec(), STEP), BATCH)
    assert analysis.report() == SMALL_REPORT
    assert str(analysis) == SMALL_REPORT
    assert analysis.reads["Forward"] == {"ctx.x", "model.bias", "model.weight"}
    assert analysis.writes["OptimizerStep"] == {"model.bias", "model.bias.grad", "model.weight", "model.weight.grad"}
    assert analysis.state == {"model.bias", "model.bias.grad", "model.weight", "model.weight.grad"}
    assert not analysis.ok


def assert_fixed_plan_is_clean(analysis: PlanAnalysis, batch: Any, warmup: int = 0) -> PlanAnalysis:
    fixed = analyze(analysis.fixed_plan(), batch, warmup=warmup)
    assert fixed.missing_deps == [] and fixed.ok
    return fixed


def test_a_missing_intra_dependency_on_a_context_attribute() -> None:
    loop = Loop()
    analysis = analyze(plan_of(loop.spec(), STEP, [("Forward", "OptimizerStep")]), BATCH)
    assert analysis.missing_deps == [
        ("Forward", "Prepare", "intra", "Forward reads `ctx.x`, which Prepare writes; in a pipelined run Forward(i) "
         "may run before Prepare(i): add (\"Forward\", \"Prepare\") to intra_iter_deps")]
    assert analysis.warnings == []
    assert assert_fixed_plan_is_clean(analysis, BATCH).warnings == []


def test_a_missing_inter_dependency_on_model_weights() -> None:
    loop = Loop()
    spec = loop.spec(groups=("fwd", "train", "train"))
    spec["Forward"] = (1, "fwd", "fwd", loop.forward)  # its own thread group and stream
    analysis = analyze(plan_of(spec, [("Forward", "Prepare"), *STEP]), BATCH)
    assert analysis.missing_deps == [
        ("Forward", "OptimizerStep", "inter", "Forward reads `model.bias`, `model.weight`, which OptimizerStep writes; "
         "in a pipelined run Forward(i+1) may run before OptimizerStep(i): add (\"Forward\", \"OptimizerStep\") to "
         "inter_iter_deps")]
    assert analysis.warnings == []  # Backward(i+1) after OptimizerStep(i) follows from the fix
    assert assert_fixed_plan_is_clean(analysis, BATCH).warnings == []


def test_a_write_after_read_on_grad_zero_grad_against_backward() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)

    def zero_grad(ctx: IterContext) -> None:
        for param in model.parameters():
            if param.grad is not None:
                param.grad.zero_()

    def forward(ctx: IterContext) -> None:
        ctx.loss = model(ctx.batch).sum()

    def backward_and_update(ctx: IterContext) -> None:
        ctx.loss.backward()
        with torch.no_grad():
            for param in model.parameters():
                param -= 0.1 * param.grad

    spec: Spec = {"ZeroGrad": (0, "zero", "zero", zero_grad), "Forward": (1, None, "default", forward),
                  "Backward": (1, None, "default", backward_and_update)}
    plan = plan_of(spec, [("Backward", "Forward"), ("Backward", "ZeroGrad")], [("Forward", "Backward")])
    analysis = analyze(plan, BATCH, warmup=1)  # the warm-up creates the gradients ZeroGrad zeroes
    assert analysis.missing_deps == [
        ("ZeroGrad", "Backward", "inter", "ZeroGrad writes `model.bias.grad`, `model.weight.grad`, which Backward "
         "reads; in a pipelined run ZeroGrad(i+1) may run before Backward(i): add (\"ZeroGrad\", \"Backward\") to "
         "inter_iter_deps")]
    assert assert_fixed_plan_is_clean(analysis, BATCH, warmup=1).warnings == []


class Cache:
    """State outside the context, declared through DeclaredIO by the task that fills it."""

    def __init__(self) -> None:
        self.values = torch.zeros(2)
        self.io = DeclaredIO(capture=lambda: self.values, restore=self.values.copy_)

    def fill(self, ctx: IterContext) -> None:
        self.values.copy_(ctx.batch[0])

    def use(self, ctx: IterContext) -> None:
        ctx.total = self.values.sum()


def test_a_conflict_on_declared_io_state() -> None:
    cache = Cache()
    spec: Spec = {"Fill": (0, "fill", "fill", cache.fill), "Use": (0, "use", "use", cache.use)}
    analysis = analyze(plan_of(spec, io={"Fill": [cache.io]}), BATCH)
    assert analysis.writes["Fill"] == {"Fill.io[0]"} and analysis.reads["Use"] == {"Fill.io[0]"}
    assert analysis.missing_deps == [
        ("Use", "Fill", "intra", "Use reads `Fill.io[0]`, which Fill writes; in a pipelined run Use(i) may run before "
         "Fill(i): add (\"Use\", \"Fill\") to intra_iter_deps"),
        ("Fill", "Use", "inter", "Fill writes `Fill.io[0]`, which Use reads; in a pipelined run Fill(i+1) may run "
         "before Use(i): add (\"Fill\", \"Use\") to inter_iter_deps")]
    assert_fixed_plan_is_clean(analysis, BATCH)


def test_a_race_hidden_by_a_shared_thread_group_is_a_warning() -> None:
    loop = Loop()
    analysis = analyze(plan_of(loop.spec(), [("Forward", "Prepare"), *STEP]), BATCH)
    assert analysis.missing_deps == [] and analysis.ok
    assert analysis.warnings == [
        ("Forward", "OptimizerStep", "inter", "Forward reads `model.bias`, `model.weight`, which OptimizerStep writes; "
         "Forward(i+1) runs after OptimizerStep(i) only because both run on thread group 'default' and the default "
         "stream, and would race on other thread groups or streams: add (\"Forward\", \"OptimizerStep\") to "
         "inter_iter_deps")]
    explicit = analyze(plan_of(loop.spec(), [("Forward", "Prepare"), *STEP], [("Forward", "OptimizerStep")]), BATCH)
    assert explicit.missing_deps == [] and explicit.warnings == []


def test_a_fix_the_stages_forbid_says_which_stages_would_allow_it() -> None:
    loop = Loop()
    spec = loop.spec()
    spec["Forward"] = (0, "fwd", "fwd", loop.forward)  # two stages before the step that updates its weights
    spec["Backward"] = (2, None, "default", loop.backward)
    spec["OptimizerStep"] = (2, None, "default", loop.step)
    analysis = analyze(plan_of(spec, [("Forward", "Prepare"), *STEP]), BATCH)
    assert analysis.missing_deps == [
        ("Forward", "OptimizerStep", "inter", "Forward reads `model.bias`, `model.weight`, which OptimizerStep writes; "
         "in a pipelined run Forward(i+1) may run before OptimizerStep(i): add (\"Forward\", \"OptimizerStep\") to "
         "inter_iter_deps and move Forward to stage 1 or later, or OptimizerStep to stage 1 or earlier (a "
         "dependency's stage may be at most the task's stage + 1). "
         + STALENESS_TAIL.format(gap=2, s="s", distance=3, newer="1 step old").replace("Step", "OptimizerStep"))]


def test_a_tensor_nothing_names_is_described_by_dtype_shape_and_order() -> None:
    hidden = torch.zeros(3)

    def bump(ctx: IterContext, buffer: torch.Tensor = hidden) -> None:  # reachable only as a default argument
        buffer.add_(1.0)

    def peek(ctx: IterContext, buffer: torch.Tensor = hidden) -> None:
        ctx.seen = buffer.sum()

    analysis = analyze(plan_of({"Bump": (0, None, "a", bump), "Peek": (0, "s", "b", peek)}), BATCH)
    assert analysis.writes["Bump"] == {"tensor float32[3] #1"} and analysis.reads["Peek"] == {"tensor float32[3] #1"}
    assert pairs(analysis.missing_deps) == [("Peek", "Bump", "intra"), ("Bump", "Peek", "inter")]


def test_accepted_pairs_are_left_out() -> None:
    loop = Loop()
    spec = loop.spec(groups=("fwd", "train", "train"))
    analysis = analyze(plan_of(spec, [("Forward", "Prepare"), *STEP]), BATCH, accept=[("Forward", "OptimizerStep")])
    assert analysis.missing_deps == []
    # without Forward(i+1) after OptimizerStep(i), Backward(i+1) after OptimizerStep(i) is its own finding
    assert pairs(analysis.warnings) == [("Backward", "OptimizerStep", "inter")]


def test_arguments_are_checked() -> None:
    loop = Loop()
    plan = plan_of(loop.spec(), STEP)
    with pytest.raises(TypeError, match="analyze: plan must be a PipelinePlan, got dict"):
        analyze({}, BATCH)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="analyze: warmup must be >= 0, got -1"):
        analyze(plan, BATCH, warmup=-1)
    with pytest.raises(ValueError, match="analyze: accept names unknown task\\(s\\) \\['Nope'\\]"):
        analyze(plan, BATCH, accept=[("Forward", "Nope")])
    named = PipelinePlan({"A": TaskSchedule()})
    with pytest.raises(ValueError, match="analyze: tasks \\['A'\\] have no function"):
        analyze(named, BATCH)


def test_a_task_that_fails_is_reported_with_its_name_and_iteration() -> None:
    def broken(ctx: IterContext) -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError) as info:
        analyze(plan_of({"A": (0, None, "default", broken)}), BATCH, warmup=2)
    assert (getattr(info.value, "swp_task"), getattr(info.value, "swp_iter")) == ("A", 0)


# -- correct plans analyse without a missing dependency -------------------------------------------------


def test_the_demo_plan_has_no_missing_dependency() -> None:
    cfg = DemoConfig(iters=2, batch_size=16, table_sizes=(30, 20), warmup_iters=0)
    job = TrainingJob(cfg, resolve_device("cpu"))
    analysis = analyze(job.plan, make_raw_batch(cfg, 0))
    assert analysis.missing_deps == []
    assert analysis.warnings == [
        ("Forward", "OptimizerStep", "inter", "Forward reads `model.bottom.0.bias`, `model.bottom.0.weight`, "
         "`model.bottom.2.bias`, `model.bottom.2.weight`, `model.embeddings.0.weight`, `model.embeddings.1.weight`, "
         "`model.top.0.bias`, `model.top.0.weight`, `model.top.2.bias`, `model.top.2.weight`, which OptimizerStep "
         "writes; Forward(i+1) runs after OptimizerStep(i) only "
         "because both run on thread group 'default' and the default stream, and would race on other thread groups "
         "or streams: add (\"Forward\", \"OptimizerStep\") to inter_iter_deps")]
    assert analysis.writes["CopyToDevice"] == {"ctx.on_device", "ctx.prepared"}  # it deletes ctx.prepared
    assert {n for n in analysis.reads["Forward"] if n.startswith("ctx.")} == {"ctx.on_device"}


class SeedJob:
    """Task functions shaped like TorchRec's steps, on a tiny dense + embedding model, for the seed-shaped plans.

    The batch is ``{"dense": float [4, 3], "ids": int64 [4]}``. Where the embedding update
    happens follows the variant: in OptimizerStep, in Backward (a fused optimizer, as
    FusedSparseDist), or in EmbBackward (SemiSync). Prefetch's lookup reads a cache that
    EmbPrefetch fills.
    """

    def __init__(self, update_embeddings_in: str = "OptimizerStep") -> None:
        torch.manual_seed(0)
        self.dense = torch.nn.Linear(3, 1)
        self.embedding = torch.nn.Embedding(10, 3)
        self.cache = torch.zeros(10)
        fused = update_embeddings_in != "OptimizerStep"
        params = list(self.dense.parameters()) + ([] if fused else list(self.embedding.parameters()))
        self.optimizer = torch.optim.SGD(params, lr=0.1)
        self.update_in = update_embeddings_in

    def fn(self, name: str) -> Fn:
        return getattr(self, f"task_{name}")  # type: ignore[no-any-return]

    def _update_embeddings(self) -> None:
        weight = self.embedding.weight
        if weight.grad is not None:
            with torch.no_grad():
                weight -= 0.1 * weight.grad
            weight.grad = None

    def task_LoadBatch(self, ctx: IterContext) -> None:
        ctx.data = dict(ctx.batch)

    def task_H2D(self, ctx: IterContext) -> None:
        ctx.data = {k: v.clone() for k, v in vars(ctx).get("data", ctx.batch).items()}

    def task_InputTransform(self, ctx: IterContext) -> None:
        ctx.data = dict(ctx.data)

    def task_InputDistStart(self, ctx: IterContext) -> None:
        ctx.request = ctx.data["ids"] + 0

    def task_InputDistWait(self, ctx: IterContext) -> None:
        ctx.ids = ctx.request.clone()

    def task_EmbPrefetch(self, ctx: IterContext) -> None:
        self.cache.index_fill_(0, ctx.ids, 1.0)

    def task_EmbLookup(self, ctx: IterContext) -> None:
        ctx.emb = self.embedding(ctx.ids)

    def task_ZeroGrad(self, ctx: IterContext) -> None:
        self.optimizer.zero_grad()

    def task_WaitBatch(self, ctx: IterContext) -> None:
        ctx.ready = ctx.data["dense"].shape[0]

    def task_Forward(self, ctx: IterContext) -> None:
        found = vars(ctx)
        emb = found["emb"] if "emb" in found else self.embedding(found["ids"] if "ids" in found else ctx.data["ids"])
        if "ids" in found and self.cache.any():
            emb = emb * self.cache[found["ids"]].unsqueeze(1)
        ctx.loss = (self.dense(ctx.data["dense"]).squeeze(1) + emb.sum(1)).sum()

    def task_Backward(self, ctx: IterContext) -> None:
        ctx.loss.backward()
        if self.update_in == "Backward":
            self._update_embeddings()

    def task_EmbBackward(self, ctx: IterContext) -> None:
        self._update_embeddings()

    def task_OptimizerStep(self, ctx: IterContext) -> None:
        self.optimizer.step()


SEED_BATCH = {"dense": torch.ones(4, 3), "ids": torch.tensor([1, 2, 3, 1])}
UPDATE_IN = {"FusedSparseDist": "Backward", "FusedSparseDist000": "Backward", "SemiSync": "EmbBackward"}
ZERO_GRAD = ("ZeroGrad", "OptimizerStep", "inter")
SEED_WARNINGS: Dict[str, List[Tuple[str, str, str]]] = {
    "Base": [ZERO_GRAD],
    "SparseDist": [ZERO_GRAD],
    "SparseDistLite": [ZERO_GRAD],
    "FusedSparseDist": [("WaitBatch", "H2D", "intra"), ZERO_GRAD],
    # Forward(i) after OptimizerStep(i-1) follows from ZeroGrad's pair (Forward -> WaitBatch -> ZeroGrad)
    "FusedSparseDist000": [("WaitBatch", "H2D", "intra"), ZERO_GRAD],
    "SemiSync": [("EmbLookup", "EmbBackward", "inter"), ZERO_GRAD],
    "Prefetch": [ZERO_GRAD],
    "CompAutograd": [ZERO_GRAD],
}


@pytest.mark.parametrize("name", sorted(set(seed_plans.ALL_BUILDERS) - {"PT2"}))
def test_the_seed_shaped_worked_examples_have_no_missing_dependency(name: str) -> None:
    job = SeedJob(UPDATE_IN.get(name, "OptimizerStep"))
    analysis = analyze(seed_plans.ALL_BUILDERS[name](make_fn=job.fn), SEED_BATCH, warmup=1)
    assert analysis.missing_deps == []
    assert pairs(analysis.warnings) == SEED_WARNINGS[name]


def test_the_seed_shaped_pt2_plan_declares_no_dependencies_so_its_serial_order_fails() -> None:
    # PT2 is printed without dependencies: the serial order breaks ties by name and runs Backward first, so a
    # serial run (and the analysis, which is one) fails there; infer_deps recovers its chain (test_infer_deps.py)
    with pytest.raises(AttributeError, match="has no attribute 'loss'") as info:
        analyze(seed_plans.pt2(make_fn=SeedJob().fn), SEED_BATCH)
    assert (getattr(info.value, "swp_task"), getattr(info.value, "swp_iter")) == ("Backward", 0)


# -- every swpipeline.torchrec plan on its 2-rank test model ---------------------------------------------

Found = Tuple[List[Tuple[str, str, str]], List[Tuple[str, str, str]]]  # (missing, warnings) as (task, dep, kind)


def torchrec_analyses(rank: int, world_size: int) -> Dict[str, Any]:
    """Runs on each gloo rank: every variant's plan analysed after one warm-up step, on a fresh model each."""
    import swpipeline.torchrec as ours
    from torchrec_model import build_dlrm, make_batches

    batch = make_batches(rank, 1)[0]
    variants: Dict[str, Tuple[Any, Dict[str, Any]]] = {
        "Base": (ours.TrainPipelineBase, {}), "PT2": (ours.TrainPipelinePT2, {}),
        "SparseDist": (ours.TrainPipelineSparseDist, {}), "SparseDistLite": (ours.TrainPipelineSparseDistLite, {}),
        "FusedSparseDist": (ours.TrainPipelineFusedSparseDist, {}), "SemiSync": (ours.TrainPipelineSemiSync, {}),
        "SemiSync/start_batch=0": (ours.TrainPipelineSemiSync, {"start_batch": 0}),
        "Prefetch": (ours.PrefetchTrainPipelineSparseDist, {}), "EvalSparseDist": (ours.EvalPipelineSparseDist, {}),
        "EvalFusedSparseDist": (ours.EvalPipelineFusedSparseDist, {}),
    }
    out: Dict[str, Any] = {}
    for name, (factory, kwargs) in variants.items():
        model, optimizer = build_dlrm()
        plan = factory(model, optimizer, torch.device("cpu"), **kwargs).plan
        analysis = analyze(plan, batch, warmup=1)
        out[name] = (pairs(analysis.missing_deps), pairs(analysis.warnings))
        if name == "SemiSync/start_batch=0":  # deliberately stale: accepted, it is clean
            out["SemiSync/reason"] = analysis.missing_deps[0][3] if analysis.missing_deps else None
            out["SemiSync/accepted"] = pairs(analyze(plan, batch, warmup=1,
                                                     accept=[("EmbLookup", "EmbBackward")]).missing_deps)
    return out


TRAINING_WARNINGS = [ZERO_GRAD]
TORCHREC_EXPECTED: Dict[str, Found] = {
    "Base": ([], TRAINING_WARNINGS), "PT2": ([], TRAINING_WARNINGS), "SparseDist": ([], TRAINING_WARNINGS),
    "SparseDistLite": ([], TRAINING_WARNINGS), "Prefetch": ([], TRAINING_WARNINGS),
    "SemiSync": ([], TRAINING_WARNINGS),  # start_batch 900: the lookups are synchronous
    # WaitBatch reads ctx.data with no dependency on H2D: only the shared thread group orders them
    "FusedSparseDist": ([], [ZERO_GRAD]),
    "SemiSync/start_batch=0": ([("EmbLookup", "EmbBackward", "inter")], TRAINING_WARNINGS),
    "EvalSparseDist": ([], []), "EvalFusedSparseDist": ([], []),
}


def test_every_torchrec_plan_on_two_ranks_has_no_missing_dependency_but_semi_syncs_deliberate_one() -> None:
    pytest.importorskip("torchrec.distributed")
    from dist_harness import run_on_ranks

    for rank, found in enumerate(run_on_ranks(torchrec_analyses, world_size=2, timeout=240)):
        for name, expected in TORCHREC_EXPECTED.items():
            assert found[name] == expected, f"rank {rank} {name}"
        assert found["SemiSync/accepted"] == []
        reason = found["SemiSync/reason"]  # the tables are the rank's shards (t2 is row-wise, on both)
        assert reason.startswith("EmbLookup reads `rt.model.model.sparse_arch.embedding_bag_collection.embedding_bags.")
        assert "`rt.model.model.sparse_arch.embedding_bag_collection.embedding_bags.t2.weight`" in reason
        assert reason.endswith(
            "which EmbBackward writes; in a pipelined run EmbLookup(i+1) runs before EmbBackward(i): add "
            "(\"EmbLookup\", \"EmbBackward\") to inter_iter_deps and move EmbLookup to stage 2 or later, or "
            "EmbBackward to stage 2 or earlier (a dependency's stage may be at most the task's stage + 1)")


# -- weights a later stage's optimizer step updates -----------------------------------------------------------


def training_plan(stages: Tuple[int, int, int], hand_written: bool = False) -> Tuple[PipelinePlan, Any]:
    """Forward / Backward / Step of a small model, each on a thread group and stream of its own."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def forward(ctx: IterContext) -> None:
        ctx.loss = model(ctx.batch).pow(2).mean()

    def backward(ctx: IterContext) -> None:
        ctx.loss.backward()

    def step(ctx: IterContext) -> None:
        if hand_written:
            with torch.no_grad():
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-0.1)
                    p.grad = None
        else:
            opt.step()
            opt.zero_grad()

    tasks = [PipelineTask("Forward", forward), PipelineTask("Backward", backward), PipelineTask("Step", step)]
    schedule = {t: TaskSchedule(stage=s, thread_group=t.name, stream=t.name) for t, s in zip(tasks, stages)}
    return PipelinePlan(schedule, [("Backward", "Forward"), ("Step", "Backward")]), model


STALENESS_TAIL = (
    "These are a module's weights: this placement runs Forward(i+{gap}) in the same period as Step(i) (Step is "
    "{gap} stage{s} later), so Forward(i+{gap}) would train on weights {gap} step{s} old, or {newer} if Step(i) "
    "finished first, or a mix of both if it is halfway, by timing. The dependency gives the serial loop's answer "
    "and makes Forward wait for the step; to overlap them on purpose, train on weights exactly {gap} step{s} old, "
    "one version per iteration: versions = swpipeline.WeightVersions(model, staleness={gap}), the model run under "
    "`with versions.use(ctx):` in Forward, versions.step(ctx, optimizer) in Step, and versions.deps(Forward, Step), "
    "which is (\"Forward\", \"Step\", {distance}), in inter_iter_deps")


@pytest.mark.parametrize("hand_written", [False, True], ids=["torch-optimizer", "p.data-update"])
@pytest.mark.parametrize("stages, gap", [((0, 0, 1), 1), ((0, 1, 1), 1), ((0, 1, 2), 2)])
def test_a_step_on_a_later_stage_is_named_with_the_staleness_it_implies_and_both_fixes(
        stages: Tuple[int, int, int], gap: int, hand_written: bool) -> None:
    plan, _ = training_plan(stages, hand_written)
    analysis = analyze(plan, torch.randn(3, 4))
    assert pairs(analysis.missing_deps) == [("Forward", "Step", "inter")] and analysis.warnings == []
    reason = analysis.missing_deps[0][3]
    moves = "" if gap == 1 else (" and move Forward to stage 1 or later, or Step to stage 1 or earlier (a "
                                 "dependency's stage may be at most the task's stage + 1)")
    assert reason.endswith(
        f'in a pipelined run Forward(i+1) may run before Step(i): add ("Forward", "Step") to inter_iter_deps{moves}. '
        + STALENESS_TAIL.format(gap=gap, s="s" if gap > 1 else "", distance=gap + 1,
                                newer="the serial loop's" if gap == 1 else "1 step old"))


def test_a_step_on_the_same_stage_but_another_thread_group_only_needs_the_dependency() -> None:
    # Step(i) runs in an earlier period than Forward(i+1): declaring the pair costs no overlap, nothing is stale
    plan, _ = training_plan((0, 0, 0))
    reason = analyze(plan, torch.randn(3, 4)).missing_deps[0][3]
    assert reason.endswith('in a pipelined run Forward(i+1) may run before Step(i): add ("Forward", "Step") to '
                           'inter_iter_deps')


def test_weights_written_without_their_gradients_get_no_staleness_hint() -> None:
    # An embedding update fused into the backward (as TorchRec's) writes the weights without a .grad: not a step.
    table = torch.nn.Embedding(6, 2)

    def lookup(ctx: IterContext) -> None:
        ctx.rows = table(ctx.batch).sum()

    def update(ctx: IterContext) -> None:
        with torch.no_grad():
            table.weight.add_(0.5)

    plan = PipelinePlan({PipelineTask("Lookup", lookup): TaskSchedule(stage=0, thread_group="a", stream="a"),
                         PipelineTask("Update", update): TaskSchedule(stage=1, thread_group="b", stream="b")},
                        [("Update", "Lookup")])
    reason = analyze(plan, torch.tensor([1, 2])).missing_deps[0][3]
    assert reason.endswith('add ("Lookup", "Update") to inter_iter_deps') and "WeightVersions" not in reason
