"""Every error on the way to a versioned plan leads to a plan that is accepted.

The story (a bug): forward on stage 0, backward on stage 1, the step on stage 2, each on a
thread group of its own, and ``WeightVersions(model, staleness=0)`` with
``versions.deps(forward, step)`` in ``inter_iter_deps``. The plan refused that dependency
(the step is two stages later; a distance-1 dependency may be at most one) and suggested
declaring ``('Forward', 'Step', 2)``; doing that, the run failed with "put
versions.deps(forward, step) in the plan's inter_iter_deps", the very pair just refused.
Here each message is followed literally, by a program: the triple or the staleness is read
out of the message, and the last plan must be accepted, run, and equal ``run_serial``.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Callable, List, Optional, Tuple

import pytest
import torch

from swpipeline import (DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule,
                        WeightVersions)
from test_weights import batches, loss_of, mlp

pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")

STAGES = {"Forward": 0, "Backward": 1, "Step": 2}


class Training:
    """One model, its optimizer and WeightVersions, the three tasks, and a plan built from a dependency."""

    def __init__(self, staleness: int) -> None:
        self.model = mlp()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.versions = WeightVersions(self.model, staleness=staleness)
        self.losses: List[torch.Tensor] = []

    def forward(self, ctx: IterContext) -> None:
        with self.versions.use(ctx):
            ctx.loss = loss_of(self.model(ctx.batch[0]), ctx.batch[1])

    def backward(self, ctx: IterContext) -> None:
        ctx.loss.backward()

    def step(self, ctx: IterContext) -> None:
        self.versions.step(ctx, self.opt)
        self.losses.append(ctx.loss.detach())

    def plan(self, dependency: Tuple[Any, Any, int]) -> PipelinePlan:
        tasks = {name: PipelineTask(name, fn) for name, fn in
                 (("Forward", self.forward), ("Backward", self.backward), ("Step", self.step))}
        schedule = {task: TaskSchedule(stage=STAGES[name], thread_group=name.lower(), stream=name.lower())
                    for name, task in tasks.items()}
        return PipelinePlan(schedule, intra_iter_deps=[("Backward", "Forward"), ("Step", "Backward")],
                            inter_iter_deps=[dependency])


def build(engine: str, plan: PipelinePlan) -> Any:
    """The engine on ``plan``; DataFlowPipeline's depth is what its own error asks for, when it asks."""
    if engine == "SWPipeline":
        return SWPipeline(plan, device="cpu")
    try:
        return DataFlowPipeline(plan, device="cpu")
    except ValueError as exc:
        depth = re.search(r"use max_depth >= (\d+)", str(exc))
        if depth is None:
            raise
        return DataFlowPipeline(plan, device="cpu", max_depth=int(depth.group(1)))


def declared_triple(message: str) -> Tuple[str, str, int]:
    """The triple the plan's stage error says to declare, read as the literal it prints."""
    found = re.search(r"declare (\('[^']*', '[^']*', \d+\)) in inter_iter_deps", message)
    assert found is not None, message
    triple: Tuple[str, str, int] = ast.literal_eval(found.group(1))
    return triple


def suggested_staleness(message: str, plan: PipelinePlan, forward: str, step: str) -> int:
    """The staleness the forward's error says to make WeightVersions with: the stage gap minus one."""
    assert "make the WeightVersions with staleness = the stage gap - 1" in message, message
    return plan.stage(step) - plan.stage(forward) - 1


def follow_to_an_accepted_plan(engine: str, first_message: Callable[[str], Optional[int]]
                               ) -> Tuple[Training, Any, List[str]]:
    """Start at staleness 0 with versions.deps; follow each error literally until a plan runs; returns the last
    training and pipeline (the run's result is checked by the caller) and the errors met on the way.
    ``first_message`` picks which of the plan error's two suggestions is followed."""
    data = batches(6)
    trail: List[str] = []
    training = Training(staleness=0)
    dependency: Tuple[Any, Any, int] = training.versions.deps("Forward", "Step")
    for _ in range(4):  # each suggestion once, at most
        plan = training.plan(dependency)
        try:
            pipe = build(engine, plan)
        except ValueError as exc:
            message = str(exc)
            trail.append("plan")
            staleness = first_message(message)
            if staleness is None:
                dependency = declared_triple(message)
            else:
                training.versions.close()
                training = Training(staleness=staleness)
                dependency = training.versions.deps("Forward", "Step")
            continue
        try:
            pipe.run(data)
        except RuntimeError as exc:
            message = str(exc)
            trail.append("forward")
            assert "put versions.deps(forward, step)" in message, message
            staleness = suggested_staleness(message, plan, "Forward", "Step")
            training.versions.close()
            training = Training(staleness=staleness)
            dependency = training.versions.deps("Forward", "Step")
            continue
        return training, pipe, trail
    raise AssertionError("the errors went round in a circle: no plan was accepted")


def the_declared_triple(message: str) -> Optional[int]:
    """Follow the plan error's first suggestion: declare the triple it prints (None: no new staleness)."""
    return None


def the_weight_versions_clause(message: str) -> Optional[int]:
    """Follow the plan error's clause for a module's weights: the staleness it names."""
    found = re.search(r"WeightVersions made with staleness=(\d+)", message)
    assert found is not None, message
    return int(found.group(1))


@pytest.mark.parametrize("follow", [the_declared_triple, the_weight_versions_clause],
                         ids=["declare-the-triple", "raise-the-staleness"])
@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_the_stage_errors_at_staleness_0_lead_to_a_plan_that_runs(engine: str, follow: Any) -> None:
    training, pipe, trail = follow_to_an_accepted_plan(engine, follow)
    assert trail == (["plan", "forward"] if follow is the_declared_triple else ["plan"])
    assert training.versions.staleness == 1  # the least the placement allows (stage gap 2 <= distance 2)
    assert list(pipe.plan.inter["Forward"]) == [("Step", 2)]
    serial = Training(staleness=1)
    serial_pipe = build(engine, serial.plan(serial.versions.deps("Forward", "Step")))
    serial_pipe.run_serial(batches(6))
    for p, q in zip(training.model.parameters(), serial.model.parameters()):
        assert torch.equal(p, q)
    assert len(training.losses) == len(serial.losses) == 6
    assert all(torch.equal(a, b) for a, b in zip(training.losses, serial.losses))
    for t in (training, serial):
        t.versions.close()


def test_the_forward_error_says_what_to_do_when_the_plan_refuses_the_dependency() -> None:
    training = Training(staleness=0)
    pipe = SWPipeline(training.plan(("Forward", "Step", 2)), device="cpu")
    with pytest.raises(RuntimeError) as info:
        pipe.run(batches(4))
    message = str(info.value)
    assert ("put versions.deps(forward, step), which is (forward, step, 1) at staleness 0, in the plan's "
            "inter_iter_deps") in message
    assert ("If the plan refuses that dependency because the step is more than 1 stage after the forward, "
            "make the WeightVersions with staleness = the stage gap - 1") in message
    training.versions.close()


def test_the_plan_error_names_the_staleness_whose_deps_it_suggests() -> None:
    training = Training(staleness=0)
    with pytest.raises(ValueError) as info:
        SWPipeline(training.plan(training.versions.deps("Forward", "Step")), device="cpu")
    message = str(info.value)
    assert declared_triple(message) == ("Forward", "Step", 2)
    assert ("(for a module's weights: versions.deps('Forward', 'Step') of a WeightVersions made with staleness=1 "
            "gives that triple)") in message
    training.versions.close()
