"""The plan model: data classes, PipelinePlan validation, and the engine's stage rules."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, List, Set, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swpipeline import DataFlowPipeline, DeclaredIO, IterContext, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
from swpipeline.plan.model import NamedOnlyTask

import seed_plans


def fn_a(ctx: Any) -> None:
    ctx.a = 1


def fn_b(ctx: Any) -> None:
    ctx.b = 2


S0 = TaskSchedule()
S1 = TaskSchedule(stage=1)
S2 = TaskSchedule(stage=2)


def plan_with(field: str, deps: Any, schedule: Any = None) -> PipelinePlan:
    """A plan (default: A and B at stage 0) with ``field`` (intra_iter_deps or inter_iter_deps) set to ``deps``."""
    kwargs: Dict[str, Any] = {field: deps}
    return PipelinePlan(schedule if schedule is not None else {"A": S0, "B": S0}, **kwargs)


# -- IterContext -------------------------------------------------------------------------------


def test_iter_context_holds_batch_index_and_arbitrary_attributes() -> None:
    batch = {"x": [1, 2]}
    ctx: Any = IterContext(batch, 7)  # tasks attach arbitrary attributes
    assert ctx.batch is batch
    assert ctx.iter_idx == 7
    ctx.x_gpu = "tensor"
    ctx.logits = 3
    assert ctx.x_gpu == "tensor"
    assert repr(ctx) == "IterContext(iter_idx=7, attrs=['logits', 'x_gpu'])"
    del ctx.x_gpu  # tasks free intermediate results early
    assert not hasattr(ctx, "x_gpu")
    assert repr(ctx) == "IterContext(iter_idx=7, attrs=['logits'])"


def test_iter_contexts_are_independent() -> None:
    a: Any = IterContext(None, 0)
    b = IterContext(None, 1)
    a.x = 1
    assert not hasattr(b, "x")


# -- DeclaredIO --------------------------------------------------------------------------------


def test_declared_io_keeps_its_callables_and_is_frozen() -> None:
    shared: Dict[str, int] = {"k": 1}
    io = DeclaredIO(capture=lambda: dict(shared), restore=lambda s: shared.update(s))
    snap = io.capture()
    shared["k"] = 5
    io.restore(snap)
    assert shared == {"k": 1}
    with pytest.raises(dataclasses.FrozenInstanceError):
        io.capture = lambda: None  # type: ignore[misc]


@pytest.mark.parametrize("capture, restore", [
    (None, lambda v: None),
    (lambda: 1, "restore"),
    (1, 2),
])
def test_declared_io_rejects_non_callables(capture: object, restore: object) -> None:
    with pytest.raises(TypeError, match=r"DeclaredIO: capture and restore must both be callables"):
        DeclaredIO(capture=capture, restore=restore)  # type: ignore[arg-type]


# -- PipelineTask ------------------------------------------------------------------------------


def test_pipeline_task_hash_is_by_name_and_equality_by_name_and_function() -> None:
    a1 = PipelineTask("A", fn_a)
    a2 = PipelineTask("A", fn_b)  # same name, different function: a different task
    b = PipelineTask("B", fn_a)  # same function, different name
    assert a1 == PipelineTask("A", fn_a)  # the same task declared twice
    assert a1 != a2
    assert hash(a1) == hash(a2) == hash("A")
    assert a1 != b
    assert len({a1, a2, b, PipelineTask("A", fn_a)}) == 3
    assert a1 != "A"  # a name string is not a task
    assert repr(a1) == "PipelineTask('A')"


def test_pipeline_task_is_a_usable_dict_key() -> None:
    a = PipelineTask("A", fn_a)
    d = {a: TaskSchedule(stage=1)}
    assert d[PipelineTask("A", fn_a)].stage == 1  # the same task, declared again
    assert PipelineTask("B", fn_a) not in d and PipelineTask("A", fn_b) not in d


def test_pipeline_task_defaults_and_io() -> None:
    a, b = PipelineTask("A", fn_a), PipelineTask("B", fn_b)
    assert a.io == [] and b.io == []
    a.io.append(DeclaredIO(lambda: 1, lambda v: None))
    assert b.io == []  # no shared mutable default
    io = DeclaredIO(lambda: 1, lambda v: None)
    t = PipelineTask("T", fn_a, io=(io,))  # type: ignore[arg-type]
    assert t.io == [io] and isinstance(t.io, list)


@pytest.mark.parametrize("name", ["", None, 3, b"A"])
def test_pipeline_task_rejects_bad_names(name: object) -> None:
    with pytest.raises(TypeError, match=r"PipelineTask: name must be a non-empty str"):
        PipelineTask(name, fn_a)  # type: ignore[arg-type]


def test_pipeline_task_rejects_non_callable_fn() -> None:
    with pytest.raises(TypeError, match=r"PipelineTask 'A': fn must be callable, got int"):
        PipelineTask("A", 3)  # type: ignore[arg-type]


def test_pipeline_task_rejects_bad_io_entries() -> None:
    with pytest.raises(TypeError, match=r"PipelineTask 'A': io entries must be DeclaredIO, got tuple"):
        PipelineTask("A", fn_a, io=[(lambda: 1, lambda v: None)])  # type: ignore[list-item]


# -- TaskSchedule ------------------------------------------------------------------------------


def test_task_schedule_defaults() -> None:
    s = TaskSchedule()
    assert (s.stage, s.stream, s.thread_group, s.globally_ordered) == (0, None, "default", False)
    assert TaskSchedule(stage=2).stage == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.stage = 1  # type: ignore[misc]


def test_task_schedule_accepts_the_seed_examples() -> None:
    s = TaskSchedule(stage=0, stream="memcpy", thread_group="io")
    assert (s.stage, s.stream, s.thread_group) == (0, "memcpy", "io")
    assert TaskSchedule(stage=1, globally_ordered=True).globally_ordered is True
    obj = FakeStream()
    assert TaskSchedule(stream=obj).stream is obj  # a stream object is allowed


@pytest.mark.parametrize("stage", [True, False, "1", 1.0, None])
def test_task_schedule_stage_must_be_an_int(stage: object) -> None:
    with pytest.raises(TypeError, match=r"TaskSchedule: stage must be an int, got " + re.escape(repr(stage))):
        TaskSchedule(stage=stage)  # type: ignore[arg-type]


@pytest.mark.parametrize("group", ["", None, 1])
def test_task_schedule_thread_group_must_be_a_non_empty_str(group: object) -> None:
    with pytest.raises(TypeError, match=r"TaskSchedule: thread_group must be a non-empty str"):
        TaskSchedule(thread_group=group)  # type: ignore[arg-type]


@pytest.mark.parametrize("flag", [1, 0, "yes", None])
def test_task_schedule_globally_ordered_must_be_a_bool(flag: object) -> None:
    with pytest.raises(TypeError, match=r"TaskSchedule: globally_ordered must be a bool"):
        TaskSchedule(globally_ordered=flag)  # type: ignore[arg-type]


def test_task_schedule_rejects_an_empty_stream_name() -> None:
    with pytest.raises(ValueError, match=r"stream name must be non-empty \(use None for the default stream\)"):
        TaskSchedule(stream="")


# -- PipelinePlan: what a valid plan holds -------------------------------------------------------


def test_plan_lists_tasks_in_declaration_order_with_resolved_deps() -> None:
    plan = seed_plans.sparse_dist()
    assert plan.task_names == ["H2D", "InputDistStart", "InputDistWait", "ZeroGrad", "WaitBatch", "Forward",
                               "Backward", "OptimizerStep"]
    assert plan.intra == {
        "H2D": [], "InputDistStart": ["H2D"], "InputDistWait": ["InputDistStart"], "ZeroGrad": [],
        "WaitBatch": ["InputDistWait", "ZeroGrad"], "Forward": ["InputDistWait", "WaitBatch"],
        "Backward": ["Forward"], "OptimizerStep": ["Backward"],
    }
    assert plan.inter == {n: ([("OptimizerStep", 1)] if n == "Forward" else []) for n in plan.task_names}
    assert plan.stage("InputDistWait") == 1
    assert plan.schedules["InputDistStart"].globally_ordered is True
    assert plan.depth == 3 and plan.pipeline_depth == 3


def test_string_keys_declare_named_only_tasks_that_cannot_run() -> None:
    plan = PipelinePlan({"A": S0})
    task = plan.task("A")
    assert isinstance(task, NamedOnlyTask) and task.name == "A"
    with pytest.raises(RuntimeError, match=r"task 'A' has no function.*PipelineTask\('A', fn\)"):
        task.fn(IterContext(None, 0))
    with pytest.raises(KeyError):
        plan.task("B")


def test_object_and_name_references_give_the_same_plan() -> None:
    by_name = seed_plans.fused_sparse_dist()
    by_object = seed_plans.fused_sparse_dist(make_fn=seed_plans.noop)
    assert by_object.task_names == by_name.task_names
    assert by_object.intra == by_name.intra
    assert by_object.inter == by_name.inter
    assert by_object.schedules == by_name.schedules
    assert by_object.depth == by_name.depth
    assert all(type(t) is PipelineTask for t in by_object.tasks)

    a, b = PipelineTask("A", fn_a), PipelineTask("B", fn_b)
    mixed = PipelinePlan({a: S0, b: S1}, intra_iter_deps=[("B", a)], inter_iter_deps=[(a, "B")])
    assert mixed.intra == {"A": [], "B": ["A"]}
    assert mixed.inter == {"A": [("B", 1)], "B": []}
    assert mixed.task("A") is a


def test_schedule_may_be_a_sequence_of_pairs() -> None:
    a, b = PipelineTask("A", fn_a), PipelineTask("B", fn_b)
    for schedule in ([(b, S1), (a, S0)], ((b, S1), (a, S0))):
        plan = PipelinePlan(schedule, intra_iter_deps=[(b, a)])
        assert plan.task_names == ["B", "A"]
        assert plan.depth == 2


def test_repeated_dependency_pairs_are_kept_once() -> None:
    plan = PipelinePlan({"A": S0, "B": S0}, intra_iter_deps=[("B", "A"), ("B", "A")],
                        inter_iter_deps=[("A", "B"), ("A", "B")])
    assert plan.intra["B"] == ["A"]
    assert plan.inter["A"] == [("B", 1)]


def test_inter_iteration_self_dependency_is_allowed() -> None:
    plan = PipelinePlan({"A": S0, "B": S1}, inter_iter_deps=[("A", "A"), ("B", "B")])
    assert plan.inter == {"A": [("A", 1)], "B": [("B", 1)]}
    SWPipeline(plan, device="cpu")  # k = 0: the previous iteration ran in an earlier period


@pytest.mark.parametrize("stages, depth", [([0], 1), ([0, 0], 1), ([1, 0], 2), ([0, 2], 3), ([3, 3, 1], 4)])
def test_pipeline_depth_is_inferred_as_max_stage_plus_one(stages: List[int], depth: int) -> None:
    plan = PipelinePlan({f"T{k}": TaskSchedule(stage=s) for k, s in enumerate(stages)})
    assert plan.depth == depth
    assert plan.pipeline_depth == depth
    assert PipelinePlan({f"T{k}": TaskSchedule(stage=s) for k, s in enumerate(stages)},
                        pipeline_depth=depth).depth == depth


@pytest.mark.parametrize("given_depth", [1, 2, 4])
def test_contradicting_pipeline_depth_is_rejected(given_depth: int) -> None:
    msg = (f"pipeline_depth={given_depth} contradicts the stages: max(stage) + 1 = 3 "
           f"(deepest tasks: ['B', 'C']); omit pipeline_depth or set it to 3")
    with pytest.raises(ValueError, match=re.escape(msg)):
        PipelinePlan({"A": S0, "B": S2, "C": S2}, pipeline_depth=given_depth)


@pytest.mark.parametrize("depth", [2.0, "2", True])
def test_pipeline_depth_must_be_an_int(depth: object) -> None:
    with pytest.raises(TypeError, match=r"pipeline_depth must be an int or None, got " + re.escape(repr(depth))):
        PipelinePlan({"A": S0, "B": S1}, pipeline_depth=depth)  # type: ignore[arg-type]


# -- PipelinePlan: rejected plans ------------------------------------------------------------------


@pytest.mark.parametrize("schedule", [{}, [], ()])
def test_empty_schedule_is_rejected(schedule: object) -> None:
    with pytest.raises(ValueError, match=r"schedule is empty: a plan needs at least one task"):
        PipelinePlan(schedule)  # type: ignore[arg-type]


def test_duplicate_name_from_a_string_key_and_a_task_key() -> None:
    schedule: Dict[Any, TaskSchedule] = {"A": S0, PipelineTask("A", fn_a): S1}
    assert len(schedule) == 2  # the dict keeps both keys: a str never equals a task
    with pytest.raises(ValueError, match=r"schedule: duplicate task name 'A'; every task needs a unique name"):
        PipelinePlan(schedule)


def test_duplicate_name_from_two_task_objects_in_pairs() -> None:
    with pytest.raises(ValueError, match=r"schedule: two different tasks are named 'A'"):
        PipelinePlan([(PipelineTask("A", fn_a), S0), (PipelineTask("A", fn_b), S1)])


def test_two_different_tasks_with_one_name_in_the_dict_form_are_refused() -> None:
    schedule = {PipelineTask("A", fn_a): S0, PipelineTask("A", fn_b): S1}
    assert len(schedule) == 2  # one name, but different tasks: the dict keeps both
    with pytest.raises(ValueError) as refused:
        PipelinePlan(schedule)
    assert str(refused.value) == (
        "schedule: two different tasks are named 'A' (functions fn_a and fn_b); every task needs its own name: "
        "rename one of them")


def test_one_task_or_an_identical_twin_twice_in_the_dict_form_is_one_task() -> None:
    a = PipelineTask("A", fn_a)
    assert PipelinePlan({a: S0, PipelineTask("A", fn_a): S1}).schedules == {"A": S1}  # same function: harmless
    assert PipelinePlan({a: S0}).tasks == [a]


def test_duplicate_name_in_a_sequence_of_pairs() -> None:
    with pytest.raises(ValueError, match=r"schedule: duplicate task name 'B'"):
        PipelinePlan([("A", S0), ("B", S0), ("B", S1)])


@pytest.mark.parametrize("field", ["intra_iter_deps", "inter_iter_deps"])
def test_dependency_on_a_different_task_object_with_a_scheduled_name(field: str) -> None:
    a, b = PipelineTask("A", fn_a), PipelineTask("B", fn_b)
    impostor = PipelineTask("A", fn_b)
    with pytest.raises(ValueError, match=rf"{field}: the PipelineTask named 'A' is not the object in the schedule "
                                         rf"\(another object with the same name, whose function and io the plan "
                                         rf"would ignore\); refer to the scheduled task object or to its name"):
        plan_with(field, [(b, impostor)], {a: S0, b: S0})
    with pytest.raises(ValueError, match=rf"{field}: the PipelineTask named 'A' is not the object in the schedule"):
        plan_with(field, [(impostor, b)], {a: S0, b: S0})


@pytest.mark.parametrize("field", ["intra_iter_deps", "inter_iter_deps"])
@pytest.mark.parametrize("pair", [("A", "X"), ("X", "A"), ("A", PipelineTask("Nope", fn_a))])
def test_unknown_task_references_are_rejected(field: str, pair: Tuple[object, object]) -> None:
    bad = pair[1] if pair[0] == "A" else pair[0]
    name = bad if isinstance(bad, str) else bad.name  # type: ignore[attr-defined]
    msg = f"{field}: unknown task {name!r}; add it to the schedule or fix the name (known: ['A', 'B'])"
    with pytest.raises(ValueError, match=re.escape(msg)):
        plan_with(field, [pair])


def test_intra_iteration_self_dependency_is_rejected() -> None:
    a = PipelineTask("A", fn_a)
    with pytest.raises(ValueError, match=r"intra_iter_deps: 'A' depends on itself; remove the pair.*inter_iter_deps"):
        PipelinePlan({a: S0}, intra_iter_deps=[(a, a)])
    with pytest.raises(ValueError, match=r"intra_iter_deps: 'B' depends on itself"):
        PipelinePlan({"A": S0, "B": S0}, intra_iter_deps=[("B", "A"), ("B", "B")])


def test_intra_iteration_cycle_is_rejected_and_listed() -> None:
    msg = ("intra_iter_deps: dependency cycle 'A' -> 'B' -> 'C' -> 'A' (read 'a -> b' as 'a depends on b'); "
           "a plan's intra-iteration dependencies must form a DAG")
    with pytest.raises(ValueError, match=re.escape(msg)):
        PipelinePlan({"A": S0, "B": S0, "C": S0}, intra_iter_deps=[("A", "B"), ("B", "C"), ("C", "A")])


def test_two_task_cycle_behind_an_acyclic_prefix() -> None:
    with pytest.raises(ValueError, match=re.escape("dependency cycle 'C' -> 'D' -> 'C'")):
        PipelinePlan({"A": S0, "B": S0, "C": S0, "D": S0},
                     intra_iter_deps=[("B", "A"), ("C", "B"), ("C", "D"), ("D", "C")])


def test_an_inter_iteration_back_edge_is_not_a_cycle() -> None:
    plan = PipelinePlan({"F": S0, "B": S0, "O": S0}, intra_iter_deps=[("B", "F"), ("O", "B")],
                        inter_iter_deps=[("F", "O")])
    assert plan.inter["F"] == [("O", 1)]


def test_negative_stage_is_rejected_naming_the_task() -> None:
    with pytest.raises(ValueError, match=re.escape("schedule['Fwd']: stage -1 is negative; stages count from 0")):
        PipelinePlan({"H2D": S0, "Fwd": TaskSchedule(stage=-1)})
    with pytest.raises(ValueError, match=r"schedule\['T'\]: stage -3 is negative"):
        PipelinePlan([(PipelineTask("T", fn_a), TaskSchedule(stage=-3))])


@pytest.mark.parametrize("schedule, kind", [("AB", "str"), ({"A", "B"}, "set"), (None, "NoneType"),
                                            (iter([("A", S0)]), "list_iterator")])
def test_schedule_must_be_a_mapping_or_pairs(schedule: object, kind: str) -> None:
    with pytest.raises(TypeError, match=rf"schedule must be a dict of task -> TaskSchedule, got {kind}"):
        PipelinePlan(schedule)  # type: ignore[arg-type]


@pytest.mark.parametrize("entry", [("A",), ("A", S0, 1), ["A", S0], "A"])
def test_schedule_entries_must_be_pairs(entry: object) -> None:
    with pytest.raises(TypeError, match=r"schedule: entries must be \(task, TaskSchedule\) pairs"):
        PipelinePlan([entry])  # type: ignore[list-item]


@pytest.mark.parametrize("key, kind", [(1, "int"), (None, "NoneType"), (b"A", "bytes"), (fn_a, "function")])
def test_schedule_keys_must_be_tasks_or_names(key: object, kind: str) -> None:
    with pytest.raises(TypeError, match=rf"schedule: keys must be PipelineTask objects or names, got {kind}"):
        PipelinePlan({key: S0})  # type: ignore[dict-item]


@pytest.mark.parametrize("value, kind", [(0, "int"), ({"stage": 0}, "dict"), (None, "NoneType")])
def test_schedule_values_must_be_task_schedules(value: object, kind: str) -> None:
    with pytest.raises(TypeError, match=rf"schedule\['A'\]: expected a TaskSchedule, got {kind}"):
        PipelinePlan({"A": value})  # type: ignore[dict-item]


@pytest.mark.parametrize("field", ["intra_iter_deps", "inter_iter_deps"])
@pytest.mark.parametrize("deps, kind", [("AB", "str"), (None, "NoneType"), ({("A", "B")}, "set"),
                                        ({"A": "B"}, "dict")])
def test_deps_must_be_a_list(field: str, deps: object, kind: str) -> None:
    triples = r" or \(task, depends_on, distance\) triples" if field == "inter_iter_deps" else ""
    with pytest.raises(TypeError, match=rf"{field} must be a list of \(task, depends_on\) pairs{triples}, got {kind}"):
        plan_with(field, deps)


@pytest.mark.parametrize("field", ["intra_iter_deps", "inter_iter_deps"])
@pytest.mark.parametrize("entry", [("A",), ("A", "B", 2, 3), "AB", None])
def test_deps_entries_must_be_pairs(field: str, entry: object) -> None:
    with pytest.raises(TypeError, match=rf"{field}: entries must be \(task, depends_on\) pairs"):
        plan_with(field, [entry])


def test_intra_iteration_entries_have_no_distance() -> None:
    with pytest.raises(TypeError, match=r"intra_iter_deps: entries must be \(task, depends_on\) pairs, got "
                                        r"\('A', 'B', 1\)"):
        plan_with("intra_iter_deps", [("A", "B", 1)])


@pytest.mark.parametrize("distance", ["2", 1.0, True, None])
def test_a_distance_must_be_an_int(distance: object) -> None:
    with pytest.raises(TypeError, match=rf"inter_iter_deps: the distance of \('A', 'B'\) must be an int >= 1 "
                                        rf"\(the task at iteration i needs 'B' at iteration i - distance\), got "
                                        rf"{re.escape(repr(distance))}"):
        plan_with("inter_iter_deps", [("A", "B", distance)])


@pytest.mark.parametrize("distance", [0, -1])
def test_a_distance_below_one_is_refused_and_names_intra_iter_deps(distance: int) -> None:
    with pytest.raises(ValueError, match=rf"the distance of \('A', 'B'\) is {distance}; it must be >= 1 .*a "
                                         r"dependency in the same iteration goes in intra_iter_deps"):
        plan_with("inter_iter_deps", [("A", "B", distance)])


def test_a_dependency_at_two_distances_keeps_the_nearer_one_and_pairs_are_distance_one() -> None:
    plan = PipelinePlan({"A": S0, "B": S0, "C": S0}, inter_iter_deps=[("A", "B", 3), ("A", "B"), ("A", "C", 2),
                                                                      ("A", "C", 4), ("B", "C", 2)])
    assert plan.inter == {"A": [("B", 1), ("C", 2)], "B": [("C", 2)], "C": []}
    assert plan.inter_entries() == [("A", "B"), ("A", "C", 2), ("B", "C", 2)]
    assert plan.reach == 2
    assert PipelinePlan({"A": S0}).reach == 1


@pytest.mark.parametrize("field", ["intra_iter_deps", "inter_iter_deps"])
def test_deps_refer_to_tasks_by_object_or_name_only(field: str) -> None:
    with pytest.raises(TypeError, match=rf"{field}: tasks are referred to by PipelineTask or name, got int 1"):
        plan_with(field, [("A", 1)])


# -- cycle detection against a reference ---------------------------------------------------------


def _has_cycle(n: int, edges: Set[Tuple[int, int]]) -> bool:
    indeg = {k: 0 for k in range(n)}
    for _, d in edges:
        indeg[d] += 1
    ready = [k for k in range(n) if indeg[k] == 0]
    seen = 0
    while ready:
        k = ready.pop()
        seen += 1
        for s, d in edges:
            if s == k:
                indeg[d] -= 1
                if indeg[d] == 0:
                    ready.append(d)
    return seen != n


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.just(n), st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda e: e[0] != e[1])))))
def test_cycle_detection_matches_a_reference(case: Tuple[int, Set[Tuple[int, int]]]) -> None:
    n, edges = case  # (a, b): a depends on b
    names = [f"T{k}" for k in range(n)]
    deps = [(names[a], names[b]) for a, b in sorted(edges)]
    if not _has_cycle(n, edges):
        plan = PipelinePlan({name: S0 for name in names}, intra_iter_deps=deps)
        assert sorted((t, d) for t in plan.task_names for d in plan.intra[t]) == sorted(deps)
        return
    with pytest.raises(ValueError, match=r"intra_iter_deps: dependency cycle") as info:
        PipelinePlan({name: S0 for name in names}, intra_iter_deps=deps)
    listed = re.search(r"dependency cycle (.*?) \(read", str(info.value))
    assert listed is not None
    cycle = [s.strip("'") for s in listed.group(1).split(" -> ")]
    assert cycle[0] == cycle[-1] and len(cycle) >= 3
    assert len(set(cycle[:-1])) == len(cycle) - 1  # a simple cycle
    for a, b in zip(cycle, cycle[1:]):
        assert (a, b) in deps  # each step is a declared "a depends on b"


# -- SWPipeline: the engine's stage rules --------------------------------------------------------


def test_intra_stage_rule_a_dependency_on_a_later_stage_is_rejected() -> None:
    plan = PipelinePlan({"H2D": S0, "Forward": S0, "Optim": S2},
                        intra_iter_deps=[("Forward", "H2D"), ("Forward", "Optim")])
    msg = ("intra_iter_deps: 'Forward' (stage 0) depends on 'Optim' (stage 2); a dependency's stage must be "
           "<= the task's stage (a later stage runs in a later period: 'Forward' would wait for it forever)")
    with pytest.raises(ValueError, match=re.escape(msg)) as info:
        SWPipeline(plan, device="cpu")
    assert "use inter_iter_deps if 'Forward' needs iteration i-1" in str(info.value)


def test_inter_stage_rule_fwd_waiting_for_opt_two_stages_later_is_rejected() -> None:
    # Seed 000, deadlock scenario 3: fwd(s=0), bwd(s=1), opt(s=2), fwd.inter_iter_deps=[opt] -> k=2.
    plan = PipelinePlan({"fwd": S0, "bwd": S1, "opt": S2}, intra_iter_deps=[("bwd", "fwd"), ("opt", "bwd")],
                        inter_iter_deps=[("fwd", "opt")])
    msg = ("inter_iter_deps: 'fwd' (stage 0) depends on 'opt' (stage 2) of the previous iteration; "
           "the stage gap is 2 > 1, so 'opt' of iteration i-1 would run in a later period than 'fwd' of iteration "
           "i, which would wait for it forever. A dependency at distance d may be at most d stages later than its "
           "task: reduce the gap to <= 1, or, if 'fwd' may use an older result of 'opt', declare ('fwd', 'opt', 2) "
           "in inter_iter_deps")
    with pytest.raises(ValueError, match=re.escape(msg)):
        SWPipeline(plan, device="cpu")


@pytest.mark.parametrize("engine", [SWPipeline, DataFlowPipeline])
def test_a_dependency_at_distance_d_may_be_d_stages_later_and_no_more(engine: Any) -> None:
    intra = [("bwd", "fwd"), ("opt", "bwd")]
    engine(PipelinePlan({"fwd": S0, "bwd": S1, "opt": S2}, intra, [("fwd", "opt", 2)]), device="cpu")
    engine(PipelinePlan({"fwd": S0, "bwd": S1, "opt": S2}, intra, [("fwd", "opt", 3)]), device="cpu")
    plan = PipelinePlan({"fwd": S0, "bwd": S1, "opt": S2, "late": TaskSchedule(stage=3)},
                        [*intra, ("late", "opt")], [("fwd", "late", 2)])
    msg = ("inter_iter_deps: 'fwd' (stage 0) depends on 'late' (stage 3) of iteration i-2; the stage gap is 3 > 2, "
           "so 'late' of iteration i-2 would run in a later period than 'fwd' of iteration i, which would wait for "
           "it forever. A dependency at distance d may be at most d stages later than its task: reduce the gap to "
           "<= 2, or, if 'fwd' may use an older result of 'late', declare ('fwd', 'late', 3) in inter_iter_deps")
    with pytest.raises(ValueError, match=re.escape(msg)):
        engine(plan, device="cpu")


@pytest.mark.parametrize("fwd, bwd, opt, depth", [
    (0, 0, 0, 1),  # placement A: k = 0
    (0, 0, 1, 2),  # placement B: k = 1
    (0, 1, 1, 2),  # placement C: k = 1
])
def test_seed_fwd_bwd_opt_arrangements_with_inter_deps_are_accepted(fwd: int, bwd: int, opt: int,
                                                                     depth: int) -> None:
    plan = PipelinePlan({"fwd": TaskSchedule(stage=fwd), "bwd": TaskSchedule(stage=bwd),
                         "opt": TaskSchedule(stage=opt)},
                        intra_iter_deps=[("bwd", "fwd"), ("opt", "bwd")], inter_iter_deps=[("fwd", "opt")])
    assert SWPipeline(plan, device="cpu").depth == depth


@pytest.mark.parametrize("fwd, bwd, opt, depth", [(0, 0, 0, 1), (0, 0, 1, 2), (0, 1, 1, 2), (0, 1, 2, 3)])
def test_seed_fwd_bwd_opt_arrangements_without_inter_deps_are_accepted(fwd: int, bwd: int, opt: int,
                                                                        depth: int) -> None:
    plan = PipelinePlan({"fwd": TaskSchedule(stage=fwd), "bwd": TaskSchedule(stage=bwd),
                         "opt": TaskSchedule(stage=opt)}, intra_iter_deps=[("bwd", "fwd"), ("opt", "bwd")])
    assert SWPipeline(plan, device="cpu").depth == depth


@pytest.mark.parametrize("task_stage, dep_stage", [(0, 1), (2, 3), (1, 1), (3, 0), (2, 1)])
def test_inter_deps_with_k_at_most_1_are_accepted(task_stage: int, dep_stage: int) -> None:
    plan = PipelinePlan({"T": TaskSchedule(stage=task_stage), "D": TaskSchedule(stage=dep_stage)},
                        inter_iter_deps=[("T", "D")])
    SWPipeline(plan, device="cpu")


def test_inter_stage_rule_gap_larger_than_two_is_rejected_too() -> None:
    plan = PipelinePlan({"T": S0, "D": TaskSchedule(stage=3)}, inter_iter_deps=[("T", "D")])
    with pytest.raises(ValueError, match=r"'T' \(stage 0\) depends on 'D' \(stage 3\).*gap is 3 > 1"):
        SWPipeline(plan, device="cpu")


def test_every_seed_plan_passes_the_stage_rules() -> None:
    for name, builder in seed_plans.ALL_BUILDERS.items():
        pipe = SWPipeline(builder(), device="cpu")
        assert pipe.depth == builder().depth, name


def test_swpipeline_rejects_a_non_plan() -> None:
    with pytest.raises(TypeError, match=r"plan must be a PipelinePlan, got dict"):
        SWPipeline({"A": S0}, device="cpu")  # type: ignore[arg-type]


# -- input validation: every bad value is refused before any work starts ------------------------------


class FakeStream:
    """What the engine needs of a stream object on the CPU: an identity (and a display name)."""

    swp_name = "fake"

    def wait_event(self, event: Any) -> None: ...

    def wait_stream(self, stream: Any) -> None: ...


@pytest.mark.parametrize("stream", [3, 2.5, True, ["s"], {"s": 1}, b"s", object()], ids=lambda s: type(s).__name__)
def test_a_stream_must_be_none_a_name_or_a_stream_object(stream: object) -> None:
    with pytest.raises(TypeError, match=r"TaskSchedule: stream must be None \(the default stream\), a stream name "
                                        r"\(str\) or a torch stream object; got " + type(stream).__name__):
        TaskSchedule(stream=stream)


def test_a_device_is_not_a_stream() -> None:
    import torch

    with pytest.raises(TypeError, match=r"got torch.device 'cpu': a device says where streams live"):
        TaskSchedule(stream=torch.device("cpu"))


def test_stream_objects_are_accepted() -> None:
    import torch

    for stream in (FakeStream(), torch.cpu.Stream()):
        assert TaskSchedule(stream=stream).stream is stream


def test_an_absurd_stage_is_refused() -> None:
    with pytest.raises(ValueError, match=r"TaskSchedule: stage 1000000000 is too large.*at most 1024"):
        TaskSchedule(stage=10**9)
    assert TaskSchedule(stage=1024).stage == 1024


@pytest.mark.parametrize("field", ["intra_iter_deps", "inter_iter_deps"])
def test_a_dependency_on_another_object_with_a_scheduled_name_is_refused_even_with_the_same_fn(field: str) -> None:
    a, b = PipelineTask("A", fn_a), PipelineTask("B", fn_b)
    twin = PipelineTask("A", fn_a)  # same name, same function, but not the scheduled object
    with pytest.raises(ValueError, match=rf"{field}: the PipelineTask named 'A' is not the object in the schedule"):
        plan_with(field, [(b, twin)], {a: S0, b: S0})
    with pytest.raises(ValueError, match=rf"{field}: the PipelineTask named 'A' is not the object in the schedule"):
        plan_with(field, [(b, PipelineTask("A", fn_a))], {"A": S0, b: S0})  # the schedule named it by a string


@pytest.mark.parametrize("value", [float("inf"), 1e300, float("nan"), -1.0, 0, "5", None, True])
@pytest.mark.parametrize("arg", ["signal_timeout", "progress_timeout", "join_timeout"])
def test_timeouts_must_be_finite_positive_seconds(arg: str, value: object) -> None:
    from swpipeline import DataFlowPipeline

    plan = PipelinePlan({PipelineTask("A", fn_a): S0})
    for engine in (SWPipeline, DataFlowPipeline):
        with pytest.raises((TypeError, ValueError), match=rf"{arg} must be a finite number of seconds > 0"):
            engine(plan, device="cpu", **{arg: value})


def test_a_trace_path_that_cannot_be_written_is_refused_before_the_run(tmp_path: Any) -> None:
    ran: List[int] = []
    plan = PipelinePlan({PipelineTask("A", lambda ctx: ran.append(ctx.iter_idx)): S0})
    pipe = SWPipeline(plan, device="cpu")
    (tmp_path / "a_file").write_text("")
    for bad in (tmp_path / "a_file" / "run.json", tmp_path):
        with pytest.raises(ValueError, match=r"trace: cannot write the trace to"):
            pipe.run(range(3), trace=bad)
    assert ran == []


def test_requires_python_matches_what_the_code_uses() -> None:
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"  # the error path uses BaseException.add_note (3.11)


def test_comparing_namesakes_leaves_both_tasks_usable_in_later_plans() -> None:
    # Comparing two tasks, looking one up in a set or dict, or a plan refused for a duplicate: none of it may
    # mark a task for good (each later plan holding one of them is a plan of its own).
    a1, a2, b = PipelineTask("A", fn_a), PipelineTask("A", fn_b), PipelineTask("B", fn_b)
    assert a1 != a2 and not (a1 == a2) and hash(a1) == hash(a2)  # one name, two different tasks
    assert a1 == PipelineTask("A", fn_a)  # the same task declared twice (same function and io) is one task
    assert a2 not in {a1} and {a1: S0}.get(a2) is None and [a1].count(a2) == 0
    assert PipelinePlan({a1: S0, b: S1}).tasks == [a1, b]
    assert PipelinePlan({a2: S0, b: S1}).tasks == [a2, b]
    with pytest.raises(ValueError, match=r"schedule: two different tasks are named 'A'"):
        PipelinePlan([(a1, S0), (a2, S1)])
    assert PipelinePlan({a1: S0}).tasks == [a1] and PipelinePlan({a2: S0}).tasks == [a2]


def test_two_namesakes_in_a_dict_are_refused_however_the_dict_was_built() -> None:
    a1, a2 = PipelineTask("A", fn_a), PipelineTask("A", fn_b)
    updated: Dict[Any, TaskSchedule] = {a1: S0}
    updated[a2] = S1
    for schedule in ({a1: S0, a2: S1}, updated, dict([(a1, S0), (a2, S1)]), {t: S0 for t in (a1, a2)}):
        assert len(schedule) == 2  # the dict keeps both: they are different tasks
        with pytest.raises(ValueError, match=r"two different tasks are named 'A' \(functions fn_a and fn_b\)"):
            PipelinePlan(schedule)
    renamed = PipelineTask("A2", fn_b)
    assert PipelinePlan({a1: S0, renamed: S1}).task_names == ["A", "A2"]
