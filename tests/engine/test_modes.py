"""The caller's thread-local torch modes reach every thread that runs its work.

Grad mode, inference mode and autocast are per thread in PyTorch. A pipelined run
under ``no_grad``, ``inference_mode`` or ``autocast`` must compute exactly what
``run_serial`` computes under the same mode, on every thread group and both engines;
and the modes are those of the call that handed the work out.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, ContextManager, Dict, List, Tuple

import pytest
import torch

from engine_helpers import swp_threads
from swpipeline import DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

Seen = Dict[int, Tuple[torch.dtype, bool, bool, torch.Tensor]]

MODES: Dict[str, Callable[[], ContextManager[Any]]] = {
    "default": contextlib.nullcontext,
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast_bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "no_grad+autocast": lambda: _both(torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16)),
}


@contextlib.contextmanager
def _both(first: ContextManager[Any], second: ContextManager[Any]) -> Any:
    with first, second:
        yield


def plan_and_log() -> Tuple[PipelinePlan, Seen]:
    """Prep (own thread group and stream) runs the first layer; Head (default group) the second."""
    torch.manual_seed(0)
    first, second = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
    seen: Seen = {}

    def prep(ctx: IterContext) -> None:
        ctx.h = first(ctx.batch)

    def head(ctx: IterContext) -> None:
        out = second(torch.relu(ctx.h))
        seen[ctx.iter_idx] = (out.dtype, out.requires_grad, torch.is_inference(out), out.detach().float().clone())

    p, h = PipelineTask("Prep", prep), PipelineTask("Head", head)
    plan = PipelinePlan({p: TaskSchedule(stage=0, stream="prep", thread_group="prep"), h: TaskSchedule(stage=1)},
                        intra_iter_deps=[(h, p)])
    return plan, seen


def batches(n: int = 6) -> List[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(5, 8, generator=gen) for _ in range(n)]


ENGINES: Dict[str, Callable[[PipelinePlan], Any]] = {
    "SWPipeline": lambda plan: SWPipeline(plan, device="cpu"),
    "SWPipeline-caller-thread": lambda plan: SWPipeline(plan, device="cpu", caller_thread_group="default"),
    "DataFlow-3": lambda plan: DataFlowPipeline(plan, max_depth=3, device="cpu"),
}


def same(a: Seen, b: Seen) -> bool:
    return a.keys() == b.keys() and all(a[i][:3] == b[i][:3] and torch.equal(a[i][3], b[i][3]) for i in a)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_pipelined_run_under_a_mode_equals_the_serial_run_under_it(engine: str, mode: str) -> None:
    plan, serial = plan_and_log()
    with MODES[mode]():
        SWPipeline(plan, device="cpu").run_serial(batches())
    plan, pipelined = plan_and_log()
    with MODES[mode]():
        ENGINES[engine](plan).run(batches())
    assert same(pipelined, serial)
    dtype, requires_grad, inference, _ = serial[0]
    assert dtype == (torch.bfloat16 if "autocast" in mode else torch.float32)
    assert requires_grad == (mode in ("default", "autocast_bf16"))
    assert inference == (mode == "inference_mode")
    assert swp_threads() == []


def test_each_hand_out_carries_the_modes_of_the_call_that_made_it() -> None:
    # One stage, one thread group: fill hands out iteration 0, progress() #k hands out iteration k + 1.
    grads: Dict[int, bool] = {}
    weight = torch.ones(3, requires_grad=True)

    def work(ctx: IterContext) -> None:
        grads[ctx.iter_idx] = (weight * ctx.batch).requires_grad

    pipe = SWPipeline(PipelinePlan({PipelineTask("Work", work): TaskSchedule(thread_group="w")}), device="cpu")
    grad_on = [False, True, True, False, True, False]  # the mode of fill, then of each progress()
    with torch.set_grad_enabled(grad_on[0]):
        it = pipe.fill_pipeline(range(6))
    for k in range(6):
        with torch.set_grad_enabled(grad_on[k + 1] if k + 1 < len(grad_on) else True):
            assert pipe.progress(it) == k
    with pytest.raises(StopIteration):
        pipe.progress(it)
    assert grads == {i: grad_on[i] for i in range(6)}
    assert torch.is_grad_enabled()  # the caller's own mode is untouched


def test_advance_carries_its_own_modes() -> None:
    grads: Dict[int, bool] = {}
    weight = torch.ones(3, requires_grad=True)

    def work(ctx: IterContext) -> None:
        grads[ctx.iter_idx] = (weight * ctx.batch).requires_grad

    pipe = SWPipeline(PipelinePlan({PipelineTask("Work", work): TaskSchedule(thread_group="w")}), device="cpu")
    it = pipe.fill_pipeline(range(3))
    with torch.no_grad():
        assert pipe.progress(it, advance=False) == 0
    pipe.advance()  # grad on here: iteration 1 is handed out now
    with torch.no_grad():
        assert pipe.progress(it) == 1  # hands out iteration 2 under no_grad
    pipe.drain()
    assert grads == {0: True, 1: True, 2: False}


def test_worker_threads_keep_their_own_defaults_between_hand_outs() -> None:
    # After running work under no_grad, a worker runs later work handed out with grad on under grad on.
    states: List[Tuple[int, bool, bool]] = []

    def work(ctx: IterContext) -> None:
        states.append((ctx.iter_idx, torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")))

    pipe = DataFlowPipeline(PipelinePlan({PipelineTask("Work", work): TaskSchedule(thread_group="w")}), max_depth=1,
                            device="cpu")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        pipe.run(range(2))
    pipe.run(range(2))
    assert states == [(0, False, True), (1, False, True), (0, True, False), (1, True, False)]


# -- autocast's weight cache -----------------------------------------------------------------------
# torch keeps one cache of autocast's weight casts for the whole process: a cast made on one thread (and,
# on a GPU, on that thread's stream) is handed to every other thread that casts the same weight, and the
# first thread to leave its outermost autocast region clears it for all. So every task runs with the
# cache off: each cast is made where it is used, from the weight as it is at that moment.
# (The race it caused, forced on the CPU, is a story of tests/test_bugs.py.)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_tasks_run_with_the_cache_off_and_the_callers_setting_stays_its_own(engine: str) -> None:
    seen: List[Tuple[str, bool, bool]] = []

    def probe(name: str) -> Callable[[IterContext], None]:
        def run(ctx: IterContext) -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16):  # a task's own region takes the thread's setting
                seen.append((name, torch.is_autocast_cache_enabled(), threading.current_thread().name == "MainThread"))
        return run

    own, caller = PipelineTask("Own", probe("Own")), PipelineTask("Caller", probe("Caller"))
    plan = PipelinePlan({own: TaskSchedule(stage=0, stream="own", thread_group="own"), caller: TaskSchedule(stage=1)},
                        intra_iter_deps=[(caller, own)])
    pipe = ENGINES[engine](plan)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pipe.run(range(1))
        inside = torch.is_autocast_cache_enabled()
    pipe.run(range(1))
    pipe.run_serial(range(1))
    assert inside and torch.is_autocast_cache_enabled()
    serial = [("Own", False, True), ("Caller", False, True)]
    assert seen == [("Own", False, False), ("Caller", False, True)] * 2 + serial
