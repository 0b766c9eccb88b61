"""A failure on one rank stops every rank, naming the failing rank, stage, microbatch and the original error.

torch.distributed.pipelining's other ranks see "Connection closed by peer" or hang. Here the
failing rank sends its failure in place of its next message on every channel, and every
rank that fails passes the first failure on, so each rank raises ``PipelineRankError`` with
where it happened (never a ``RankTimeoutError``: nobody waited for the schedule's timeout),
and no pipeline thread is left on any rank. A rank that never answers fails the others after
the timeout, naming it; an interrupt on one rank stops the others; a schedule refuses to run
again after a failed step.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from typing import Any, Dict, Optional

import torch
from torch import nn

from dist_harness import run_on_ranks
from test_pp_support import loss_fn, make_batch, make_model, stage_module


class RaiseOnCall(nn.Module):
    """Wraps a stage: its forward raises on the given call (call k is microbatch k: forwards run in order)."""

    def __init__(self, inner: nn.Module, fail_at: Optional[int], error: BaseException) -> None:
        super().__init__()
        self.inner, self.fail_at, self.error, self.calls = inner, fail_at, error, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        call, self.calls = self.calls, self.calls + 1
        if call == self.fail_at:
            raise self.error
        return self.inner(x)


def _swp_threads() -> list:
    return [t.name for t in threading.enumerate() if t.name.startswith("swp-")]


def _outcome(exc: BaseException) -> Dict[str, Any]:
    found = {"type": type(exc).__name__, "text": str(exc), "notes": getattr(exc, "__notes__", [])}
    for name in ("rank", "stage", "microbatch", "action", "error"):
        if hasattr(exc, name):
            found[name] = getattr(exc, name)
    return found


def failing_stage_on_rank(rank: int, world: int, failing_rank: int, schedule: str) -> Dict[str, Any]:
    import swpipeline.pp as pp

    model = make_model()
    x, y = make_batch()
    inner = stage_module(model, rank, world)
    module = RaiseOnCall(inner, 2 if rank == failing_rank else None, ValueError("nan in the activations"))
    stage = pp.PipelineStage(module, rank, world, torch.device("cpu"))
    sched = getattr(pp, schedule)(stage, 4, loss_fn=loss_fn, timeout=60.0)
    args = (x,) if rank == 0 else ()
    kwargs = {"target": y} if rank == world - 1 else {}
    out: Dict[str, Any] = {}
    try:
        sched.step(*args, **kwargs)
    except BaseException as exc:
        out = _outcome(exc)
    out["threads"] = _swp_threads()
    try:
        sched.step(*args, **kwargs)
    except RuntimeError as exc:
        out["again"] = str(exc)
    del sched, stage, module  # the schedule's watchdog thread ends with it
    gc.collect()
    time.sleep(0.2)
    out["after"] = [t.name for t in threading.enumerate() if t.name.startswith("swp")]
    return out


def _assert_named_everywhere(results: Any, failing: int) -> None:
    for rank, got in enumerate(results):
        assert got["threads"] == [] and got["after"] == [], (rank, got)
        assert "after a failed step" in got["again"]
        if rank == failing:
            assert got["type"] == "ValueError" and got["text"] == "nan in the activations"
            assert any(f"raised by task '{failing}F2'" in note for note in got["notes"]), got["notes"]
            continue
        assert got["type"] == "PipelineRankError", (rank, got)
        assert (got["rank"], got["stage"], got["microbatch"], got["action"]) == (failing, failing, 2, f"{failing}F2")
        assert got["error"] == "ValueError: nan in the activations"
        assert got["text"].startswith(f"rank {failing} (stage {failing}, microbatch 2, action {failing}F2) failed "
                                      f"with ValueError: nan in the activations; rank {rank} stopped its step")


def test_a_raising_stage_stops_both_ranks() -> None:
    _assert_named_everywhere(run_on_ranks(failing_stage_on_rank, 2, timeout=90, failing_rank=0,
                                          schedule="Schedule1F1B"), failing=0)


def test_a_raising_stage_stops_every_rank_of_four() -> None:
    # rank 1 fails: rank 0 hears it directly, rank 3 only through rank 2
    _assert_named_everywhere(run_on_ranks(failing_stage_on_rank, 4, timeout=120, failing_rank=1,
                                          schedule="ScheduleGPipe"), failing=1)


def silent_rank(rank: int, world: int) -> Dict[str, Any]:
    import swpipeline.pp as pp

    model = make_model()
    x, y = make_batch()
    stage = pp.PipelineStage(stage_module(model, rank, world), rank, world, torch.device("cpu"))
    sched = pp.ScheduleGPipe(stage, 2, loss_fn=loss_fn, timeout=3.0)
    if rank == world - 1:
        time.sleep(8.0)  # never calls step(): the others wait for it
        return {"silent": True}
    try:
        sched.step(*((x,) if rank == 0 else ()))
    except BaseException as exc:
        found = _outcome(exc)
        found["threads"] = _swp_threads()
        return found
    return {"type": None}


def test_a_silent_rank_fails_the_others_after_the_timeout_naming_it() -> None:
    results = run_on_ranks(silent_rank, 3, timeout=90)
    # rank 1 waited for the last rank to start its step and timed out; rank 0 heard of it from rank 1
    for rank in (0, 1):
        assert results[rank]["type"] == "RankTimeoutError" and results[rank]["rank"] == 2, results[rank]
        assert results[rank]["error"] == "rank 1 waited 3 s for rank 2's start of step and rank 2 never sent it"
        assert results[rank]["text"].startswith(f"rank 2 never answered: rank 1 waited 3 s for rank 2's start of "
                                                f"step and rank 2 never sent it; rank {rank} stopped its step")
        assert results[rank]["threads"] == []


def interrupted_rank(rank: int, world: int, interrupted: tuple) -> Dict[str, Any]:
    import swpipeline.pp as pp

    model = make_model()
    x, y = make_batch()
    stage = pp.PipelineStage(stage_module(model, rank, world), rank, world, torch.device("cpu"))
    sched = pp.Schedule1F1B(stage, 4, loss_fn=loss_fn, timeout=60.0)
    if rank in interrupted:  # Ctrl-C while the step runs (under torchrun every rank gets one)
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        stage.submod.register_forward_hook(lambda *a: time.sleep(0.3))
    start = time.monotonic()
    try:
        sched.step(*((x,) if rank == 0 else ()), **({"target": y} if rank == world - 1 else {}))
    except BaseException as exc:
        found = _outcome(exc)
    else:
        found = {"type": None}
    found["seconds"] = time.monotonic() - start
    found["threads"] = _swp_threads()
    return found


def test_ctrl_c_on_one_rank_stops_the_others() -> None:
    results = run_on_ranks(interrupted_rank, 2, timeout=90, interrupted=(1,))
    assert results[1]["type"] == "KeyboardInterrupt"
    assert results[0]["type"] == "PipelineRankError" and results[0]["rank"] == 1
    assert results[0]["error"].startswith("KeyboardInterrupt")
    assert results[0]["threads"] == results[1]["threads"] == []


def test_ctrl_c_on_every_rank_stops_them_all() -> None:
    results = run_on_ranks(interrupted_rank, 2, timeout=90, interrupted=(0, 1))
    for got in results:
        assert got["type"] in ("KeyboardInterrupt", "PipelineRankError"), got
        assert got["threads"] == [], got
    assert "KeyboardInterrupt" in {got["type"] for got in results}
