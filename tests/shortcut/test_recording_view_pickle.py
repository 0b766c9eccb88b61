"""Pickling, saving and copying the context under the checks gives what it gives in a plain run.

``check_races=True`` (both engines and ``run_serial``), ``analyze()`` and a shortcut's caching
run hand a task a recording view of its context. ``pickle.dumps(ctx)`` and
``torch.save(ctx, buf)`` used to fail there (``PicklingError: args[0] from __newobj__ args has
the wrong class``: pickle checks the class of the object it saves against the class its
reduction names, and the view's class is not ``IterContext``). A checker must never change
what a correct task computes: the bytes, and what they load back to, must be the plain run's.
Pickling or copying the context looks at every attribute at once, so the checkers count it
as a read of all of them.
"""

from __future__ import annotations

import copy
import io
import pickle
from typing import Any, Callable, Dict, List

import pytest
import torch

from swpipeline import DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, RaceError, SWPipeline, TaskSchedule
from swpipeline import analyze


def _described(ctx: Any) -> Any:
    """What a loaded or copied context holds, comparable with ==: its class, index, batch and attributes."""
    attrs = {name: value.tolist() if isinstance(value, torch.Tensor) else value for name, value in vars(ctx).items()}
    return type(ctx), ctx.iter_idx, ctx.batch.tolist(), attrs


class Saves:
    """Put leaves attributes (a tensor among them); Save pickles, saves and copies the whole context."""

    def __init__(self) -> None:
        self.seen: List[Dict[str, Any]] = []

    def put(self, ctx: IterContext) -> None:
        ctx.x = torch.arange(3) + ctx.iter_idx
        ctx.name = f"it{ctx.iter_idx}"
        ctx.pair = (ctx.iter_idx, [1, 2])

    def save(self, ctx: IterContext) -> None:
        buffer = io.BytesIO()
        torch.save(ctx, buffer)
        pickled = pickle.dumps(ctx)
        self.seen.append({  # (pickle's bytes name each tensor's storage by its address: only what they load to)
            "unpickled": _described(pickle.loads(pickled)),
            "unpickled protocol 2": _described(pickle.loads(pickle.dumps(ctx, protocol=2))),
            "torch.save": buffer.getvalue(),
            "torch.load": _described(torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)),
            "copy": _described(copy.copy(ctx)),
            "deepcopy": _described(copy.deepcopy(ctx)),
        })

    def plan(self) -> PipelinePlan:
        schedule = {PipelineTask("Put", self.put): TaskSchedule(stage=0, thread_group="prep", stream="prep"),
                    PipelineTask("Save", self.save): TaskSchedule(stage=1)}
        return PipelinePlan(schedule, [("Save", "Put")], [])


BATCHES = [torch.full((2,), float(k)) for k in range(4)]


def plain_seen() -> List[Dict[str, Any]]:
    job = Saves()
    SWPipeline(job.plan(), device="cpu").run_serial(BATCHES)
    return job.seen


def test_the_plain_run_pickles_a_context() -> None:  # the reference the checked runs must equal
    first = plain_seen()[0]
    assert first["unpickled"] == (IterContext, 0, [0.0, 0.0], {"x": [0, 1, 2], "name": "it0", "pair": (0, [1, 2])})
    assert first["torch.load"] == first["unpickled"] == first["copy"] == first["deepcopy"]


RUNS: Dict[str, Callable[[PipelinePlan], None]] = {
    "SWPipeline": lambda plan: SWPipeline(plan, device="cpu", check_races=True).run(BATCHES),
    "DataFlowPipeline": lambda plan: DataFlowPipeline(plan, max_depth=3, device="cpu", check_races=True).run(BATCHES),
    "run_serial": lambda plan: SWPipeline(plan, device="cpu", check_races=True).run_serial(BATCHES),
}


@pytest.mark.parametrize("run", list(RUNS))
def test_a_race_checked_task_pickles_its_context_as_a_plain_run_does(run: str) -> None:
    job = Saves()
    RUNS[run](job.plan())
    assert job.seen == plain_seen()


def test_analyze_lets_a_task_pickle_its_context_and_counts_it_a_read_of_every_attribute() -> None:
    job = Saves()
    analysis = analyze(job.plan(), BATCHES[0])
    assert job.seen == plain_seen()[:1]
    assert analysis.missing_deps == [] and analysis.warnings == []
    assert {"ctx.x", "ctx.name", "ctx.pair"} <= analysis.reads["Save"]


@pytest.mark.parametrize("engine", ["serial", "SWPipeline", "DataFlowPipeline"])
def test_a_shortcut_caching_run_pickles_the_context_as_a_plain_run_does(engine: str) -> None:
    job = Saves()
    plan = job.plan()
    pipe = DataFlowPipeline(plan, max_depth=3, device="cpu") if engine == "DataFlowPipeline" \
        else SWPipeline(plan, device="cpu")
    pipe.enable_shortcut("Save")
    pipe.run_serial(BATCHES) if engine == "serial" else pipe.run(BATCHES)
    assert job.seen == plain_seen()[:1]  # Save ran once, caching; the other iterations replayed it


@pytest.mark.parametrize("how", ["pickle", "torch.save", "copy", "deepcopy"])
def test_pickling_or_copying_the_context_is_a_read_of_every_attribute_for_the_checkers(how: str) -> None:
    def writes(ctx: IterContext) -> None:
        ctx.x = 1

    looks = {"pickle": pickle.dumps, "torch.save": lambda ctx: torch.save(ctx, io.BytesIO()),
             "copy": copy.copy, "deepcopy": copy.deepcopy}[how]
    schedule = {PipelineTask("A", writes): TaskSchedule(stage=0, thread_group="a", stream="a"),
                PipelineTask("B", lambda ctx: looks(ctx)): TaskSchedule(stage=0, thread_group="b", stream="b")}
    plan = PipelinePlan(schedule, [], [])
    with pytest.raises(RaceError) as info:
        SWPipeline(plan, device="cpu", check_races=True).run(range(2))
    assert str(info.value) == ("race on ctx.x: 'B' (iteration 0) reads ctx.x, which 'A' (iteration 0) writes, and no "
                               "declared dependency orders the two (a serial run runs 'A' first): "
                               "add (\"B\", \"A\") to intra_iter_deps")
    assert [(t, d) for t, d, *_ in analyze(plan, None).missing_deps] == [("B", "A")]
