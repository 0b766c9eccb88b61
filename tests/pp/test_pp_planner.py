"""Choosing a schedule and a number of microbatches from measured costs: simulate and autoplan, on paper.

The paper times come from the same units and rule as the proof, so the simple cases have
closed forms: GPipe and 1F1B with free messages and actions that cost only their rows take
``(n + p - 1)`` ticks of ``F + B`` each. ``measure()`` on 2 gloo ranks returns every stage's
costs; benchmarks/pp_vs_pipelining.py compares ``simulate`` with measured steps.
"""

from __future__ import annotations

from typing import Any, Dict

import pytest
import torch

from dist_harness import run_on_ranks
from swpipeline.pp import StageCosts, autoplan, simulate
from swpipeline.pp.planner import costs_from_timelines
from test_pp_support import loss_fn, make_batch, make_model, stage_module


def _costs(stages: int = 2, **overrides: float) -> StageCosts:
    """F 1 ms and B 2 ms per stage for 8 rows, nothing else unless overridden."""
    values: Dict[str, float] = {"fixed_ms": 0.0, "message_ms": 0.0, "step_ms": 0.0, **overrides}
    return StageCosts((1.0,) * stages, (2.0,) * stages, rows=8, **values)


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("schedule", ["ScheduleGPipe", "Schedule1F1B"])
def test_simulate_gives_the_pipeline_s_closed_form(ranks: int, schedule: str) -> None:
    costs = _costs(stages=ranks)
    for n in (1, 2, 4, 8):
        rows = 64 / n  # F costs rows / 8 ms, B twice that
        assert simulate(schedule, ranks, n, 64, costs) == pytest.approx((n + ranks - 1) * 3 * rows / 8)
    assert simulate(schedule, ranks, 8, 64, _costs(stages=ranks, step_ms=1.5)) == pytest.approx(
        (8 + ranks - 1) * 3 + 1.5)


def test_a_send_costs_its_rank_send_ms_on_the_path_of_what_it_carries() -> None:
    # one microbatch of 64 rows on 2 ranks: F0 (8), send, F1 (8), B1 (16), send, B0 (16): two sends on the path
    for schedule in ("ScheduleGPipe", "Schedule1F1B"):
        assert simulate(schedule, 2, 1, 64, _costs(send_ms=0.25)) == pytest.approx(48 + 2 * 0.25)
    # eight microbatches: GPipe's path holds all 16 sends (rank 0's forwards, each followed by its send, then rank 1's
    # backwards, each followed by its send); in 1F1B rank 0 sends while it waits for a gradient, so fewer weigh
    gpipe, one_f_one_b = (simulate(s, 2, 8, 64, _costs(send_ms=1.0)) - simulate(s, 2, 8, 64, _costs())
                          for s in ("ScheduleGPipe", "Schedule1F1B"))
    assert gpipe == pytest.approx(16.0) and 0 < one_f_one_b < gpipe


def test_measure_reads_what_a_send_cost_from_the_timelines() -> None:
    durations = [{"0F0": [1.0], "0B0": [2.0], "0SEND_F0": [0.3, 0.1, 0.2], "0RECV_B0": [0.05]},
                 {"1F0": [1.5], "1B0": [2.5], "1SEND_B0": [0.4], "1RECV_F0": [0.07]}]
    costs = costs_from_timelines(durations, 2, rows=8, step_ms=0.0)
    assert (costs.forward_ms, costs.backward_ms, costs.send_ms, costs.message_ms) == ((1.0, 1.5), (2.0, 2.5), 0.3,
                                                                                      0.05)


def test_autoplan_weighs_the_bubble_against_the_cost_of_each_action() -> None:
    # actions that cost only their rows: more microbatches, a smaller bubble
    best = autoplan(2, 64, _costs(), schedules=["ScheduleGPipe", "Schedule1F1B"])
    assert best[0][2] == 32 and best[0][0] < best[-1][0]
    # a fixed cost per action (and per message) of a third of a forward of 8 rows: fewer, larger microbatches
    ms, name, n = autoplan(2, 64, _costs(fixed_ms=0.33, message_ms=0.2), schedules=["Schedule1F1B"])[0]
    assert 4 <= n <= 16
    assert [c[1] for c in autoplan(2, 64, _costs())][:1] == ["ScheduleInterleavedZeroBubble"]  # W fills the bubble


def test_simulate_refuses_what_a_schedule_cannot_run() -> None:
    with pytest.raises(ValueError, match="ScheduleGPipe runs one stage per rank, not 2"):
        simulate("ScheduleGPipe", 2, 4, 64, _costs(stages=4))
    with pytest.raises(ValueError, match="unknown schedule 'ScheduleNoSuch'"):
        simulate("ScheduleNoSuch", 2, 4, 64, _costs())


def measure_on_rank(rank: int, world: int) -> Dict[str, Any]:
    import swpipeline.pp as pp

    model = make_model()
    x, y = make_batch()
    stage = pp.PipelineStage(stage_module(model, rank, world), rank, world, torch.device("cpu"))
    schedule = pp.Schedule1F1B(stage, 4, loss_fn=loss_fn)
    costs = schedule.measure(*((x,) if rank == 0 else ()), **({"target": y} if rank == world - 1 else {}))
    return {"costs": costs, "simulated": simulate("Schedule1F1B", world, 4, x.shape[0], costs)}


def test_measure_gathers_every_stage_s_costs_on_every_rank() -> None:
    results = run_on_ranks(measure_on_rank, 2, timeout=120)
    costs = results[0]["costs"]
    assert results[1]["costs"] == costs  # every rank has every stage's, the same
    assert len(costs.forward_ms) == len(costs.backward_ms) == 2 and costs.rows == 4
    assert all(f > 0 for f in costs.forward_ms) and all(b > 0 for b in costs.backward_ms)
    assert costs.message_ms >= 0 and costs.step_ms >= 0
