"""By default the planner keeps every order the baseline's placement gives; dropping one is named.

The story: a training loop ran with every task on one thread, and its learning-rate
scheduler (``StepLR``: ``scheduler.step()`` writes the optimizer's ``lr``, a Python float)
declares no dependency. ``analyze()`` cannot see a float being written, so it names one
order only (``Forward(i+1)`` after ``Step(i)``); a search that kept only that one moved the
scheduler to a thread of its own, where ``Step(i)`` read a learning rate one schedule step
early or late, by timing: its runs differed from ``run_serial`` 20 times out of 20. The
placement gave the right orders all along (``StepLR(i)`` after ``Step(i)`` within an
iteration, ``Step(i+1)`` after ``StepLR(i)`` across): the search now keeps every one of them
unless ``drop_orders`` names it, and the suggestion trains bitwise like the serial loop.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import pytest
import torch

from swpipeline import PipelineTask, analyze, search_plan
from swpipeline.tuning.kept_orders import analysis_orders, orders_dropped
from test_kept_orders import TrainingLoop, train

Batch = Tuple[torch.Tensor, torch.Tensor]
Result = Tuple[List[torch.Tensor], torch.Tensor]
COSTS = {"Load": 0.003, "Forward": 0.002, "Backward": 0.002, "Step": 0.003, "StepLR": 0.001}
GROUPS = ["default", "g1", "g2"]
LOAD_DROPS = [("Load", "Forward", "inter"), ("Load", "Backward", "inter"), ("Load", "Step", "inter"),
              ("Load", "StepLR", "inter")]


class ScheduledLoop(TrainingLoop):
    """The training loop of ``test_kept_orders`` and a StepLR task (no dependency declared) after its step."""

    def __init__(self) -> None:
        super().__init__()
        self.step_lr = PipelineTask("StepLR", self._step_lr)
        self.tasks.append(self.step_lr)

    def reset(self) -> None:
        super().reset()
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.9)

    def _step_lr(self, ctx: Any) -> None:
        self.scheduler.step()



def batches() -> List[Batch]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 8, generator=gen), torch.randn(32, 1, generator=gen)) for _ in range(20)]


def same(got: Result, expected: Result) -> bool:
    return torch.equal(got[1], expected[1]) and all(torch.equal(a, b) for a, b in zip(got[0], expected[0]))


# every order the one-thread placement gives that the three dependencies do not: StepLR after the other four
# within an iteration, then each task of i+1 after the ones of i it does not already follow
WITHIN = [("StepLR", "Load", 0), ("StepLR", "Forward", 0), ("StepLR", "Backward", 0), ("StepLR", "Step", 0)]
ACROSS_BUT_LOAD = [("Forward", "Backward", 1), ("Forward", "Step", 1), ("Forward", "StepLR", 1),
                   ("Backward", "Step", 1), ("Backward", "StepLR", 1), ("Step", "StepLR", 1), ("StepLR", "Load", 1),
                   ("StepLR", "Forward", 1), ("StepLR", "Backward", 1), ("StepLR", "Step", 1)]
LOAD = [("Load", "Forward", 1), ("Load", "Backward", 1), ("Load", "Step", 1), ("Load", "StepLR", 1)]


def test_by_default_every_order_of_the_placement_is_kept() -> None:
    loop = ScheduledLoop()
    baseline = loop.one_thread()
    found = search_plan(loop.tasks, loop.intra, [], COSTS, max_in_flight=3, thread_groups=GROUPS, baseline=baseline)
    assert found.kept_orders == (*WITHIN, *LOAD, *ACROSS_BUT_LOAD)
    assert found.dropped_orders == ()
    assert found.kept_baseline and found.plan is baseline  # Load(i+1) after Step(i): nothing can overlap
    assert "orders of the baseline's placement kept: 18 of 18" in found.format_report().splitlines()


def test_the_kept_orders_within_and_across_iterations_are_exactly_the_placements() -> None:
    loop = ScheduledLoop()
    found = search_plan(loop.tasks, loop.intra, [], COSTS, max_in_flight=3, thread_groups=GROUPS,
                        baseline=loop.one_thread(), drop_orders=LOAD_DROPS)
    assert found.kept_orders == (*WITHIN, *ACROSS_BUT_LOAD)
    assert found.dropped_orders == tuple(LOAD)
    assert {n: (s.stage, s.thread_group) for n, s in found.plan.schedules.items()} == {
        "Load": (0, "g1"), "Forward": (1, "default"), "Backward": (1, "default"), "Step": (1, "default"),
        "StepLR": (1, "default")}
    # declared, so that they hold on any thread: enough of them to give every order kept
    assert found.plan.intra["StepLR"] == ["Step"]
    assert found.plan.inter["Forward"] == [("StepLR", 1)]
    assert orders_dropped(found.plan, [*WITHIN, *ACROSS_BUT_LOAD]) == []
    lines = found.format_report().splitlines()
    start = lines.index("orders of the baseline's placement kept: 14 of 18, 4 dropped as asked:")
    assert lines[start + 1:start + 5] == ["  - after Forward(i): Load(i+1)", "  - after Backward(i): Load(i+1)",
                                          "  - after Step(i): Load(i+1)", "  - after StepLR(i): Load(i+1)"]


@pytest.mark.parametrize("keep", ["default", "with the analysis"])
def test_a_scheduler_writing_a_float_trains_like_run_serial_on_both_engines(keep: str) -> None:
    loop = ScheduledLoop()
    baseline = loop.one_thread()
    loop.reset()
    analysis = analyze(baseline, batches()[0], warmup=1)
    assert analysis_orders(analysis) == [("Forward", "Step", 1)]  # the float the scheduler writes is not seen
    found = search_plan(loop.tasks, loop.intra, [], COSTS, max_in_flight=3, thread_groups=GROUPS, baseline=baseline,
                        drop_orders=LOAD_DROPS, keep_orders=analysis if keep == "with the analysis" else None)
    assert found.speedup is not None and found.speedup > 1.3  # Load moved to a thread of its own
    expected = train(loop, baseline, "serial")
    for how in ("clocked", "dataflow", "clocked", "dataflow", "clocked", "dataflow"):
        assert same(train(loop, found.plan, how), expected), how


def test_dropping_what_the_analysis_did_not_see_moves_the_scheduler_apart() -> None:
    """The search the story began with, now spelled out: it drops the scheduler's orders by name."""
    loop = ScheduledLoop()
    unseen = [o for o in (*WITHIN, *ACROSS_BUT_LOAD) if "StepLR" in o[:2]]
    found = search_plan(loop.tasks, loop.intra, [], COSTS, max_in_flight=3, thread_groups=GROUPS,
                        baseline=loop.one_thread(),
                        drop_orders=[*LOAD_DROPS, *((t, d, "inter" if k else "intra") for t, d, k in unseen)])
    assert found.kept_orders == (("Forward", "Backward", 1), ("Forward", "Step", 1), ("Backward", "Step", 1))
    assert orders_dropped(found.plan, [("StepLR", "Step", 0), ("Step", "StepLR", 1)]) != []


@pytest.mark.parametrize("drop, baseline, error, message", [
    ([("Step", "Load", "inter")], True, ValueError,
     "autoplan: drop_orders ('Step', 'Load', 'inter'): Step(i+1) after Load(i) is not an order the baseline's "
     "placement alone gave (the dependencies give it); those it gave: ('StepLR', 'Load', 'intra'); "),
    ([("Load", "StepLR", "intra")], True, ValueError,
     "autoplan: drop_orders ('Load', 'StepLR', 'intra'): Load(i) after StepLR(i) is not an order the baseline's "
     "placement alone gave (its placement did not run them in that order); those it gave: "),
    ([("Forward", "Step", "inter")], True, ValueError,
     "autoplan: drop_orders ('Forward', 'Step', 'inter'): Forward(i+1) after Step(i) still follows from other orders "
     "kept (Load(i+1) after Step(i), Load(i+1) after StepLR(i), Forward(i+1) after StepLR(i)); drop those too where "
     "nothing needs them: ('Load', 'Step', 'inter'); ('Load', 'StepLR', 'inter'); ('Forward', 'StepLR', 'inter')"),
    ([("Load", "Step", "inter")], False, ValueError,
     "autoplan: drop_orders [\"('Load', 'Step', 'inter')\"] needs a baseline: it names orders of the baseline's "
     "placement that the suggestion need not keep; pass baseline="),
    ("Load,Step,inter", True, TypeError,
     "autoplan: drop_orders must be a list of (task, depends_on, 'intra' or 'inter') entries, got str"),
    ([("Load", "Step", "later")], True, ValueError,
     "autoplan: drop_orders: the kind of ('Load', 'Step') must be 'intra' or 'inter' (or the distance 0 or 1), "
     "got 'later'"),
])
def test_bad_drop_orders_are_refused(drop: Any, baseline: bool, error: type, message: str) -> None:
    loop = ScheduledLoop()
    with pytest.raises(error) as exc:
        search_plan(loop.tasks, loop.intra, [], COSTS, max_in_flight=3, thread_groups=GROUPS,
                    baseline=loop.one_thread() if baseline else None, drop_orders=drop)
    assert str(exc.value).startswith(message)
