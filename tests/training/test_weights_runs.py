"""Every run of a ``WeightVersions`` takes its version 0 from the live weights at its start.

The story (a bug): a run failed before any step finished (the backward of iteration 0
raised), the user loaded other weights (``model.load_state_dict``) and called ``run``
again. Iterations 0..k of the retry computed on the weights the failed attempt had
started from: a run's start was inferred from the iteration numbers, and after a failure
before the first step the next iteration number was 0 again, so version 0 was kept. Here
each retry must equal a reference computed from the loaded weights alone (a fresh copy
of them through the reference loop of ``test_weights``), bitwise: on both engines'
``run`` and ``fill_pipeline``, on ``run_serial``, and driven by hand; with the failed
run's contexts kept alive (held by the exception) and freed.
"""

from __future__ import annotations

import copy
import gc
from typing import Any, List, Optional

import pytest
import torch
from torch import nn

from swpipeline import IterContext
from test_weights import (OPTIMIZERS, Batch, Driver, Pipelined, Reference, assert_same_losses, assert_same_state,
                          batches, mlp)

pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")

RUNNERS = ["SWPipeline.run", "DataFlowPipeline.run", "SWPipeline.fill_pipeline", "DataFlowPipeline.fill_pipeline",
           "run_serial"]


def other_weights() -> nn.Module:
    """The model with weights of its own (what the user loads between the two attempts)."""
    model = mlp()
    with torch.no_grad():
        for k, p in enumerate(model.parameters()):
            p.mul_(-0.5).add_(0.01 * (k + 1))
    return model


def drive(pipe: Any, how: str, data: List[Batch]) -> None:
    """One run of ``data`` the way ``how`` says: ``run``, ``run_serial``, or fill_pipeline + progress + drain."""
    if how == "run":
        pipe.run(data)
    elif how == "run_serial":
        pipe.run_serial(data)
    else:
        try:
            it = pipe.fill_pipeline(data)
            while True:
                try:
                    pipe.progress(it)
                except StopIteration:
                    break
        finally:
            pipe.drain()


@pytest.mark.parametrize("keep_the_failure", [True, False], ids=["contexts-kept", "contexts-freed"])
@pytest.mark.parametrize("fail_at", [0, 3])
@pytest.mark.parametrize("k, placement", [(0, "mixed"), (2, "per-stage")])
@pytest.mark.parametrize("runner", RUNNERS)
def test_a_retry_after_a_load_trains_the_loaded_weights(runner: str, k: int, placement: str, fail_at: int,
                                                        keep_the_failure: bool) -> None:
    data = batches(6)
    engine, how = runner.split(".") if "." in runner else ("SWPipeline", runner)
    run = Pipelined(engine, placement, None, k, OPTIMIZERS["SGD"], len(data))
    run.fail_at = fail_at  # the backward of this iteration raises
    with pytest.raises(ZeroDivisionError) as failure:
        drive(run.pipe, how, data)
    stepped = sum(loss is not None for loss in run.losses)
    assert stepped <= fail_at and (fail_at > 0 or stepped == 0)
    kept: Optional[BaseException] = failure.value if keep_the_failure else None  # its frames hold the contexts
    del failure
    gc.collect()
    loaded = other_weights()
    run.model.load_state_dict(loaded.state_dict())
    run.fail_at = -1
    run.losses = [None] * len(data)
    drive(run.pipe, how, data)
    ref = Reference(copy.deepcopy(loaded), OPTIMIZERS["SGD"], k).run(data)  # SGD keeps no state across runs
    assert_same_losses(run.losses, ref.losses)
    assert_same_state(run.model, ref)
    run.versions.close()
    del kept


@pytest.mark.parametrize("first", [0, 40])
@pytest.mark.parametrize("k", [0, 2])
def test_a_retry_after_a_load_driven_by_hand(k: int, first: int) -> None:
    data = batches(6)
    lib = Driver(mlp(), OPTIMIZERS["SGD-momentum"], k, data, first=first)
    for j in range(k + 1):
        lib.fwd(j)  # the forwards of the failed attempt; its backward of the first iteration raised
    failed = lib.ctxs  # kept alive: the new run must not take them for its own
    loaded = other_weights()
    lib.model.load_state_dict(loaded.state_dict())
    lib.ctxs = [IterContext(batch, first + i) for i, batch in enumerate(data)]
    lib.drive(k, "late")
    ref = Reference(copy.deepcopy(loaded), OPTIMIZERS["SGD-momentum"], k).run(data)
    assert_same_losses(lib.losses, ref.losses)
    assert_same_state(lib.model, ref)
    assert len(failed) == len(data)


def test_the_step_of_an_abandoned_iteration_is_refused_and_changes_nothing() -> None:
    data, k = batches(6), 2
    lib = Driver(mlp(), OPTIMIZERS["SGD"], k, data)
    for j in range(3):
        lib.fwd(j)
        lib.bwd(j)
    lib.step(0)  # iterations 1 and 2 are left in flight
    abandoned = lib.ctxs
    lib.ctxs = [IterContext(batch, i) for i, batch in enumerate(data)]
    lib.fwd(0)  # a new run: its w_0 is the live weights, after the step of the abandoned run's iteration 0
    with pytest.raises(RuntimeError, match=r"WeightVersions.step: iteration 1 belongs to a run that ended \(a new "
                                           r"run started at iteration 0\)"):
        lib.versions.step(abandoned[1], lib.opt)
    with pytest.raises(RuntimeError, match=r"WeightVersions.use: iteration 2 belongs to a run that ended"):
        with lib.versions.use(abandoned[2]):
            pass
    lib.bwd(0)
    lib.step(0)
    for j in range(1, len(data)):
        lib.fwd(j)
        lib.bwd(j)
        lib.step(j)
    ref = Reference(mlp(), OPTIMIZERS["SGD"], k).run(data[:1]).run(data)
    assert_same_losses(lib.losses, ref.losses[1:])
    assert_same_state(lib.model, ref)


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_a_run_abandoned_with_iterations_in_flight_then_a_load_and_a_new_run(engine: str) -> None:
    data, k = batches(6), 2
    run = Pipelined(engine, "per-stage", None, k, OPTIMIZERS["SGD"], len(data))
    it = run.pipe.fill_pipeline(data)
    run.pipe.progress(it)  # iteration 0 retired; later ones in flight
    kept = run.pipe.contexts_in_flight()  # held here: the abandoned iterations' contexts stay alive
    assert kept
    run.pipe.abandon()
    loaded = other_weights()
    run.model.load_state_dict(loaded.state_dict())
    run.losses = [None] * len(data)
    drive(run.pipe, "fill_pipeline", data)
    ref = Reference(copy.deepcopy(loaded), OPTIMIZERS["SGD"], k).run(data)
    assert_same_losses(run.losses, ref.losses)
    assert_same_state(run.model, ref)
    run.versions.close()
    del kept
