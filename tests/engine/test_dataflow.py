"""DataFlowPipeline: API parity, bounded buffers, bursts, and random plans on both engines."""

from __future__ import annotations

import re
import threading
from typing import Any, Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_helpers import (ExecLog, check_dependencies, drive, make_plan, output_plan, sparse_dist_plan, swp_threads,
                            valid_plans, wait_until)
from swpipeline import (DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SimulatedDevice, SWPipeline,
                        TaskSchedule)


# Plans here put several thread groups on one stream on purpose (the turns are what is tested).
pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")


def test_public_api_matches_the_clock_driven_engine() -> None:
    common = {"fill_pipeline", "progress", "drain", "run", "run_serial", "run_one_serial_iter", "last_context"}
    for engine in (SWPipeline, DataFlowPipeline):
        assert common <= {n for n in dir(engine) if not n.startswith("_")}


@pytest.mark.parametrize("max_depth", [1, 2, 3, 5])
@pytest.mark.parametrize("num_batches", [0, 1, 2, 7])
def test_every_batch_is_processed(max_depth: int, num_batches: int) -> None:
    log = ExecLog()
    plan = sparse_dist_plan(log)
    pipe = DataFlowPipeline(plan, max_depth=max_depth, device="cpu")
    assert drive(pipe, range(num_batches)) == list(range(num_batches))
    assert check_dependencies(log, plan, num_batches) == 8 * num_batches + max(0, num_batches - 1)
    assert len(log.starts()) == 8 * num_batches
    assert swp_threads() == []


def test_live_contexts_never_exceed_max_depth() -> None:
    sizes: List[int] = []
    box: List[DataFlowPipeline] = []

    def observe(ctx: IterContext) -> None:
        sizes.append(len(box[0].contexts_in_flight()))

    log = ExecLog()
    pipe = DataFlowPipeline(sparse_dist_plan(log, work={"H2D": observe, "OptimizerStep": observe}), max_depth=4,
                            device="cpu")
    box.append(pipe)
    pipe.run(range(40))
    assert max(sizes) <= 4 and len(sizes) == 80


def test_max_depth_one_runs_iterations_one_after_another() -> None:
    log = ExecLog()
    plan = sparse_dist_plan(log)
    DataFlowPipeline(plan, max_depth=1, device="cpu").run(range(6))
    last_end = -1
    for it in range(6):
        starts = [s for s, k, _, i, _ in log.events if k == "start" and i == it]
        ends = [s for s, k, _, i, _ in log.events if k == "end" and i == it]
        assert min(starts) > last_end  # iteration it starts after iteration it-1 ended entirely
        last_end = max(ends)


def test_dependency_free_tasks_burst_during_fill() -> None:
    # The clock-driven engine runs the copy of 2 batches before the first progress() (depth 2);
    # the data-flow engine copies max_depth batches at once.
    gate = threading.Event()
    log = ExecLog()
    spec = {"Copy": (0, "copy", "io"), "Train": (1, None, "compute")}
    plan = make_plan(log, spec, intra=[("Train", "Copy")], work={"Train": lambda ctx: gate.wait(5)})
    copies = lambda: [i for t, i in log.starts() if t == "Copy"]  # noqa: E731
    pipe = DataFlowPipeline(plan, max_depth=5, device="cpu")
    it = pipe.fill_pipeline(range(10))
    assert wait_until(lambda: len(copies()) == 5)
    assert copies() == [0, 1, 2, 3, 4]
    gate.set()
    while True:
        try:
            pipe.progress(it)
        except StopIteration:
            break
    assert copies() == list(range(10))


def test_invalid_max_depth() -> None:
    plan = sparse_dist_plan(ExecLog())
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_depth must be an int >= 1"):
            DataFlowPipeline(plan, max_depth=bad, device="cpu")  # type: ignore[arg-type]


def test_stages_follow_the_same_rules_on_both_engines() -> None:
    # The stages order each thread group's units on both engines, so a plan breaking a stage rule
    # is refused by both.
    log = ExecLog()
    plan = make_plan(log, {"A": (2, None, "g"), "B": (0, None, "g")}, intra=[("B", "A")])
    for engine in (SWPipeline, lambda p, **kw: DataFlowPipeline(p, max_depth=3, **kw)):
        with pytest.raises(ValueError, match="a dependency's stage must be <= the task's stage"):
            engine(plan, device="cpu")


def test_too_small_max_depth_is_refused_with_the_smallest_that_works() -> None:
    # One thread group runs A, B, C (stages 0, 1, 2) in the order the clock gives it: B(0) then A(1) in
    # period 1, C(0) only in period 2. So A(1) comes before C(0): iteration 1 must exist before 0 retires.
    log = ExecLog()
    plan = make_plan(log, {"A": (0, None, "g"), "B": (1, None, "g"), "C": (2, None, "g")},
                     intra=[("B", "A"), ("C", "B")])
    with pytest.raises(ValueError) as refused:
        DataFlowPipeline(plan, max_depth=1, device="cpu")
    assert str(refused.value) == (
        "max_depth=1 is too small for this plan: each thread group runs its units in the order SWPipeline runs "
        "them (on a stream, older iterations first; the stages set how iterations interleave), and that order "
        "needs 2 iterations alive at once (thread group 'g' waits to run A of iteration 1, which has not started); "
        "use max_depth >= 2, or lower the stages")
    pipe = DataFlowPipeline(plan, max_depth=2, device="cpu")  # less than the depth (3), and enough
    pipe.run(range(6))
    assert pipe.peak_live_contexts == 2
    # the clock's order for the thread group: in period p, C(p-2), B(p-1), A(p)
    assert log.starts() == [(name, p - stage) for p in range(8) for name, stage in (("C", 2), ("B", 1), ("A", 0))
                            if 0 <= p - stage < 6]


def test_globally_ordered_units_fire_in_iteration_major_order() -> None:
    issued: List[Tuple[str, int]] = []
    lock = threading.Lock()

    def collective(name: str) -> Any:
        def fn(ctx: IterContext) -> None:
            with lock:
                issued.append((name, ctx.iter_idx))
        return fn

    tasks = {n: PipelineTask(n, collective(n)) for n in ("Load", "AllToAll", "AllReduce")}
    plan = PipelinePlan({tasks["Load"]: TaskSchedule(thread_group="io"),
                         tasks["AllToAll"]: TaskSchedule(thread_group="comm", stream="a", globally_ordered=True),
                         tasks["AllReduce"]: TaskSchedule(thread_group="compute", stream="b",
                                                          globally_ordered=True)},
                        intra_iter_deps=[("AllToAll", "Load"), ("AllReduce", "Load")])
    DataFlowPipeline(plan, max_depth=4, device="cpu").run(range(30))
    ordered = [x for x in issued if x[0] != "Load"]
    assert ordered == [(n, i) for i in range(30) for n in ("AllReduce", "AllToAll")]


# -- random plans on both engines ------------------------------------------------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=valid_plans(), iters=st.integers(1, 24), max_depth=st.integers(1, 4))
def test_random_valid_plans_run_correctly_on_both_engines(shape: Dict[str, Any], iters: int, max_depth: int) -> None:
    plan, _, serial_values = output_plan(shape)
    SWPipeline(plan, device="cpu").run_serial(range(iters))
    try:
        DataFlowPipeline(plan, max_depth=max_depth, device="cpu")
    except ValueError as refused:  # too few live iterations for this plan's order: it says how many
        assert max_depth < plan.depth
        max_depth = int(re.search(r"use max_depth >= (\d+)", str(refused)).group(1))  # type: ignore[union-attr]
        assert max_depth <= plan.depth
    for make in (lambda p: SWPipeline(p, device=SimulatedDevice(), signal_timeout=5),
                 lambda p: DataFlowPipeline(p, max_depth=max_depth, device="cpu", signal_timeout=5)):
        plan, log, values = output_plan(shape)
        pipe = make(plan)
        pipe.run(range(iters))
        check_dependencies(log, plan, iters)
        assert values == serial_values
    assert swp_threads() == []


@st.composite
def invalid_plans(draw: st.DrawFn) -> Dict[str, Any]:
    shape = draw(valid_plans())
    names = list(shape["spec"])
    kind = draw(st.sampled_from(["cycle", "intra_stage_rule", "inter_stage_rule", "self"]))
    if kind == "cycle":
        a, b = names[0], names[1]
        shape["intra"] = [p for p in shape["intra"] if p != (b, a)] + [(a, b), (b, a)]
    elif kind == "self":
        shape["intra"].append((names[0], names[0]))
    else:
        low, high = names[0], names[-1]
        spec = dict(shape["spec"])
        spec[low] = (0,) + tuple(spec[low][1:])
        spec[high] = (2 if kind == "inter_stage_rule" else 1,) + tuple(spec[high][1:])
        shape["spec"] = spec
        shape["intra" if kind == "intra_stage_rule" else "inter"].append((low, high))
    shape["kind"] = kind
    return shape


@settings(max_examples=40, deadline=None)
@given(shape=invalid_plans())
def test_random_invalid_plans_are_rejected_at_construction(shape: Dict[str, Any]) -> None:
    log = ExecLog()
    with pytest.raises(ValueError):
        plan = make_plan(log, shape["spec"], shape["intra"], shape["inter"])
        SWPipeline(plan, device="cpu")
    if shape["kind"] in ("cycle", "self"):
        with pytest.raises(ValueError):
            DataFlowPipeline(make_plan(log, shape["spec"], shape["intra"], shape["inter"]), max_depth=2)
    assert swp_threads() == []


def test_a_unit_published_with_its_context_completes_at_once_under_constant_thread_switches() -> None:
    # A worker may pick up a unit of an iteration as soon as its context is visible; completing it must
    # need nothing the fetching thread sets up afterwards. Switch threads as often as the interpreter can.
    import sys

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):
            log = ExecLog()
            plan = make_plan(log, {"Copy": (0, "copy", "io"), "Train": (0, None, "compute")},
                             intra=[("Train", "Copy")])
            assert drive(DataFlowPipeline(plan, max_depth=4, device="cpu"), range(12)) == list(range(12))
    finally:
        sys.setswitchinterval(old_interval)

def test_run_runs_the_last_stage_on_the_caller_when_max_depth_allows_it() -> None:
    # Group "g" runs A (stage 0) before Z (stage 1) in each period (they are on different streams, so the
    # order inside a period is by name): Z(i) is handed out only once iteration i + 1 exists. U, on the
    # caller's thread, waits for Z: the caller runs only the units up to the oldest iteration's last
    # period, so it never waits for a Z that needs it to hand out a new iteration first (without that
    # limit, U(1) would wait for Z(1), behind A(2), which needs iteration 0 retired).
    main = threading.current_thread().name
    log = ExecLog()
    plan = make_plan(log, {"A": (0, "sa", "g"), "Z": (1, "sz", "g"), "U": (1, None, "default")}, intra=[("U", "Z")])
    assert SWPipeline(plan, device="cpu").enqueue_order == ["A", "Z", "U"]
    for max_depth in (2, 3):
        log.events.clear()
        DataFlowPipeline(plan, max_depth=max_depth, device="cpu", signal_timeout=5, progress_timeout=5).run(range(9))
        assert log.threads_of("U") == {main} and log.threads_of("A") == {"swp-g"}
        assert check_dependencies(log, plan, 9) == 9
    log = ExecLog()
    sparse = sparse_dist_plan(log)  # depth 3, and it runs with 2 live iterations
    DataFlowPipeline(sparse, max_depth=2, device="cpu").run(range(5))  # fewer live iterations than the depth
    assert log.threads_of("Forward") == {"swp-default"}
    with pytest.raises(ValueError, match=r"caller_thread_group='default': a thread group on the caller's thread "
                                         r"needs max_depth >= the plan's depth \(3\), got max_depth=2"):
        DataFlowPipeline(sparse, max_depth=2, device="cpu", caller_thread_group="default")
    assert swp_threads() == []
