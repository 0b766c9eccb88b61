"""The planner keeps the orders a plan got from its placement alone, but those the user drops by name.

A training loop (a small MLP, SGD) with every model task on one thread works only because
``Forward(i+1)`` runs after ``Step(i)`` there; a search that moves ``Step`` to a thread of its
own without that order races (autograd's in-place error). Every suggestion keeps it unless
``drop_orders`` names it, and runs on both engines exactly as the serial loop does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Tuple

import pytest
import torch

from swpipeline import (DataFlowPipeline, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule, analyze,
                        autoplan, search_plan, simulate)
from swpipeline.cli import main
from swpipeline.tuning.kept_orders import analysis_orders, orders_dropped, placement_orders
from swpipeline.tuning.overheads import EngineOverheads

Batch = Tuple[torch.Tensor, torch.Tensor]
COSTS = {"Load": 0.003, "Forward": 0.002, "Backward": 0.002, "Step": 0.003}
GROUPS = ["default", "g1", "g2"]
LOAD_DROPS = [("Load", "Forward", "inter"), ("Load", "Backward", "inter"), ("Load", "Step", "inter")]
EVERY_ORDER = [("Load", "Forward", 1), ("Load", "Backward", 1), ("Load", "Step", 1), ("Forward", "Backward", 1),
               ("Forward", "Step", 1), ("Backward", "Step", 1)]


class TrainingLoop:
    """Load -> Forward -> Backward -> Step on a small MLP with SGD; ``reset()`` starts from the same weights."""

    def __init__(self) -> None:
        self.reset()
        self.load = PipelineTask("Load", self._load)
        self.forward = PipelineTask("Forward", self._forward)
        self.backward = PipelineTask("Backward", self._backward)
        self.step = PipelineTask("Step", self._step)
        self.tasks = [self.load, self.forward, self.backward, self.step]
        self.intra = [(self.forward, self.load), (self.backward, self.forward), (self.step, self.backward)]

    def reset(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.losses: List[torch.Tensor] = []

    def _load(self, ctx: Any) -> None:
        ctx.x, ctx.y = ctx.batch[0] * 2, ctx.batch[1]

    def _forward(self, ctx: Any) -> None:
        ctx.loss = torch.nn.functional.mse_loss(self.model(ctx.x), ctx.y)

    def _backward(self, ctx: Any) -> None:
        ctx.loss.backward()

    def _step(self, ctx: Any) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.losses.append(ctx.loss.detach())

    def one_thread(self) -> PipelinePlan:
        """The hand-written plan: every task on the default thread, no inter-iteration dependency declared."""
        return PipelinePlan({t: TaskSchedule(0) for t in self.tasks}, self.intra)

    def result(self) -> Tuple[List[torch.Tensor], torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()], torch.stack(self.losses)


def batches() -> List[Batch]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 8, generator=gen), torch.randn(32, 1, generator=gen)) for _ in range(24)]


def train(loop: TrainingLoop, plan: PipelinePlan, how: str, depth: int = 3) -> Tuple[List[torch.Tensor], torch.Tensor]:
    loop.reset()
    if how == "serial":
        SWPipeline(plan, device="cpu").run_serial(batches())
    elif how == "clocked":
        SWPipeline(plan, device="cpu").run(batches())
    else:
        DataFlowPipeline(plan, max_depth=depth, device="cpu").run(batches())
    return loop.result()


def assert_bitwise_equal(got: Tuple[List[torch.Tensor], torch.Tensor],
                         expected: Tuple[List[torch.Tensor], torch.Tensor]) -> None:
    assert torch.equal(got[1], expected[1])
    assert all(torch.equal(a, b) for a, b in zip(got[0], expected[0]))


def analysis_of(loop: TrainingLoop) -> Any:
    loop.reset()
    return analyze(loop.one_thread(), batches()[0], warmup=1)


def test_the_analysis_names_the_order_the_one_thread_plan_relies_on() -> None:
    loop = TrainingLoop()
    analysis = analysis_of(loop)
    assert analysis_orders(analysis) == [("Forward", "Step", 1)]
    # from the placement alone, without the analysis: enough to keep every order it gives (Load(i+1) after
    # Step(i) implies Forward(i+1) after Step(i)), and every one of them for a person to judge
    assert placement_orders(loop.one_thread()) == [("Load", "Step", 1)]
    assert placement_orders(loop.one_thread(), minimal=False) == [
        ("Load", "Forward", 1), ("Load", "Backward", 1), ("Load", "Step", 1), ("Forward", "Backward", 1),
        ("Forward", "Step", 1), ("Backward", "Step", 1)]


def test_a_search_that_drops_every_order_of_the_placement_drops_the_one_the_step_needs() -> None:
    loop = TrainingLoop()
    free = search_plan(loop.tasks, loop.intra, [], COSTS, max_in_flight=3, thread_groups=GROUPS,
                       baseline=loop.one_thread(), drop_orders=[(t, d, "inter") for t, d, _ in EVERY_ORDER])
    assert (free.kept_orders, free.dropped_orders) == ((), tuple(EVERY_ORDER))
    assert free.plan.schedules["Step"].thread_group != free.plan.schedules["Forward"].thread_group
    assert orders_dropped(free.plan, analysis_orders(analysis_of(loop))) == [("Forward", "Step", 1)]


@pytest.mark.parametrize("keep", ["default", "analysis", "entries"])
def test_the_suggestion_keeps_the_order_and_trains_like_the_serial_loop_on_both_engines(keep: str) -> None:
    loop = TrainingLoop()
    analysis = analysis_of(loop)
    keep_orders: Any = {"default": None, "analysis": analysis, "entries": [("Forward", "Step", "inter")]}[keep]
    found = search_plan(loop.tasks, loop.intra, [], COSTS, max_in_flight=3, thread_groups=GROUPS,
                        baseline=loop.one_thread(), keep_orders=keep_orders, drop_orders=LOAD_DROPS)
    plan = found.plan
    assert found.kept_orders == ((("Forward", "Backward", 1), ("Forward", "Step", 1), ("Backward", "Step", 1))
                                 if keep == "default" else ())  # else the dependency kept gives them
    assert not found.kept_baseline and found.speedup is not None and found.speedup > 1.3  # Load moved off
    assert {n: (s.stage, s.thread_group) for n, s in plan.schedules.items()} == {
        "Load": (0, "g1"), "Forward": (1, "default"), "Backward": (1, "default"), "Step": (1, "default")}
    assert plan.inter["Forward"] == [("Step", 1)]  # declared: kept on any thread or stream
    assert orders_dropped(plan, analysis_orders(analysis)) == []
    expected = train(loop, loop.one_thread(), "serial")
    assert_bitwise_equal(train(loop, plan, "serial"), expected)
    assert_bitwise_equal(train(loop, plan, "clocked"), expected)
    assert_bitwise_equal(train(loop, plan, "dataflow", depth=3), expected)
    assert autoplan(loop.tasks, loop.intra, [], COSTS, max_in_flight=3, thread_groups=GROUPS,
                    baseline=loop.one_thread(), keep_orders=keep_orders, drop_orders=LOAD_DROPS) == plan


def test_a_kept_baseline_that_races_comes_back_with_the_order_declared() -> None:
    loop = TrainingLoop()
    analysis = analysis_of(loop)
    racing = PipelinePlan({loop.load: TaskSchedule(0), loop.forward: TaskSchedule(0),
                           loop.backward: TaskSchedule(0), loop.step: TaskSchedule(0, "opt", "opt")}, loop.intra)
    found = search_plan(loop.tasks, loop.intra, [], COSTS, max_in_flight=1, thread_groups=["default", "opt"],
                        baseline=racing, keep_orders=analysis, tolerance=0.05)
    assert found.kept_baseline and found.plan is not racing
    assert {n: (s.stage, s.thread_group) for n, s in found.plan.schedules.items()} == {
        n: (s.stage, s.thread_group) for n, s in racing.schedules.items()}
    assert found.plan.inter["Forward"] == [("Step", 1)]
    expected = train(loop, loop.one_thread(), "serial")
    assert_bitwise_equal(train(loop, found.plan, "clocked"), expected)
    assert_bitwise_equal(train(loop, found.plan, "dataflow", depth=1), expected)


def test_an_order_against_the_dependencies_is_refused() -> None:
    with pytest.raises(ValueError) as exc:
        search_plan(["Load", "Forward"], [("Forward", "Load")], [], COSTS, max_in_flight=2,
                    keep_orders=[("Load", "Forward", "intra")])
    assert str(exc.value).startswith("autoplan: keep_orders cannot be kept: an order within one iteration runs "
                                     "against the dependencies (intra_iter_deps: dependency cycle 'Load' -> 'Forward' "
                                     "-> 'Load'")


@pytest.mark.parametrize("keep, error, message", [
    ("Forward", TypeError, "autoplan: keep_orders must be a PlanAnalysis (from analyze()) or a list of (task, "
                           "depends_on, 'intra' or 'inter') entries, got str"),
    ([("Forward", "Step")], TypeError, "autoplan: keep_orders: expected (task, depends_on, 'intra' or 'inter') "
                                       "entries or a PlanAnalysis, got ('Forward', 'Step')"),
    ([("Forward", "Step", "later")], ValueError, "autoplan: keep_orders: the kind of ('Forward', 'Step') must be "
                                                 "'intra' or 'inter' (or the distance 0 or 1), got 'later'"),
    ([("Forward", "Ghost", "inter")], ValueError, "autoplan: keep_orders names unknown task(s) ['Ghost'] (tasks: "
                                                  "['Backward', 'Forward', 'Load', 'Step']); pass the analysis of a "
                                                  "plan of these tasks"),
])
def test_bad_keep_orders_are_refused(keep: Any, error: type, message: str) -> None:
    with pytest.raises(error) as exc:
        search_plan(["Load", "Forward", "Backward", "Step"], [("Forward", "Load")], [], COSTS, max_in_flight=2,
                    keep_orders=keep)
    assert str(exc.value) == message


def one_thread_trace(path: Path, loop: TrainingLoop) -> PipelinePlan:
    """A trace of the one-thread plan as run(trace=...) writes it (with its dependencies), from exact costs."""
    plan = loop.one_thread()
    trace = simulate(plan, COSTS, 20, overheads=EngineOverheads.zero()).timeline().to_chrome_trace()
    trace["otherData"]["plan"] = {"intra": [[t.name, d.name] for t, d in loop.intra], "inter": [],
                                  "globally_ordered": []}
    path.write_text(json.dumps(trace))
    return plan


PLAN_ARGS = ["--overheads", "zero", "--skip-first", "0", "--max-in-flight", "3", "--thread-groups", "default,g1,g2"]
SAME_THREAD = "they ran on thread group 'default' and the default stream"
RACES = ("where one of two such tasks writes what the other reads or writes (weights, gradients, a learning rate, a "
         "buffer), a plan that drops their order races")


def test_the_command_line_keeps_every_order_and_names_those_a_faster_plan_drops(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    traced = one_thread_trace(path, TrainingLoop())
    for legacy in ([], ["--keep-orders"]):  # --keep-orders, the old way to ask for the default, still runs
        assert main(["plan", str(path), *PLAN_ARGS, *legacy]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[1] == "dependencies as declared in the trace"
        start = out.index("suggestion (exhaustive, 56 plans simulated, at most 3 iterations alive):")
        assert out[start + 1] == "no plan is predicted faster than the traced one by more than 0.5%: keep it"
        assert out.index("predicted speedup               1.00x      1.00x") == start + 20
        assert out[start + 21:] == [
            "",
            "the suggestion keeps every order the traced run got from its placement alone (6): tasks on one thread or "
            "stream run in a fixed order, and a trace cannot tell which of these orders the tasks need",
            "",
            "a plan predicted 2.33x as fast as the traced one (the suggestion: 1.00x) drops these of them (5):",
            f"  - after Forward(i): Load(i+1); {SAME_THREAD}",
            f"  - after Backward(i): Load(i+1); {SAME_THREAD}",
            f"  - after Step(i): Load(i+1), Forward(i+1), Backward(i+1); {SAME_THREAD}",
            f"{RACES}, and a trace cannot tell. To search without those nothing needs, run again with --drop-order "
            f"for each: --drop-order Load,Forward,inter --drop-order Load,Backward,inter --drop-order Load,Step,inter "
            f"--drop-order Forward,Step,inter --drop-order Backward,Step,inter",
            "where one of them is a forward after the optimizer step that updates its weights, dropping it trains on "
            "weights one step old or current, by timing: --weight-versions FORWARD,STEP shows the plan WeightVersions "
            "makes exact beside the exact one"]
    assert placement_orders(traced, minimal=False) == EVERY_ORDER


def test_the_command_line_drops_the_orders_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    loop = TrainingLoop()
    traced = one_thread_trace(path, loop)
    drops = [arg for t, d, _ in LOAD_DROPS for arg in ("--drop-order", f"{t},{d},inter")]
    assert main(["plan", str(path), *PLAN_ARGS, *drops]) == 0
    out = capsys.readouterr().out.splitlines()
    start = out.index("suggestion (exhaustive, 67 plans simulated, at most 3 iterations alive):")
    assert out[start + 1:start + 8] == [
        "task      thread   stream   stage  globally ordered",
        "--------  -------  -------  -----  ----------------",
        "Load      default  default      0",
        "Forward   default  default      0",
        "Backward  default  default      0",
        "Step      g1       g1           1",
        "dependencies: Forward <- Load, Backward <- Forward, Step <- Backward, Forward <- Step(i-1)"]
    end = out.index("predicted speedup               1.00x      1.40x")
    # the suggestion moves Step, not Load: of the three orders dropped, the placement keeps two
    assert out[end + 1:end + 5] == [
        "",
        "the suggestion drops 1 of the 6 orders the traced run got from its placement alone, as --drop-order asks:",
        f"  - after Step(i): Load(i+1); {SAME_THREAD}",
        f"{RACES}: drop only orders nothing needs"]
    assert out[end + 6] == "a plan predicted 2.33x as fast as the traced one (the suggestion: 1.40x) drops more of " \
                           "them (2):"
    found = search_plan(loop.tasks, loop.intra, [], COSTS, max_in_flight=3, thread_groups=GROUPS, baseline=traced,
                        drop_orders=LOAD_DROPS, num_iterations=20, overheads=EngineOverheads.zero())
    assert {n: (s.stage, s.thread_group) for n, s in found.plan.schedules.items()} == {
        "Load": (0, "default"), "Forward": (0, "default"), "Backward": (0, "default"), "Step": (1, "g1")}
    expected = train(loop, loop.one_thread(), "serial")
    for _ in range(3):
        assert_bitwise_equal(train(loop, found.plan, "clocked"), expected)
        assert_bitwise_equal(train(loop, found.plan, "dataflow"), expected)


def refused(argv: List[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``swpipeline plan`` refusing an option: exit 2, nothing on stdout, one line on stderr."""
    status: object
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse refused the option
        status = exc.code
    captured = capsys.readouterr()
    assert (status, captured.out, captured.err.count("\n")) == (2, "", 1), captured.err
    return captured.err.rstrip("\n")


@pytest.mark.parametrize("option, message", [
    (["--drop-order", "Forward,Stp,inter"],
     "--drop-order Forward,Stp,inter: no task 'Stp' in the trace (its tasks: Load, Forward, Backward, Step)"),
    (["--drop-order", "Step,Load,inter"],
     "--drop-order Step,Load,inter: Step(i+1) after Load(i) is not an order the traced placement alone gave (the "
     "dependencies give it); those it gave: Load,Forward,inter; Load,Backward,inter; Load,Step,inter; "
     "Forward,Backward,inter; Forward,Step,inter; Backward,Step,inter"),
    (["--drop-order", "Load,Step,intra"],
     "--drop-order Load,Step,intra: Load(i) after Step(i) is not an order the traced placement alone gave (the "
     "dependencies run Load first); those it gave: Load,Forward,inter; Load,Backward,inter; Load,Step,inter; "
     "Forward,Backward,inter; Forward,Step,inter; Backward,Step,inter"),
    (["--drop-order", "Forward,Step,inter"],
     "--drop-order Forward,Step,inter: Forward(i+1) after Step(i) still follows from other orders kept (Load(i+1) "
     "after Step(i)); drop those too where nothing needs them: Load,Step,inter"),
    (["--drop-order", "Forward,Step"],
     "argument --drop-order: must be TASK,DEP,intra or TASK,DEP,inter (e.g. Forward,OptimizerStep,inter: "
     "Forward(i+1) after OptimizerStep(i)); got 'Forward,Step'"),
    (["--keep-orders", "--drop-order", "Load,Step,inter"],
     "--keep-orders keeps every order the traced placement gave (the default now) and --drop-order Load,Step,inter "
     "drops one: leave out --keep-orders"),
    (["--keep-order", "Forward,Stp,inter"],
     "--keep-order Forward,Stp,inter: no task 'Stp' in the trace (its tasks: Load, Forward, Backward, Step)"),
    (["--keep-order", "Load,Step,intra"],
     "--keep-order Load,Step,intra: Load runs before Step in an iteration (the plan's dependencies say so); an order "
     "within one iteration can only follow them (or use inter for Load(i+1))"),
    (["--weight-versions", "Forwad,Step"],
     "--weight-versions Forwad,Step: no task 'Forwad' in the trace (its tasks: Load, Forward, Backward, Step)"),
    (["--weight-versions", "Step,Forward"],
     "--weight-versions Step,Forward: Step does not run before Forward in an iteration (no chain of intra-iteration "
     "dependencies leads from Step to Forward); name the forward that reads the weights first, then the optimizer "
     "step that updates them"),
    (["--weight-versions", "Forward"],
     "argument --weight-versions: must be FORWARD,STEP, the task that computes on the weights and the optimizer step "
     "that updates them (e.g. Forward,OptimizerStep); got 'Forward'"),
])
def test_a_bad_order_option_is_one_line_naming_the_tasks(option: List[str], message: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    one_thread_trace(path, TrainingLoop())
    assert refused(["plan", str(path), *option], capsys) == f"swpipeline plan: error: {message}"
