"""RaceChecker: every context access checked against the declared dependencies, on both engines.

The checker wraps task functions. ``SWPipeline(plan, check_races=True)`` and
``DataFlowPipeline(..., check_races=True)`` wrap every task's (tested first); most tests
here run PipelineTasks that carry wrapped functions (``checked``), which is the same.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_helpers import Fn, plan_of, valid_plans
from swpipeline import DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SWPipeline
from swpipeline import RaceChecker, RaceError
from swpipeline.analysis.races import HappensBefore, Placement


# Plans here put several thread groups on one stream on purpose (the turns are what is tested).
pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")



def checked(plan: PipelinePlan, strict: bool = False) -> Tuple[PipelinePlan, RaceChecker]:
    """The same plan, its tasks carrying race-checked functions."""
    checker = RaceChecker(plan, strict=strict)
    schedule = {PipelineTask(t.name, checker.wrap(t)): plan.schedules[t.name] for t in plan.tasks}
    return PipelinePlan(schedule, list(plan.intra_iter_deps), list(plan.inter_iter_deps)), checker


def engine(kind: str, plan: PipelinePlan, **kwargs: Any) -> Any:
    if kind == "SWPipeline":
        return SWPipeline(plan, device="cpu", **kwargs)
    return DataFlowPipeline(plan, max_depth=plan.depth + 1, device="cpu")


def write_x(ctx: IterContext) -> None:
    ctx.x = ctx.iter_idx


def read_x(ctx: IterContext) -> None:
    ctx.seen = getattr(ctx, "x", None)  # a tolerant read: the silent-staleness kind of bug


MISSING_INTRA = ("race on ctx.x: 'B' (iteration 0) reads ctx.x, which 'A' (iteration 0) writes, and no declared "
                 "dependency orders the two (a serial run runs 'A' first): add (\"B\", \"A\") to intra_iter_deps")


@pytest.mark.parametrize("kind", ["SWPipeline", "DataFlowPipeline"])
def test_check_races_true_catches_a_missing_dependency_in_a_pipelined_run(kind: str) -> None:
    plan = plan_of({"A": (0, "s1", "a", write_x), "B": (0, "s2", "b", read_x)})
    pipe = SWPipeline(plan, device="cpu", check_races=True) if kind == "SWPipeline" else DataFlowPipeline(
        plan, max_depth=2, device="cpu", check_races=True)
    with pytest.raises(RaceError) as info:
        pipe.run(range(5))
    assert str(info.value) == MISSING_INTRA
    seen: List[int] = []
    fixed = plan_of({"A": (0, "s1", "a", write_x), "B": (0, "s2", "b", lambda ctx: seen.append(ctx.x))},
                    intra=[("B", "A")])
    pipe = SWPipeline(fixed, device="cpu", check_races=True) if kind == "SWPipeline" else DataFlowPipeline(
        fixed, max_depth=2, device="cpu", check_races=True)
    pipe.run(range(5))
    assert seen == [0, 1, 2, 3, 4]
    with pytest.raises(TypeError, match="check_races must be True or False, got 'yes'"):
        SWPipeline(fixed, device="cpu", check_races="yes")  # type: ignore[arg-type]


def test_check_races_composes_with_shortcuts() -> None:
    seen: List[int] = []
    plan = plan_of({"A": (0, "s1", "a", write_x), "B": (1, "s2", "b", lambda ctx: seen.append(ctx.x))},
                   intra=[("B", "A")])
    pipe = SWPipeline(plan, device="cpu", check_races=True)
    pipe.enable_shortcut("A")
    pipe.run(range(4))
    assert seen == [0, 0, 0, 0]  # A's first value, cached, then replayed


@pytest.mark.parametrize("kind", ["SWPipeline", "DataFlowPipeline"])
@pytest.mark.parametrize("groups", [("a", "b"), ("default", "b"), ("a", "default")],
                         ids=["a-b", "default-b", "a-default"])
def test_a_missing_intra_dependency_raises_in_the_first_iteration(kind: str, groups: Tuple[str, str]) -> None:
    plan, _ = checked(plan_of({"A": (0, "s1", groups[0], write_x), "B": (0, "s2", groups[1], read_x)}))
    with pytest.raises(RaceError) as info:
        engine(kind, plan).run(range(5))
    assert str(info.value) == MISSING_INTRA
    assert (info.value.attribute, info.value.first, info.value.second) == ("ctx.x", ("A", 0), ("B", 0))
    assert getattr(info.value, "swp_iter") == 0


def test_the_caller_thread_group_is_checked_too() -> None:
    plan, _ = checked(plan_of({"A": (0, "s1", "a", write_x), "B": (0, None, "default", read_x)}))
    with pytest.raises(RaceError, match="race on ctx.x: 'B' \\(iteration 0\\) reads ctx.x"):
        SWPipeline(plan, device="cpu", caller_thread_group="default").run(range(3))


@pytest.mark.parametrize("reader_first", [True, False], ids=["reader-first", "writer-first"])
def test_the_error_is_the_same_whichever_task_touches_the_attribute_first(reader_first: bool) -> None:
    turn = threading.Event()

    def writer(ctx: IterContext) -> None:
        if reader_first:
            assert turn.wait(5)
        ctx.x = 1
        turn.set()

    def reader(ctx: IterContext) -> None:
        if reader_first:  # the writer goes on once the reader waits at its read for the tasks that could set x
            threading.Timer(0.05, turn.set).start()
        else:
            assert turn.wait(5)
        ctx.seen = getattr(ctx, "x", None)
        turn.set()

    plan, _ = checked(plan_of({"A": (0, "s1", "a", writer), "B": (0, "s2", "b", reader)}))
    with pytest.raises(RaceError) as info:
        SWPipeline(plan, device="cpu").run(range(1))
    assert str(info.value) == MISSING_INTRA
    assert getattr(info.value, "swp_task") == ("A" if reader_first else "B")  # raised by the second access


def test_run_serial_is_checked_as_well() -> None:
    plan, _ = checked(plan_of({"A": (0, "s1", "a", write_x), "B": (0, "s2", "b", read_x)}))
    with pytest.raises(RaceError) as info:
        SWPipeline(plan, device="cpu").run_serial(range(2))
    assert str(info.value) == MISSING_INTRA


@pytest.mark.parametrize("kind", ["SWPipeline", "DataFlowPipeline"])
def test_the_fixed_plan_runs_without_a_report(kind: str) -> None:
    plan, checker = checked(plan_of({"A": (0, "s1", "a", write_x), "B": (0, "s2", "b", read_x)}, intra=[("B", "A")]))
    engine(kind, plan).run(range(6))
    assert checker.warnings == []


def delete_x(ctx: IterContext) -> None:
    del ctx.x


def test_a_delete_conflicts_with_a_read() -> None:
    spec = {"A": (0, None, "a", write_x), "B": (0, "s1", "b", read_x), "C": (0, "s2", "c", delete_x)}
    plan, _ = checked(plan_of(spec, intra=[("B", "A"), ("C", "A")]))
    with pytest.raises(RaceError) as info:
        SWPipeline(plan, device="cpu").run_serial(range(1))
    assert str(info.value) == ("race on ctx.x: 'C' (iteration 0) deletes ctx.x, which 'B' (iteration 0) reads, and "
                               "no declared dependency orders the two (a serial run runs 'B' first): add (\"C\", "
                               "\"B\") to intra_iter_deps")


def test_a_conflict_only_the_placement_orders_is_a_warning_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    plan, checker = checked(plan_of({"A": (0, None, "default", write_x), "B": (0, None, "default", read_x)}))
    with caplog.at_level(logging.WARNING, logger="swpipeline"):
        SWPipeline(plan, device="cpu").run(range(4))
    expected = ("'B' (iteration 0) reads ctx.x, which 'A' (iteration 0) writes; only the placement orders the two "
                "(both on thread group 'default' and the default stream), so another thread group or stream would "
                "race: add (\"B\", \"A\") to intra_iter_deps")
    assert checker.warnings == [expected]
    assert [r.getMessage() for r in caplog.records] == [f"swpipeline race check: {expected}"]


def test_strict_raises_for_a_conflict_only_the_placement_orders() -> None:
    plan, _ = checked(plan_of({"A": (0, None, "default", write_x), "B": (0, None, "default", read_x)}), strict=True)
    with pytest.raises(RaceError, match="a serial run runs 'A' first\\): add"):
        SWPipeline(plan, device="cpu").run(range(2))


def test_a_placement_that_runs_the_reader_first_is_an_error_even_without_strict() -> None:
    # one stage, one thread group: the serial order breaks the tie by name (A first), a stream by declaration (B first)
    plan, _ = checked(plan_of({"B": (0, None, "default", read_x), "A": (0, None, "default", write_x)}))
    with pytest.raises(RaceError) as info:
        SWPipeline(plan, device="cpu").run(range(3))
    assert str(info.value) == ("race on ctx.x: 'B' (iteration 0) reads ctx.x, which 'A' (iteration 0) writes, and no "
                               "declared dependency orders the two (a serial run runs 'A' first; this placement runs "
                               "'B' first): add (\"B\", \"A\") to intra_iter_deps")


def test_wrap_uses_the_given_function_and_refuses_bad_arguments() -> None:
    plan = plan_of({"A": (0, None, "default", write_x), "B": (0, None, "default", read_x)}, intra=[("B", "A")])
    checker = RaceChecker(plan)
    calls: List[int] = []
    wrapped = checker.wrap("A", lambda ctx: calls.append(ctx.iter_idx))
    wrapped(IterContext(None, 7))
    assert calls == [7]
    with pytest.raises(ValueError, match="RaceChecker.wrap: unknown task 'Z'; the plan's tasks are \\['A', 'B'\\]"):
        checker.wrap("Z")
    with pytest.raises(TypeError, match="RaceChecker.wrap: fn for 'A' must be callable, got int"):
        checker.wrap("A", 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="RaceChecker: plan must be a PipelinePlan, got dict"):
        RaceChecker({})  # type: ignore[arg-type]


# -- happens-before and placement, on paper ------------------------------------------------------------


def test_happens_before_follows_intra_and_inter_chains_and_each_tasks_own_iterations() -> None:
    relation = HappensBefore(["P", "F", "B", "S"], {"F": ["P"], "B": ["F"], "S": ["B"]}, {"F": ["S"]})
    assert relation.before("P", "S") and not relation.before("S", "P")
    assert relation.before("S", "F", 1) and not relation.before("S", "P", 1)  # P(i) depends on nothing
    assert relation.before("P", "F", 1) and relation.before("P", "P", 1)  # F(i) -> P(i) -> P(i-1): P's own order
    assert relation.before("S", "F", 2) and not relation.before("S", "P", 2)
    assert not HappensBefore(["A", "B"], {}, {}).before("A", "B", 3)


def test_placement_orders_by_period_then_submission_position() -> None:
    plan = plan_of({"A": (1, None, "g", write_x), "B": (0, None, "g", read_x), "C": (0, "s", "h", read_x)})
    placement = Placement(plan)
    assert placement.before("A", "B", 1) is True  # A(i-1) runs in period i, before B(i) in the same period
    assert placement.before("B", "A", 0) is True and placement.before("A", "B", 0) is False
    assert placement.before("A", "C", 1) is None
    assert placement.shared("A", "B") == "thread group 'g' and the default stream"


# -- the fuzz suite's random valid plans: tasks read along their declared dependencies --------------------


def along_dependencies(shape: Dict[str, Any]) -> PipelinePlan:
    deps: Dict[str, List[str]] = {n: [] for n in shape["spec"]}
    for task, dep in shape["intra"]:
        deps[task].append(dep)

    def task_fn(name: str) -> Fn:
        def fn(ctx: IterContext) -> None:
            total = sum(getattr(ctx, f"v_{d}") for d in deps[name])
            setattr(ctx, f"v_{name}", total + 1)
        return fn

    spec = {n: (stage, stream, group, task_fn(n)) for n, (stage, stream, group) in shape["spec"].items()}
    return plan_of(spec, shape["intra"], shape["inter"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=valid_plans(), iters=st.integers(1, 6))
def test_random_valid_plans_run_without_a_report_on_both_engines(shape: Dict[str, Any], iters: int) -> None:
    for kind in ("SWPipeline", "DataFlowPipeline"):
        plan, checker = checked(along_dependencies(shape))
        engine(kind, plan).run(range(iters))
        assert checker.warnings == []


def test_a_shortcut_task_is_checked_when_it_caches_and_when_it_replays() -> None:
    from swpipeline.shortcut.replay import ShortcutTable

    for intra, raises in (([("B", "A")], False), ([], True)):
        plan = plan_of({"A": (0, "s1", "a", write_x), "B": (0, "s2", "b", read_x)}, intra=intra)
        checker, table = RaceChecker(plan), ShortcutTable(plan.tasks)
        table.enable(("A",))
        task_a, task_b = plan.tasks
        run_a, run_b = checker.wrap(task_a, table.executor(task_a)), checker.wrap(task_b)  # as the engine would
        seen = []
        for it in range(3):  # iteration 0 caches A's result, 1 and 2 replay it
            ctx = IterContext(None, it)
            run_a(ctx)
            if raises:
                with pytest.raises(RaceError, match="race on ctx.x: 'B' \\(iteration"):
                    run_b(ctx)
            else:
                run_b(ctx)
                seen.append(ctx.seen)
        assert seen == ([] if raises else [0, 0, 0])  # replays restore what iteration 0 wrote
