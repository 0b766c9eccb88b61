"""infer_deps(): a plan's dependencies derived from what its tasks touch, minimal and ready to run.

On a forward/backward/optimizer loop and on the demo it recovers the hand-written
ordering (equal up to transitive reduction), and the plan built from it runs pipelined,
on both engines and with every task on a thread group and stream of its own where the
stages allow, with losses bitwise equal to run_serial.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import pytest
import torch

import seed_plans
from swpipeline import DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
from swpipeline import analyze, infer_deps
from swpipeline.analysis.report import reduce_edges
from swpipeline.cli.demo import DemoConfig, TrainingJob, make_raw_batch
from swpipeline.devices.device import resolve_device
from test_analysis import SEED_BATCH, SeedJob

Names = List[Tuple[str, str]]


def names(found: Sequence[Tuple[PipelineTask, PipelineTask]]) -> Names:
    return [(task.name, dep.name) for task, dep in found]


class Loop:
    """Prepare, forward, backward, optimizer step (zeroing the gradients); records every loss."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.losses: List[torch.Tensor] = []

    def prepare(self, ctx: IterContext) -> None:
        ctx.x = ctx.batch * 0.5

    def forward(self, ctx: IterContext) -> None:
        ctx.loss = self.model(ctx.x).square().mean()

    def backward(self, ctx: IterContext) -> None:
        ctx.loss.backward()

    def step(self, ctx: IterContext) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.losses.append(ctx.loss.detach())

    def schedule(self, own_groups: bool = False) -> Dict[PipelineTask, TaskSchedule]:
        """Prepare at stage 0 on its own thread and stream; the rest at stage 1 (each on its own, if asked)."""
        fns = {"Prepare": self.prepare, "Forward": self.forward, "Backward": self.backward,
               "OptimizerStep": self.step}
        schedule = {}
        for name, fn in fns.items():
            own = own_groups or name == "Prepare"
            schedule[PipelineTask(name, fn)] = TaskSchedule(stage=0 if name == "Prepare" else 1,
                                                            stream=name if own else None,
                                                            thread_group=name if own else "default")
        return schedule


BATCHES = [torch.randn(5, 3, generator=torch.Generator().manual_seed(k)) for k in range(8)]
HAND_WRITTEN_INTRA = [("Forward", "Prepare"), ("Backward", "Forward"), ("OptimizerStep", "Backward")]
HAND_WRITTEN_INTER = [("Forward", "OptimizerStep")]


def plan_from(schedule: Dict[PipelineTask, TaskSchedule], intra: Names, inter: Names) -> PipelinePlan:
    return PipelinePlan(schedule, list(intra), list(inter))


def test_a_training_loop_gets_the_hand_written_dependencies_back() -> None:
    schedule = Loop().schedule()
    intra, inter = infer_deps(schedule, BATCHES[0])
    assert names(intra) == HAND_WRITTEN_INTRA and names(inter) == HAND_WRITTEN_INTER
    tasks = list(schedule)
    assert intra[0] == (tasks[1], tasks[0])  # the schedule's own task objects, ready for PipelinePlan
    redundant_intra = HAND_WRITTEN_INTRA + [("OptimizerStep", "Forward"), ("Backward", "Prepare")]
    redundant_inter = HAND_WRITTEN_INTER + [("Backward", "OptimizerStep"), ("OptimizerStep", "Forward")]
    task_names = [t.name for t in tasks]
    edges = [(t, d, 0) for t, d in redundant_intra] + [(t, d, 1) for t, d in redundant_inter]
    reduced = reduce_edges(task_names, {}, {}, edges)
    assert [(t, d) for t, d, k in reduced if k == 0] == names(intra)  # equal up to transitive reduction
    assert [(t, d) for t, d, k in reduced if k == 1] == names(inter)


def losses_of(run: Callable[[Loop], None]) -> torch.Tensor:
    loop = Loop()
    run(loop)
    return torch.stack(loop.losses)


@pytest.mark.parametrize("kind", ["SWPipeline", "DataFlowPipeline"])
def test_a_plan_built_from_the_inferred_dependencies_runs_pipelined_as_serial(kind: str) -> None:
    intra, inter = (names(found) for found in infer_deps(Loop().schedule(), BATCHES[0]))

    def serial(loop: Loop) -> None:
        SWPipeline(plan_from(loop.schedule(), intra, inter), device="cpu").run_serial(BATCHES)

    def pipelined(loop: Loop) -> None:
        plan = plan_from(loop.schedule(own_groups=True), intra, inter)  # every task on its own thread and stream
        pipe = SWPipeline(plan, device="cpu") if kind == "SWPipeline" else DataFlowPipeline(plan, max_depth=3,
                                                                                             device="cpu")
        pipe.run(BATCHES)

    expected = losses_of(serial)
    assert len(expected) == len(BATCHES)
    assert torch.equal(losses_of(pipelined), expected)


def demo_job() -> Tuple[TrainingJob, DemoConfig]:
    cfg = DemoConfig(iters=6, batch_size=16, table_sizes=(30, 20), warmup_iters=0)
    return TrainingJob(cfg, resolve_device("cpu")), cfg


def test_the_demo_gets_its_dependencies_back_plus_the_one_its_placement_provides() -> None:
    job, cfg = demo_job()
    intra, inter = infer_deps(dict(job.plan.schedule), make_raw_batch(cfg, 0))
    hand_written = [(t, d) for t, deps in job.plan.intra.items() for d in deps]
    assert sorted(names(intra)) == sorted(hand_written)
    # the demo leaves Forward(i) after OptimizerStep(i-1) to its one thread group and stream; inferred, it is explicit
    assert names(inter) == [("Forward", "OptimizerStep")]


@pytest.mark.parametrize("kind", ["SWPipeline", "DataFlowPipeline"])
def test_the_demo_with_inferred_dependencies_on_separate_threads_matches_serial(kind: str) -> None:
    job, cfg = demo_job()
    batches = [make_raw_batch(cfg, k) for k in range(cfg.iters)]
    intra, inter = (names(found) for found in infer_deps(dict(job.plan.schedule), batches[0]))

    def rebuilt(job: TrainingJob, own_groups: bool) -> PipelinePlan:
        schedule = {}
        for task in job.plan.tasks:
            sched = job.plan.schedules[task.name]
            if own_groups and sched.thread_group == "default":
                sched = TaskSchedule(stage=sched.stage, stream=task.name, thread_group=task.name)
            schedule[PipelineTask(task.name, task.fn)] = sched
        return plan_from(schedule, intra, inter)

    serial_job, _ = demo_job()
    SWPipeline(rebuilt(serial_job, False), device="cpu").run_serial(batches)
    pipelined_job, _ = demo_job()
    plan = rebuilt(pipelined_job, True)
    pipe = SWPipeline(plan, device="cpu") if kind == "SWPipeline" else DataFlowPipeline(plan, max_depth=4, device="cpu")
    pipe.run(batches)
    assert torch.equal(torch.stack(pipelined_job.losses), torch.stack(serial_job.losses))
    assert len(serial_job.losses) == cfg.iters


def test_the_seed_shaped_pt2_schedule_gets_a_chain_its_serial_run_needs() -> None:
    plan = seed_plans.pt2(make_fn=SeedJob().fn)
    intra, inter = infer_deps({t: plan.schedules[t.name] for t in plan.tasks}, SEED_BATCH, warmup=1)
    assert names(intra) == [("H2D", "LoadBatch"), ("InputTransform", "H2D"), ("Forward", "InputTransform"),
                            ("Backward", "ZeroGrad"), ("Backward", "Forward"), ("OptimizerStep", "Backward")]
    assert names(inter) == [("ZeroGrad", "OptimizerStep"), ("Forward", "OptimizerStep")]
    job = SeedJob()
    inferred = plan_from({PipelineTask(t.name, job.fn(t.name)): plan.schedules[t.name] for t in plan.tasks},
                         names(intra), names(inter))
    analysis = analyze(inferred, SEED_BATCH, warmup=1)
    assert analysis.missing_deps == [] and analysis.warnings == []


def test_a_dependency_the_stages_forbid_is_refused_with_the_stages_that_work() -> None:
    schedule = Loop().schedule()
    by_name = {t.name: t for t in schedule}
    schedule[by_name["Prepare"]] = TaskSchedule(stage=1, stream="prep", thread_group="prep")
    schedule[by_name["Forward"]] = TaskSchedule(stage=0)  # a stage before Prepare: it cannot wait for its ctx.x
    with pytest.raises(ValueError) as info:
        infer_deps(schedule, BATCHES[0])
    assert str(info.value) == (
        "infer_deps: Forward reads `ctx.x`, which Prepare writes (within the iteration), so Forward must depend on "
        "Prepare, which the stages forbid: move Forward to stage 1 or later, or Prepare to stage 0 or earlier (a "
        "dependency's stage may be at most the task's stage)")


def test_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="infer_deps: schedule must be a dict of PipelineTask -> TaskSchedule"):
        infer_deps([], BATCHES[0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="infer_deps: schedule keys must be PipelineTask objects"):
        infer_deps({"A": TaskSchedule()}, BATCHES[0])  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="infer_deps: schedule is empty"):
        infer_deps({}, BATCHES[0])
    with pytest.raises(TypeError, match="infer_deps: warmup must be an int"):
        infer_deps(Loop().schedule(), BATCHES[0], warmup=1.5)  # type: ignore[arg-type]
