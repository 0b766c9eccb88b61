"""Ranks that run different schedules fail at once, on every rank, each saying what both run.

Every rank computes every rank's schedule from its own configuration, so two ranks built
differently (another schedule class, another n_microbatches, scale_grads, step() on one and
eval() on the other) would each wait for messages the other never sends: before, until the
timeout (300 s by default) or, when the shapes happened to differ, with a protocol error.
Each HELLO now carries a fingerprint of the sender's configuration and its description; the
first step fails on both ranks, naming both sides. The schedules' timeout here is 600 s and
the harness gives the ranks 60: a wait for the timeout would fail the test.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List

import pytest
import torch

from dist_harness import run_on_ranks
from test_pp_support import loss_fn, make_batch, make_model, stage_module

CASES: Dict[str, List[Dict[str, Any]]] = {  # per case, rank 0's and rank 1's schedule
    "class and n_microbatches": [{"name": "Schedule1F1B", "n": 4}, {"name": "ScheduleGPipe", "n": 8}],
    "n_microbatches only": [{"name": "Schedule1F1B", "n": 4}, {"name": "Schedule1F1B", "n": 2}],
    "scale_grads": [{"name": "ScheduleGPipe", "n": 4}, {"name": "ScheduleGPipe", "n": 4, "scale_grads": False}],
    "step() and eval()": [{"name": "ScheduleGPipe", "n": 4}, {"name": "ScheduleGPipe", "n": 4, "eval": True}],
}
SAID = {
    "class and n_microbatches": ("Schedule1F1B with 4 microbatches over 2 stages, step()",
                                 "ScheduleGPipe with 8 microbatches over 2 stages, step()"),
    "n_microbatches only": ("Schedule1F1B with 4 microbatches over 2 stages, step()",
                            "Schedule1F1B with 2 microbatches over 2 stages, step()"),
    "scale_grads": ("ScheduleGPipe with 4 microbatches over 2 stages, step()",
                    "ScheduleGPipe with 4 microbatches over 2 stages, scale_grads=False, step()"),
    "step() and eval()": ("ScheduleGPipe with 4 microbatches over 2 stages, step()",
                          "ScheduleGPipe with 4 microbatches over 2 stages, eval()"),
}


def mismatched_on_rank(rank: int, world: int, case: str, late_hello: bool = False) -> Dict[str, Any]:
    import swpipeline.pp as pp

    if late_hello:  # the peer's HELLO is read 0.3 s late: its data is there first, and must wait for the check
        from swpipeline.pp import transport

        def slow_marker(self: Any, peer: int, index: int, status: int, _original: Any = transport.Transport.recv_marker
                        ) -> None:
            if index == 0:
                time.sleep(0.3)
            _original(self, peer, index, status)

        transport.Transport.recv_marker = slow_marker  # type: ignore[method-assign]

    mine = CASES[case][rank]
    stage = pp.PipelineStage(stage_module(make_model(), rank, world), rank, world, torch.device("cpu"))
    schedule = getattr(pp, mine["name"])(stage, mine["n"], loss_fn=loss_fn, scale_grads=mine.get("scale_grads", True),
                                         timeout=600)
    x, y = make_batch()
    try:
        if mine.get("eval"):
            schedule.eval(*((x,) if rank == 0 else ()), **({"target": y} if rank else {}))
        else:
            schedule.step(*((x,) if rank == 0 else ()), **({"target": y} if rank else {}))
    except Exception as exc:
        return {"type": type(exc).__name__, "text": str(exc)}
    return {"type": None, "text": ""}


@pytest.mark.parametrize("late_hello", [False, True], ids=["", "HELLO read late"])
@pytest.mark.parametrize("case", list(CASES))
def test_ranks_that_run_different_schedules_fail_at_once_naming_both(case: str, late_hello: bool) -> None:
    results = run_on_ranks(mismatched_on_rank, 2, timeout=60, case=case, late_hello=late_hello)
    zero, one = SAID[case]
    for rank, got in enumerate(results):
        assert got["type"] in ("ScheduleMismatchError", "PipelineRankError"), got
        other, me = (one, zero) if rank == 0 else (zero, one)
        if got["type"] == "ScheduleMismatchError":  # found here
            assert got["text"].startswith(f"rank {1 - rank} runs {other}; rank {rank} runs {me}: every rank of a "
                                          f"pipeline must build the same schedule"), got
        else:  # found by the other rank first, and passed on
            assert f"rank {rank} runs {me}; rank {1 - rank} runs {other}" in got["text"], got
    assert "ScheduleMismatchError" in {r["type"] for r in results}


def input_args_on_rank(rank: int, world: int, width: int) -> Dict[str, Any]:
    import swpipeline.pp as pp

    extra = {"input_args": (torch.zeros(2, width),)} if rank == 1 else {}
    stage = pp.PipelineStage(stage_module(make_model(), rank, world), rank, world, torch.device("cpu"), **extra)
    x, y = make_batch()
    try:
        pp.Schedule1F1B(stage, 4, loss_fn=loss_fn, timeout=600).step(*((x,) if rank == 0 else ()),
                                                                     **({"target": y} if rank else {}))
    except Exception as exc:
        return {"type": type(exc).__name__, "text": str(exc)}
    return {"type": None, "text": ""}


@pytest.mark.parametrize("width", [16, 32])
def test_what_a_stage_receives_is_checked_against_its_input_args(width: int) -> None:
    results = run_on_ranks(input_args_on_rank, 2, timeout=60, width=width)
    if width == 16:  # what stage 0 sends: 4 rows of 16 per microbatch
        assert results == [{"type": None, "text": ""}] * 2
        return
    said = ("stage 1 expects as its inputs ['float32[2, 32]'] (its input_args; the first dimension may differ) but "
            "stage 0 sent ['float32[4, 16]'] for microbatch 0: make the two stages agree, or leave input_args out")
    assert results[1]["type"] == "ValueError" and results[1]["text"].startswith(said), results[1]
    assert results[0]["type"] == "PipelineRankError" and said in results[0]["text"], results[0]


def wrong_input_on_rank(rank: int, world: int) -> Dict[str, Any]:
    import swpipeline.pp as pp

    extra = {"input_args": (torch.zeros(2, 16),)} if rank == 0 else {}
    stage = pp.PipelineStage(stage_module(make_model(), rank, world), rank, world, torch.device("cpu"), **extra)
    x, y = make_batch(width=16)
    try:
        pp.Schedule1F1B(stage, 4, loss_fn=loss_fn, timeout=3).step(*((x[:, :8],) if rank == 0 else ()),
                                                                   **({"target": y} if rank else {}))
    except Exception as exc:
        return {"type": type(exc).__name__, "text": str(exc)}
    return {"type": None, "text": ""}


def test_inputs_that_differ_from_the_first_stage_s_input_args_are_refused_before_the_step() -> None:
    zero, one = run_on_ranks(wrong_input_on_rank, 2, timeout=60)
    assert zero == {"type": "ValueError", "text": (
        "stage 0 expects as its inputs ['float32[2, 16]'] (its input_args; the first dimension may differ) but "
        "step() was given ['float32[4, 8]'] for microbatch 0: pass inputs of those dtypes and shapes, or leave "
        "input_args out")}
    # rank 0 never started its step (as for any argument it refuses): rank 1 stops, naming it, once its timeout
    # passes or rank 0's process is gone
    assert one["type"] in ("RankTimeoutError", "PipelineRankError") and "rank 0" in one["text"], one
