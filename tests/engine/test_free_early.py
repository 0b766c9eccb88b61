"""free_early: a context attribute is deleted as soon as every task that uses it has finished the iteration."""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, List, Set, Tuple

import pytest
import torch

from engine_helpers import swp_threads
from swpipeline import (DataFlowPipeline, FreedAttributeError, IterContext, PipelinePlan, PipelineTask,
                        SimulatedDevice, SWPipeline, TaskSchedule, analyze)

USES = {"A": ((), ("a",)), "B": (("a",), ("b",)), "C": (("a", "b"), ("c",)), "D": (("c",), ("out",))}
USERS = {attr: {t for t, (r, w) in USES.items() if attr in r or attr in w} for attr in ("a", "b", "c", "out")}
Snapshot = Tuple[str, int, FrozenSet[Tuple[int, str]]]


def chain(declare: bool, seen: List[Snapshot], finished: Set[Tuple[str, int]], pipe_box: List[Any],
          group: str = "default", streams: bool = False) -> PipelinePlan:
    """A -> B -> C -> D at stages 0..3; each writes a tensor, C reads two; every unit notes what is alive."""

    def task(name: str) -> Any:
        reads, writes = USES[name]

        def run(ctx: IterContext) -> None:
            live = pipe_box[0].contexts_in_flight() if pipe_box else []  # (analyze() runs before the pipeline)
            alive = frozenset((c.iter_idx, a) for c in live for a in vars(c))
            seen.append((name, ctx.iter_idx, alive))
            value = sum((getattr(ctx, r) for r in reads), torch.full((4,), float(ctx.batch)))
            setattr(ctx, writes[0], value * 2)
            finished.add((name, ctx.iter_idx))
        return run

    schedule = {}
    for stage, name in enumerate(USES):
        reads, writes = USES[name]
        t = PipelineTask(name, task(name), reads=reads if declare else None, writes=writes if declare else None)
        schedule[t] = TaskSchedule(stage=stage, thread_group=group if not streams else name,
                                   stream=name.lower() if streams else None)
    names = list(schedule)
    return PipelinePlan(schedule, intra_iter_deps=[(names[k + 1], names[k]) for k in range(3)] + [(names[2], names[0])])


def run_chain(engine: str, free_early: Any, keep: Tuple[str, ...] = (), n: int = 6
              ) -> Tuple[List[Snapshot], Dict[int, List[str]], List[torch.Tensor]]:
    seen: List[Snapshot] = []
    finished: Set[Tuple[str, int]] = set()
    box: List[Any] = []
    plan = chain(free_early is True, seen, finished, box)
    if free_early == "analysis":
        free_early = analyze(plan, 0)
        seen.clear()
        finished.clear()
    pipe = SWPipeline(plan, device="cpu", free_early=free_early, keep=keep) if engine == "SWPipeline" else \
        DataFlowPipeline(plan, max_depth=4, device="cpu", free_early=free_early, keep=keep)
    box.append(pipe)
    retired: Dict[int, List[str]] = {}
    outs: List[torch.Tensor] = []
    it = pipe.fill_pipeline(range(n))
    while True:
        try:
            idx = pipe.progress(it)
        except StopIteration:
            break
        ctx = pipe.last_context
        retired[idx] = sorted(vars(ctx))
        if "out" in retired[idx]:
            outs.append(ctx.out)
    return seen, retired, outs


@pytest.mark.parametrize("how", [True, "analysis"], ids=["declared", "analysis"])
@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_each_attribute_lives_exactly_while_one_of_its_users_has_not_finished(engine: str, how: Any) -> None:
    seen, retired, outs = run_chain(engine, how, keep=("out",))
    done: Set[Tuple[str, int]] = set()
    for task, it, alive in seen:  # one thread group: units run one at a time, in this order
        for j, attr in alive:
            assert attr == "out" or any((user, j) not in done for user in USERS[attr]), (task, it, j, attr)
        written = {(j, USES[t][1][0]) for t, j in done}
        for j, attr in written:
            still_used = any((user, j) not in done for user in USERS[attr])
            in_flight = any(k == j for k, _ in alive) or j == it
            if attr != "out" and not still_used:
                assert (j, attr) not in alive
            elif in_flight and attr != "out":
                assert (j, attr) in alive, (task, it, j, attr)
        done.add((task, it))
    assert retired == {i: ["out"] for i in range(6)}  # kept; everything else went early
    _, plain_retired, plain_outs = run_chain(engine, False)
    assert plain_retired == {i: ["a", "b", "c", "out"] for i in range(6)}
    assert all(torch.equal(x, y) for x, y in zip(outs, plain_outs)) and len(outs) == 6
    assert swp_threads() == []


def test_without_keep_even_the_last_tasks_output_goes() -> None:
    _, retired, outs = run_chain("SWPipeline", True)
    assert retired == {i: [] for i in range(6)} and outs == []


def late_reader(engine: str, read: Any) -> Any:
    """W writes x, U reads it (both declared), then Late reads x with ``read`` without declaring it."""
    def write(ctx: IterContext) -> None:
        ctx.x = 1

    def use(ctx: IterContext) -> None:
        ctx.y = ctx.x

    def late(ctx: IterContext) -> None:
        ctx.z = read(ctx)

    w, u, lt = (PipelineTask("W", write, reads=(), writes=("x",)), PipelineTask("U", use, reads=("x",), writes=("y",)),
                PipelineTask("Late", late, reads=(), writes=("z",)))
    plan = PipelinePlan({w: TaskSchedule(stage=0), u: TaskSchedule(stage=1), lt: TaskSchedule(stage=2)},
                        intra_iter_deps=[(u, w), (lt, u)])
    return SWPipeline(plan, device="cpu", free_early=True) if engine == "SWPipeline" else DataFlowPipeline(
        plan, max_depth=3, device="cpu", free_early=True)


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_reading_an_attribute_freed_early_says_why(engine: str) -> None:
    pipe = late_reader(engine, lambda ctx: ctx.x)  # reads x without declaring it
    with pytest.raises(FreedAttributeError) as info:
        pipe.run(range(3))
    assert str(info.value) == (
        "IterContext of iteration 0 no longer has 'x': free_early deleted it once every task that declares it "
        "(reads/writes) had finished this iteration. Declare it in the reads of the task that needs it, or pass "
        "keep=('x',) to keep it until the iteration retires")
    assert (getattr(info.value, "swp_task"), getattr(info.value, "swp_iter")) == ("Late", 0)


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_freeing_early_across_streams_is_safe_with_streams_behind_the_host(engine: str) -> None:
    seen: List[Snapshot] = []
    box: List[Any] = []
    plan = chain(True, seen, set(), box, streams=True)  # every task on its own thread group and stream
    device = SimulatedDevice(behind_host=True)
    pipe = SWPipeline(plan, device=device, free_early=True) if engine == "SWPipeline" else DataFlowPipeline(
        plan, max_depth=4, device=device, free_early=True)
    box.append(pipe)
    pipe.run(range(8))
    assert device.hazards == []


def test_free_early_arguments_are_checked() -> None:
    plan = chain(False, [], set(), [])
    with pytest.raises(ValueError) as refused:
        SWPipeline(plan, device="cpu", free_early=True)
    assert str(refused.value) == (
        "free_early=True needs every task's reads= and writes= (the context attributes it touches); not declared "
        "for ['A', 'B', 'C', 'D']. Declare them on each PipelineTask, or pass free_early=analyze(plan, batch)")
    with pytest.raises(ValueError, match=r"keep=\['loss'\] without free_early: nothing is freed early"):
        SWPipeline(plan, device="cpu", keep=("loss",))
    with pytest.raises(TypeError, match=r"free_early must be False, True \(tasks declare reads= and writes=\) or a "
                                        r"PlanAnalysis from analyze\(plan, batch\); got 'yes'"):
        SWPipeline(plan, device="cpu", free_early="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"keep must be a collection of context attribute names"):
        SWPipeline(plan, device="cpu", free_early=True, keep="loss")
    other = PipelinePlan({PipelineTask("Solo", lambda ctx: None): TaskSchedule()})
    with pytest.raises(ValueError, match=r"free_early: the analysis is of another plan \(tasks \['Solo'\], this "
                                         r"plan's \['A', 'B', 'C', 'D'\]\)"):
        SWPipeline(plan, device="cpu", free_early=analyze(other, 0))


_FREED_READS = {
    "getattr with a default": lambda ctx: getattr(ctx, "x", None),
    "hasattr": lambda ctx: hasattr(ctx, "x"),
    "vars().get": lambda ctx: vars(ctx).get("x"),
    "vars().get with a default": lambda ctx: vars(ctx).get("x", 0),
    "in vars()": lambda ctx: "x" in vars(ctx),
    "vars()[]": lambda ctx: vars(ctx)["x"],
    "__dict__.get": lambda ctx: ctx.__dict__.get("x"),
    "vars().pop with a default": lambda ctx: vars(ctx).pop("x", None),
    "vars().setdefault": lambda ctx: vars(ctx).setdefault("x", None),
}


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
@pytest.mark.parametrize("how", sorted(_FREED_READS))
def test_every_way_of_reading_a_freed_attribute_fails_as_clearly(engine: str, how: str) -> None:
    pipe = late_reader(engine, _FREED_READS[how])  # reads x without declaring it: a serial run gives the value
    with pytest.raises(RuntimeError) as info:
        pipe.run(range(3))
    assert not isinstance(info.value, (AttributeError, KeyError))  # no default or fallback may swallow it
    assert str(info.value).startswith("IterContext of iteration 0 no longer has 'x': free_early deleted it")
    assert (getattr(info.value, "swp_task"), getattr(info.value, "swp_iter")) == ("Late", 0)
    assert swp_threads() == []


def test_a_context_without_freed_attributes_behaves_like_a_plain_object() -> None:
    ctx = IterContext(batch=7, iter_idx=0)
    ctx.a = 1
    assert getattr(ctx, "b", None) is None and not hasattr(ctx, "b") and vars(ctx).get("b") is None
    assert "a" in vars(ctx) and vars(ctx)["a"] == 1 and vars(ctx).copy() == {"a": 1}
    with pytest.raises(KeyError):
        vars(ctx)["b"]
    ctx._swp_free(["a"])
    ctx.a = 2  # written again after it was freed: a new value, readable as any other
    assert ctx.a == 2 and vars(ctx).get("a") == 2 and hasattr(ctx, "a")
