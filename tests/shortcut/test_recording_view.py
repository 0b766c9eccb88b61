"""A checker never changes what a correct task computes: the recording view behaves as the context does.

``check_races=True``, ``analyze()``/``infer_deps()`` and a shortcut's caching run hand a task
a recording view of its context instead of the context. Each of the common ways a task
uses its context (``vars()``, every ``__dict__`` method, ``json.dumps(vars(ctx))``,
``dict(vars(ctx))``, ``{**vars(ctx)}``, a dict keyed by the context, ``isinstance``,
``repr``, ``copy``) must give what ``run_serial`` gives, while each access is still noted.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, List

import pytest
import torch

from swpipeline import DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, RaceError, SWPipeline, TaskSchedule
from swpipeline import analyze, infer_deps
from swpipeline.shortcut.recording import Journal as _Journal, RecordingView as _RecordingView


class Uses:
    """Put leaves attributes and keys a side dict by the context; Use does everything else with the context."""

    def __init__(self) -> None:
        self.side: Dict[Any, int] = {}
        self.summaries: List[Dict[str, Any]] = []

    def put(self, ctx: IterContext) -> None:
        ctx.x = ctx.iter_idx
        ctx.y = [1, 2]
        ctx.tmp = "t"
        self.side[ctx] = 10 * ctx.iter_idx

    def use(self, ctx: IterContext) -> None:
        attrs = vars(ctx)
        summary: Dict[str, Any] = {
            "copy": ctx.__dict__.copy(),
            "json": json.dumps(vars(ctx), sort_keys=True),
            "dict": dict(vars(ctx)),
            "splat": {**vars(ctx)},
            "is a dict": isinstance(attrs, dict) and attrs is vars(ctx) or isinstance(attrs, dict),
            "get": (attrs.get("x"), attrs.get("nope", "default")),
            "in": ("x" in attrs, "nope" in attrs, "x" in ctx.__dict__),
            "len": (len(attrs), bool(attrs)),
            "iter": list(attrs),
            "keys values items": (list(attrs.keys()), list(attrs.values()), list(attrs.items())),
            "eq": attrs == {"x": ctx.iter_idx, "y": [1, 2], "tmp": "t"},
            "side": self.side.pop(ctx),
            "context": (isinstance(ctx, IterContext), ctx == ctx, hash(ctx) == hash(ctx), repr(ctx), str(ctx)),
            "copied context": sorted(vars(copy.copy(ctx))),
            "batch and index": (ctx.batch, ctx.iter_idx),
        }
        attrs.update(z=3)
        attrs.update({"u": 4})
        summary["pop"] = (attrs.pop("tmp"), attrs.pop("nope", "gone"))
        summary["setdefault"] = (attrs.setdefault("w", 5), attrs.setdefault("x", 9))
        attrs["v"] = 6
        del attrs["u"]
        summary["after"] = (sorted(vars(ctx)), ctx.z, ctx.w, ctx.v, hasattr(ctx, "u"), hasattr(ctx, "tmp"))
        self.summaries.append(summary)

    def plan(self) -> PipelinePlan:
        schedule = {PipelineTask("Put", self.put): TaskSchedule(stage=0, thread_group="prep", stream="prep"),
                    PipelineTask("Use", self.use): TaskSchedule(stage=1)}
        return PipelinePlan(schedule, [("Use", "Put")], [])


BATCHES = ["b0", "b1", "b2", "b3"]


def serial_summaries() -> List[Dict[str, Any]]:
    job = Uses()
    SWPipeline(job.plan(), device="cpu").run_serial(BATCHES)
    assert len(job.summaries) == len(BATCHES) and not job.side
    return job.summaries


def test_the_serial_summaries_are_what_a_context_gives() -> None:  # the reference the checked runs must equal
    first = serial_summaries()[0]
    assert first["json"] == '{"tmp": "t", "x": 0, "y": [1, 2]}'
    assert first["after"] == (["v", "w", "x", "y", "z"], 3, 5, 6, False, False)
    assert first["side"] == 0 and first["eq"] and first["in"] == (True, False, True)


@pytest.mark.parametrize("caller", ["auto", None], ids=["caller-runs-last-group", "every-group-on-a-worker"])
@pytest.mark.parametrize("kind", ["SWPipeline", "DataFlowPipeline"])
def test_a_race_checked_run_computes_what_the_serial_run_computes(kind: str, caller: Any) -> None:
    job = Uses()
    plan = job.plan()
    pipe = SWPipeline(plan, device="cpu", caller_thread_group=caller, check_races=True) if kind == "SWPipeline" \
        else DataFlowPipeline(plan, max_depth=3, device="cpu", caller_thread_group=caller, check_races=True)
    pipe.run(BATCHES)
    assert job.summaries == serial_summaries()
    assert pipe._race_checker.warnings == []


def test_analyze_and_infer_deps_record_every_use_and_compute_what_the_serial_run_computes() -> None:
    job = Uses()
    analysis = analyze(job.plan(), BATCHES[0])
    assert job.summaries == serial_summaries()[:1]
    assert analysis.missing_deps == [] and analysis.warnings == []
    # vars(ctx) read as a whole: every attribute any task writes; and what Use reads by name, also when absent
    assert analysis.reads["Use"] == {"ctx.tmp", "ctx.x", "ctx.y", "ctx.nope", "ctx.u", "ctx.v", "ctx.w", "ctx.z"}
    assert analysis.writes["Use"] == {"ctx.tmp", "ctx.u", "ctx.v", "ctx.w", "ctx.z"}
    again = Uses()
    intra, inter = infer_deps(dict(again.plan().schedule), BATCHES[0])
    assert [(t.name, d.name) for t, d in intra] == [("Use", "Put")] and inter == []
    assert again.summaries == serial_summaries()[:1]


@pytest.mark.parametrize("engine", ["serial", "SWPipeline", "DataFlowPipeline"])
def test_a_shortcut_caching_run_computes_what_the_serial_run_computes(engine: str) -> None:
    job = Uses()
    plan = job.plan()
    pipe = SWPipeline(plan, device="cpu") if engine != "DataFlowPipeline" else DataFlowPipeline(plan, max_depth=3,
                                                                                                 device="cpu")
    pipe.enable_shortcut("Use")
    pipe.run_serial(BATCHES) if engine == "serial" else pipe.run(BATCHES)
    assert job.summaries == serial_summaries()[:1]  # Use ran once, caching; the other iterations replayed it


def test_a_higher_order_operator_runs_under_the_checks() -> None:
    def branch(ctx: IterContext) -> None:
        ctx.y = torch.cond(ctx.batch.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (ctx.batch,))

    def collect(results: List[torch.Tensor]) -> Any:
        return lambda ctx: results.append(ctx.y)

    def plan_of(results: List[torch.Tensor]) -> PipelinePlan:
        return PipelinePlan({PipelineTask("Branch", branch): TaskSchedule(stage=0, thread_group="a", stream="a"),
                             PipelineTask("Keep", collect(results)): TaskSchedule(stage=1)}, [("Keep", "Branch")], [])

    batches = [torch.full((2,), float(k - 1)) for k in range(3)]
    serial: List[torch.Tensor] = []
    SWPipeline(plan_of(serial), device="cpu").run_serial(batches)
    checked: List[torch.Tensor] = []
    SWPipeline(plan_of(checked), device="cpu", check_races=True).run(batches)
    assert all(torch.equal(a, b) for a, b in zip(checked, serial)) and len(checked) == 3
    assert analyze(plan_of([]), batches[0]).writes["Branch"] == {"ctx.y"}


@pytest.mark.parametrize("kind", ["SWPipeline", "DataFlowPipeline"])
def test_a_dict_keyed_by_a_task_under_the_checker_finds_the_retired_context(kind: str) -> None:
    job = Uses()
    seen: Dict[Any, int] = {}
    put = job.put

    def put_and_remember(ctx: IterContext) -> None:
        put(ctx)
        seen[ctx] = ctx.iter_idx  # keyed by the recording view the checker handed the task

    job.put = put_and_remember  # type: ignore[method-assign]
    plan = job.plan()
    pipe = SWPipeline(plan, device="cpu", check_races=True) if kind == "SWPipeline" else DataFlowPipeline(
        plan, max_depth=3, device="cpu", check_races=True)
    it = pipe.fill_pipeline(iter(BATCHES))
    retired = []
    while True:
        try:
            pipe.progress(it)
        except StopIteration:
            break
        retired.append(seen.pop(pipe.last_context))  # the engine's own context finds the view's entry
    pipe.drain()
    assert retired == [0, 1, 2, 3] and not seen


def test_the_view_and_the_context_find_each_other_as_dict_keys() -> None:
    ctx = IterContext("batch", 3)
    view = _RecordingView(_Journal(ctx))
    assert view == ctx and ctx == view and not view != ctx and hash(view) == hash(ctx)
    assert {ctx: "real"}[view] == "real" and {view: "view"}[ctx] == "view"
    assert view != IterContext("batch", 3) and view != "batch"
    other = _RecordingView(_Journal(ctx))
    assert view == other and {other: 1}[view] == 1


def test_a_checked_run_still_notes_what_goes_through_vars() -> None:
    def writes_through_vars(ctx: IterContext) -> None:
        vars(ctx)["x"] = 1

    def reads_all(ctx: IterContext) -> None:
        ctx.copy = dict(vars(ctx))

    schedule = {PipelineTask("A", writes_through_vars): TaskSchedule(stage=0, thread_group="a", stream="a"),
                PipelineTask("B", reads_all): TaskSchedule(stage=0, thread_group="b", stream="b")}
    plan = PipelinePlan(schedule, [], [])
    with pytest.raises(RaceError) as info:
        SWPipeline(plan, device="cpu", check_races=True).run(range(2))
    assert str(info.value) == ("race on ctx.x: 'B' (iteration 0) reads ctx.x, which 'A' (iteration 0) writes, and no "
                               "declared dependency orders the two (a serial run runs 'A' first): "
                               "add (\"B\", \"A\") to intra_iter_deps")
    assert [(t, d) for t, d, *_ in analyze(plan, None).missing_deps] == [("B", "A")]
