"""A run's life cycle is one state machine: the transitions it draws, and no others; a later failure is logged."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from engine_helpers import swp_threads
from swpipeline import DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
from swpipeline.engine.run import Run
from swpipeline.engine.run_state import ABANDONED, FAILED, FINISHED, HELD, RUNNING


def two_groups(work_a, work_b):  # type: ignore[no-untyped-def]
    a, b = PipelineTask("A", work_a), PipelineTask("B", work_b)
    return PipelinePlan({a: TaskSchedule(stage=0, thread_group="a", stream="a"),
                         b: TaskSchedule(stage=0, thread_group="b", stream="b")})


def noop(ctx: IterContext) -> None:
    return None


@pytest.mark.parametrize("engine", [SWPipeline, lambda plan, **kw: DataFlowPipeline(plan, max_depth=2, **kw)])
def test_the_states_of_a_step_by_step_run(engine) -> None:  # type: ignore[no-untyped-def]
    pipe = engine(two_groups(noop, noop), device="cpu")
    it = pipe.fill_pipeline(range(3))
    run: Run = pipe._run
    seen = [run.state]
    pipe.progress(it, advance=False)
    seen.append(run.state)
    with pytest.raises(RuntimeError, match=r"progress\(\) while the last progress\(advance=False\) has not been "
                                           r"followed by advance\(\)"):
        pipe.progress(it)
    seen.append(run.state)
    pipe.advance()
    seen.append(run.state)
    pipe.drain()
    seen.append(run.state)
    assert seen == [RUNNING, HELD, HELD, RUNNING, FINISHED]


def test_a_transition_the_life_cycle_does_not_draw_is_refused() -> None:
    pipe = SWPipeline(two_groups(noop, noop), device="cpu")
    pipe.fill_pipeline(range(2))
    run: Run = pipe._run
    with pytest.raises(RuntimeError, match="a run cannot go from running to running"):
        run.life.move(RUNNING)
    run.life.hold(0, False)
    with pytest.raises(RuntimeError, match="a run cannot go from held to finished"):
        run.life.move(FINISHED)  # a held run has an iteration retired but not followed up: it cannot just finish
    assert run.state is HELD
    pipe.abandon()
    assert run.state is ABANDONED
    assert run.life.move(FAILED) is False and run.state is ABANDONED  # an ended run stays as it ended
    assert swp_threads() == []


class Boom(Exception):
    pass


def test_a_failure_after_the_first_is_logged_not_dropped(caplog: pytest.LogCaptureFixture) -> None:
    a_failed, b_inside = threading.Event(), threading.Event()
    box = []

    def work_a(ctx: IterContext) -> None:
        if ctx.iter_idx == 1:
            assert b_inside.wait(10)  # B is inside its unit of iteration 1: it will not be spared
            a_failed.set()
            raise Boom("A first")

    def work_b(ctx: IterContext) -> None:
        if ctx.iter_idx == 1:
            b_inside.set()
            assert a_failed.wait(10)
            run = box[0]._run
            deadline = time.monotonic() + 10
            while run.error is None and time.monotonic() < deadline:  # until A's failure is the run's
                time.sleep(0.001)
            raise Boom("B second")

    pipe = SWPipeline(two_groups(work_a, work_b), device="cpu", caller_thread_group=None)
    box.append(pipe)
    with caplog.at_level(logging.WARNING, logger="swpipeline"):
        with pytest.raises(Boom, match="A first"):
            pipe.run(range(4))
    later = [r.getMessage() for r in caplog.records if "later failure" in r.getMessage()]
    assert later == ["swpipeline: a later failure after the run's first one (raised to the caller) or after it "
                     "stopped: Boom: B second"]
    assert swp_threads() == []
