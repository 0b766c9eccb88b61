"""Schedules of one's own: a subclass that sets ``pipeline_order`` (as torch's custom schedules are written),
torch's own action objects, sends and receives listed or not, and any stage placement.

Every case on 2 gloo ranks, bit for bit against one process running the microbatches in order.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch
from torch.distributed.pipelining.schedules import _Action, _ComputationType

from dist_harness import run_on_ranks
from swpipeline.pp import Action, Kind
from swpipeline.pp.actions import parse_orders
from swpipeline.pp.placement import LOOP, V, of_orders, rule
from test_pp_support import loss_fn, make_batch, make_model, reference_grads, stage_module, stage_param_slice

UNBALANCED = {  # five stages on two ranks: 0, 1 and 4 on rank 0; 2 and 3 on rank 1
    0: "0F0 1F0 0F1 1F1 4F0 4B0 4F1 4B1 1B0 0B0 1B1 0B1",
    1: "2F0 3F0 2F1 3F1 3B0 2B0 3B1 2B1",
}
F, IN, W = _ComputationType.FORWARD, _ComputationType.BACKWARD_INPUT, _ComputationType.BACKWARD_WEIGHT
SEND_F, RECV_F = _ComputationType.SEND_F, _ComputationType.RECV_F
SEND_B, RECV_B = _ComputationType.SEND_B, _ComputationType.RECV_B


def _torch_order_with_comms() -> Dict[int, List[Any]]:
    """Four stages in a loop, two microbatches, the backward split in I and W, written with torch's own action
    objects and with torch's sends and receives listed (they are dropped and derived again)."""
    def a(stage: int, kind: Any, m: int) -> Any:
        return _Action(stage, kind, m)

    return {
        0: [a(0, F, 0), a(0, SEND_F, 0), a(0, F, 1), a(0, SEND_F, 1), a(2, RECV_F, 0), a(2, F, 0), a(2, SEND_F, 0),
            a(2, RECV_F, 1), a(2, F, 1), a(2, SEND_F, 1), a(2, RECV_B, 0), a(2, IN, 0), a(2, SEND_B, 0), a(2, W, 0),
            a(0, RECV_B, 0), a(0, IN, 0), a(2, RECV_B, 1), a(2, IN, 1), a(2, SEND_B, 1), a(0, W, 0), a(0, RECV_B, 1),
            a(0, IN, 1), a(2, W, 1), a(0, W, 1)],
        1: [a(1, RECV_F, 0), a(1, F, 0), a(1, SEND_F, 0), a(1, RECV_F, 1), a(1, F, 1), a(1, SEND_F, 1),
            a(3, RECV_F, 0), a(3, F, 0), a(3, IN, 0), a(3, SEND_B, 0), a(3, RECV_F, 1), a(3, F, 1), a(1, RECV_B, 0),
            a(1, IN, 0), a(1, SEND_B, 0), a(3, IN, 1), a(3, SEND_B, 1), a(3, W, 0), a(1, RECV_B, 1), a(1, IN, 1),
            a(1, SEND_B, 1), a(1, W, 0), a(3, W, 1), a(1, W, 1)],
    }


def custom_on_rank(rank: int, world: int) -> Dict[str, Any]:
    import swpipeline.pp as pp

    class Unbalanced(pp.PipelineScheduleMulti):
        """Written as torch's custom schedules are: the order set in __init__, then checked again."""

        def __init__(self, stages: Any, n_microbatches: int, loss_fn: Any = None) -> None:
            super().__init__(stages, n_microbatches, loss_fn=loss_fn)
            self.pipeline_order = {r: row.split() for r, row in UNBALANCED.items()}
            self._validate_and_set_stage_mapping(self.pipeline_order)

    class WithComms(pp.PipelineScheduleMulti):
        def __init__(self, stages: Any, n_microbatches: int, loss_fn: Any = None) -> None:
            super().__init__(stages, n_microbatches, loss_fn=loss_fn)
            self.pipeline_order_with_comms = _torch_order_with_comms()

    class NoOrder(pp.PipelineScheduleMulti):
        pass

    out: Dict[str, Any] = {}
    x, y = make_batch(3)
    for name, make, num_stages, held in (
        ("unbalanced", Unbalanced, 5, {0: [0, 1, 4], 1: [2, 3]}),
        ("with comms", WithComms, 4, {0: [0, 2], 1: [1, 3]}),
        ("from actions", lambda s, n, loss_fn: pp.ScheduleFromActions(s, n, UNBALANCED, loss_fn=loss_fn), 5,
         {0: [0, 1, 4], 1: [2, 3]}),
    ):
        model = make_model(blocks=2 * num_stages)
        stages = [pp.PipelineStage(stage_module(model, s, num_stages), s, num_stages, torch.device("cpu"))
                  for s in held[rank]]
        schedule = make(stages, 2, loss_fn=loss_fn)
        losses: List[torch.Tensor] = []
        last = num_stages - 1 in held[rank]
        result = schedule.step(*([x] if 0 in held[rank] else []), **(dict(target=y, losses=losses) if last else {}))
        grads, want_losses = reference_grads(model, x, y, 2)
        out[name] = {
            "grads": all(torch.equal(p.grad, g) for stage in stages
                         for p, g in zip(stage.submod.parameters(), grads[stage_param_slice(model, stage.stage_index,
                                                                                             num_stages)])),
            "order": [str(a) for a in schedule.pipeline_order[rank] if a is not None],
        }
        if last:  # the loss and the output
            with torch.no_grad():
                out[name]["output"] = torch.equal(result, model(x))
            out[name]["losses"] = [torch.equal(a, b) for a, b in zip(losses, want_losses)]
    # a class of one's own that never sets its order: refused at step(), before any message
    model = make_model(blocks=4)
    lone = NoOrder([pp.PipelineStage(stage_module(model, rank, 2), rank, 2, torch.device("cpu"))], 2, loss_fn)
    try:
        lone.step(x) if rank == 0 else lone.step(target=y)
    except ValueError as exc:
        out["no order"] = str(exc)
    # stages that the order puts elsewhere: refused, naming where the order puts them
    try:
        wrong = [pp.PipelineStage(stage_module(make_model(blocks=10), s, 5), s, 5, torch.device("cpu"))
                 for s in ([0, 2, 4], [1, 3])[rank]]
        pp.ScheduleFromActions(wrong, 2, UNBALANCED, loss_fn=loss_fn)
    except ValueError as exc:
        out["misplaced"] = str(exc)
    return out


def test_custom_schedules_with_any_placement_are_exact_on_two_ranks() -> None:
    results = run_on_ranks(custom_on_rank, 2, timeout=120)
    for rank, got in enumerate(results):
        for name in ("unbalanced", "with comms", "from actions"):
            assert got[name]["grads"], (rank, name)
    for rank, name in ((0, "unbalanced"), (0, "from actions"), (1, "with comms")):
        assert results[rank][name]["output"] and results[rank][name]["losses"] == [True, True], name
    for name in ("unbalanced", "from actions"):
        assert results[0][name]["order"] == UNBALANCED[0].split()
        assert results[1][name]["order"] == UNBALANCED[1].split()
    # torch's sends and receives dropped; the compute actions kept in their order
    kept = {r: [str(parse_orders({r: [a]})[r][0]) for a in row if a.computation_type in (F, IN, W)]
            for r, row in _torch_order_with_comms().items()}
    assert [results[r]["with comms"]["order"] for r in (0, 1)] == [kept[0], kept[1]]
    for got in results:
        assert got["no order"] == (
            "NoOrder has no order of actions: a schedule class of your own sets self.pipeline_order = "
            "{rank: [actions, ...]} in its __init__ (or use ScheduleFromActions(stages, n_microbatches, actions))")
    assert results[0]["misplaced"] == (
        "ScheduleFromActions: rank 0 holds the stages [0, 1, 4] (as the schedule's actions place them (rank 0: "
        "[0, 1, 4]; rank 1: [2, 3])) but was given [0, 2, 4]: build every one of them on this rank")
    assert results[1]["misplaced"].startswith("ScheduleFromActions: rank 1 holds the stages [2, 3] ")


# -- on paper ---------------------------------------------------------------------------------------

def test_the_actions_place_the_stages() -> None:
    assert of_orders(parse_orders(UNBALANCED), 2, 5) == (0, 0, 1, 1, 0)
    assert of_orders(parse_orders({0: "0F0 2F0", 1: "1F0 3F0"}), 2, 4) == LOOP
    assert of_orders(parse_orders({0: "0F0 3F0", 1: "1F0 2F0"}), 2, 4) == V
    # a stage listed on two ranks, or none, is placed as in a loop (the actions' check then names it)
    assert of_orders(parse_orders({0: "0F0 1F0", 1: "1B0"}), 2, 3) == LOOP
    assert rule(2, (0, 0, 1, 1, 0)) == "as the schedule's actions place them (rank 0: [0, 1, 4]; rank 1: [2, 3])"


def test_torch_s_action_objects_are_read() -> None:
    overlapped = _Action(0, _ComputationType.OVERLAP_F_B, None, (_Action(0, F, 1), _Action(0, _ComputationType
                                                                                             .FULL_BACKWARD, 0)))
    got = parse_orders({0: [_Action(0, F, 0), None, overlapped, _Action(0, IN, 1), _Action(0, W, 1)]})
    assert got == {0: [Action(0, Kind.FORWARD, 0), Action(0, Kind.FORWARD, 1), Action(0, Kind.BACKWARD, 0),
                       Action(0, Kind.BACKWARD_INPUT, 1), Action(0, Kind.BACKWARD_WEIGHT, 1)]}
    assert parse_orders({0: [_Action(0, SEND_F, 0), _Action(0, F, 0)]}, compute_only=True) == {0: [Action.parse("0F0")]}
    with pytest.raises(ValueError, match=r"actions\[0\]\[0\]: torch's action 0UNSHARD \(UNSHARD\) has no counterpart "
                                         r"here: write the compute actions F, B, I and W"):
        parse_orders({0: [_Action(0, _ComputationType.UNSHARD, None)]})
