"""The staleness trade-off: the exact plan beside the one ``WeightVersions`` makes exact, with their speeds.

A training loop on one thread gets faster when ``Forward(i+1)`` may overlap ``Step(i)``,
but dropping that order trains on weights one step old or current, by timing. With
``--weight-versions Forward,Step`` the command shows what that overlap is: the exact plan
(the default suggestion, the serial loop's answer) beside a plan with
``versions.deps(Forward, Step)``, whose runs are the same on both engines and in
``run_serial`` at staleness ``k``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Tuple

import pytest
import torch

from swpipeline import PipelinePlan, TaskSchedule, WeightVersions
from swpipeline.cli import main
from swpipeline.tuning.overheads import EngineOverheads
from swpipeline.tuning.staleness import chain_between, weight_versions_search
from test_kept_orders import COSTS, GROUPS, LOAD_DROPS, TrainingLoop, one_thread_trace, train

PLAN_ARGS = ["--overheads", "zero", "--skip-first", "0", "--max-in-flight", "3", "--thread-groups", "default,g1,g2"]
DROP_LOAD = [arg for t, d, _ in LOAD_DROPS for arg in ("--drop-order", f"{t},{d},inter")]
Result = Tuple[List[torch.Tensor], torch.Tensor]


def plan_output(argv: List[str], capsys: pytest.CaptureFixture[str]) -> List[str]:
    assert main(argv) == 0
    return capsys.readouterr().out.splitlines()


def test_the_trade_off_is_the_exact_plan_beside_the_weight_versions_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    one_thread_trace(path, TrainingLoop())
    out = plan_output(["plan", str(path), *PLAN_ARGS, *DROP_LOAD, "--weight-versions", "Forward,Step"], capsys)
    assert "where one of them is a forward" not in " ".join(out)  # the trade-off is shown, not pointed to
    start = out.index("the staleness trade-off (--weight-versions Forward,Step): the exact plan keeps Forward(i+1) "
                      "after Step(i), as the serial loop runs; with WeightVersions, Forward(i) computes on the weights "
                      "after Step(i-2) (staleness 1), one version per iteration, the same in every run and on both "
                      "engines")
    assert out[start + 1:] == [
        "",
        "                          traced plan    exact  WeightVersions, staleness 1",
        "------------------------  -----------  -------  ---------------------------",
        "ms/iteration (whole run)       10.000    7.150                        4.300",
        "ms/iteration (steady)          10.000    7.000                        4.000",
        "iterations/s                    100.0    139.9                        232.6",
        "live contexts (peak)                1        2                            3",
        "depth                               1        2                            3",
        "thread groups                       1        2                            3",
        "streams                             1        2                            3",
        "critical path mostly             Step  Forward                      Forward",
        "predicted speedup               1.00x    1.40x                        2.33x",
        "",
        "the WeightVersions plan: versions = swpipeline.WeightVersions(model, staleness=1), the model run under "
        "`with versions.use(ctx):` in Forward, versions.step(ctx, optimizer) in Step, and versions.deps(Forward, "
        "Step), which is (\"Forward\", \"Step\", 2), in inter_iter_deps:",
        "task      thread   stream   stage  globally ordered",
        "--------  -------  -------  -----  ----------------",
        "Load      g2       g2           0",
        "Forward   default  default      0",
        "Backward  default  default      0",
        "Step      g1       g1           2",
        "dependencies: Forward <- Load, Backward <- Forward, Step <- Backward, Forward <- Step(i-2)"]
    # the exact plan, the suggestion, is the one the trade-off compares with
    suggestion = out.index("suggestion (exhaustive, 67 plans simulated, at most 3 iterations alive):")
    assert out[suggestion + 6] == "Step      g1       g1           1"


def test_a_declared_forward_after_step_is_what_the_versions_replace(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    one_thread_trace(path, TrainingLoop())
    data = json.loads(path.read_text())
    data["otherData"]["plan"]["inter"] = [["Forward", "Step"]]  # as the plan declared it
    path.write_text(json.dumps(data))
    out = plan_output(["plan", str(path), *PLAN_ARGS, *DROP_LOAD, "--weight-versions", "Forward,Step"], capsys)
    assert "the suggestion drops 1 of the 3 orders the traced run got from its placement alone, as --drop-order " \
           "asks:" in out
    assert not any(line.startswith("a plan predicted") for line in out)  # the dependency holds Forward back
    assert "predicted speedup               1.00x    1.40x                        2.33x" in out
    assert out[-1] == "dependencies: Forward <- Load, Backward <- Forward, Step <- Backward, Forward <- Step(i-2)"


def test_orders_kept_that_hold_the_forward_back_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    one_thread_trace(path, TrainingLoop())
    out = plan_output(["plan", str(path), *PLAN_ARGS, "--weight-versions", "Forward,Step"], capsys)
    assert out[-1] == (
        "the staleness trade-off (--weight-versions Forward,Step): the orders kept still run Forward(i+1) after "
        "Step(i) (Load(i+1) after Step(i)), so Forward cannot overlap Step even with WeightVersions; where nothing "
        "needs them, run again with --drop-order Load,Step,inter")


class VersionedLoop(TrainingLoop):
    """The same loop, its forward on a version of the weights and its step through ``WeightVersions``."""

    def __init__(self, staleness: int) -> None:
        self.staleness = staleness
        super().__init__()

    def reset(self) -> None:
        super().reset()
        self.versions = WeightVersions(self.model, self.staleness)

    def _forward(self, ctx: Any) -> None:
        with self.versions.use(ctx):
            out = self.model(ctx.x)
        ctx.loss = torch.nn.functional.mse_loss(out, ctx.y)

    def _step(self, ctx: Any) -> None:
        self.versions.step(ctx, self.optimizer)
        self.losses.append(ctx.loss.detach())

    def result(self) -> Result:
        self.versions.close()
        return super().result()


def test_the_weight_versions_plan_trains_the_same_on_both_engines_and_in_run_serial() -> None:
    loop = VersionedLoop(staleness=1)
    baseline = PipelinePlan({t: TaskSchedule(0) for t in loop.tasks}, loop.intra)
    intra = [(t.name, d.name) for t, d in loop.intra]
    choice = weight_versions_search(baseline, intra, [], "Forward", "Step",
                                    [(t, d, 1) for t, d, _ in LOAD_DROPS], costs=COSTS, max_in_flight=3,
                                    thread_groups=GROUPS, overheads=EngineOverheads.zero())
    assert (choice.staleness, choice.dependency, choice.waits) == (1, ("Forward", "Step", 2), ())
    assert choice.search is not None
    plan = choice.search.plan
    assert choice.search.kept_orders == ()  # every order of the one thread is dropped or replaced by the versions
    assert plan.inter["Forward"] == [("Step", 2)]
    assert {n: (s.stage, s.thread_group) for n, s in plan.schedules.items()} == {
        "Load": (0, "g1"), "Forward": (0, "default"), "Backward": (0, "default"), "Step": (2, "g2")}
    expected = train(loop, plan, "serial")
    for how in ("clocked", "dataflow", "clocked", "dataflow", "clocked", "dataflow"):
        got = train(loop, plan, how)
        assert torch.equal(got[1], expected[1]), how
        assert all(torch.equal(a, b) for a, b in zip(got[0], expected[0])), how
    exact = TrainingLoop()  # the trade-off: the serial loop's answer differs from the one on stale weights
    assert not torch.equal(train(exact, exact.one_thread(), "serial")[1], expected[1])


def test_the_tasks_the_versions_cover_run_from_the_forward_to_the_step() -> None:
    names = ["Load", "Forward", "Loss", "Backward", "Clip", "Step", "Log"]
    intra = [("Forward", "Load"), ("Loss", "Forward"), ("Backward", "Loss"), ("Clip", "Backward"), ("Step", "Clip"),
             ("Log", "Loss")]
    assert chain_between(names, intra, "Forward", "Step") == ["Forward", "Loss", "Backward", "Clip", "Step"]
