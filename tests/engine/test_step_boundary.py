"""The step boundary: between ``progress(it, advance=False)`` and ``advance()`` no task runs.

``progress(advance=False)`` retires iteration k and returns only once every unit already
handed out that can run without a new batch has returned; nothing more is handed out
until ``advance()``. What has run by then is fixed by the plan, never by timing:

* ``SWPipeline``: exactly the units of the periods released so far;
* ``DataFlowPipeline``: every unit handed out that does not wait, directly or through
  others, for a unit of an iteration not fetched yet (it runs ahead of the retirements);
  a thread group on the caller's thread runs only inside ``progress()``, up to
  iteration k's last period.

Each test holds back one unit that the rule says must have run (it blocks until the
caller is seen waiting inside ``progress()`` after the retirement, or has returned), so
a boundary that returned early shows up as a missing start, every time; then it
checks that nothing starts in the gap.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_helpers import ExecLog, check_dependencies, make_plan, output_plan, swp_threads, valid_plans, wait_until
from swpipeline import DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

Unit = Tuple[str, int]
TIMEOUTS: Dict[str, Any] = dict(signal_timeout=10, progress_timeout=10)


def top_frame(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or -1)
    return frame.f_code.co_name if frame is not None else ""


def frames_of(thread: threading.Thread) -> List[str]:
    names = []
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names


class HeldUnit:
    """Hold one unit at the start of its task until the driving thread has retired an iteration and is
    either waiting inside ``progress()`` or back from it; only then does the unit start (and log it)."""

    def __init__(self, log: ExecLog, pipe_box: List[Any], held: Optional[Unit]) -> None:
        self.log, self.pipe_box, self.held = log, pipe_box, held
        self.returned = threading.Event()
        self.driver = threading.current_thread()

    def work(self, name: str) -> Callable[[IterContext], None]:
        def fn(ctx: IterContext) -> None:
            if (name, ctx.iter_idx) == self.held:
                assert wait_until(self._caller_settled, timeout=10)
            self.log.mark("start", name, ctx.iter_idx)  # the task starts here: what it does is logged from now
        return fn

    def _caller_settled(self) -> bool:
        pipe = self.pipe_box[0]
        if self.returned.is_set():
            return True
        retired = pipe.last_context is not None
        return retired and top_frame(self.driver) == "wait" and "progress" in frames_of(self.driver)


def workers_parked() -> bool:
    """Every pipeline worker waits for work, or for a unit that is not handed out (no task runs)."""
    for thread in threading.enumerate():
        if thread.name.startswith("swp-"):
            names = frames_of(thread)
            if names[:1] != ["_serve"] and not ("wait" in names[:2] and ("wait_task" in names or
                                                                       "run_in_turn" in names)):
                return False
    return True


def boundary_run(make: Callable[[PipelinePlan], Any], spec: Dict[str, Tuple[int, Any, str]],
                 intra: List[Tuple[str, str]], held: Optional[Unit]) -> Tuple[Set[Unit], Set[Unit], ExecLog]:
    """Fill with 8 batches, progress(advance=False) once; the units started at its return and in the gap."""
    log = ExecLog()
    box: List[Any] = []
    holder = HeldUnit(log, box, held)
    schedule = {PipelineTask(name, holder.work(name)): TaskSchedule(stage=stage, stream=stream, thread_group=group)
                for name, (stage, stream, group) in spec.items()}
    plan = PipelinePlan(schedule, intra)
    pipe = make(plan)
    box.append(pipe)
    it = pipe.fill_pipeline(range(8))
    try:
        assert pipe.progress(it, advance=False) == 0
        at_return = set(log.starts())
        holder.returned.set()  # a unit still held starts now: in the gap
        assert wait_until(lambda: workers_parked() and set(log.starts()) >= at_return)
        in_gap = set(log.starts()) - at_return
        pipe.advance()
        assert pipe.progress(it) == 1
    finally:
        holder.returned.set()
        pipe.drain()
    trained = sorted(i for t, i in log.starts() if t == "Train")
    assert trained == list(range(len(trained))) and len(trained) >= 2  # drain() trained what was fetched
    return at_return, in_gap, log


LOAD_TRAIN = {"Load": (0, "copy", "io"), "Train": (1, None, "compute")}
PREP_LOAD_TRAIN = {"Prep": (0, "prep", "prep"), "Load": (1, "copy", "io"), "Train": (2, None, "compute")}
CHAIN = [("Load", "Prep"), ("Train", "Load")]


def units(**last: int) -> Set[Unit]:
    """Every unit of each task up to the given iteration."""
    return {(task, i) for task, top in last.items() for i in range(top + 1)}


def test_the_clock_runs_exactly_the_released_periods_before_the_boundary() -> None:
    # depth 2: fill released P0 [Load0] and P1 [Load1, Train0]; Load(1) is held until iteration 0 retired.
    at_return, in_gap, _ = boundary_run(lambda plan: SWPipeline(plan, device="cpu", **TIMEOUTS), LOAD_TRAIN,
                                        [("Train", "Load")], held=("Load", 1))
    assert at_return == units(Load=1, Train=0)
    assert in_gap == set()


def test_the_clock_runs_exactly_the_released_periods_before_the_boundary_three_stages() -> None:
    # depth 3: P0..P2 released; after retiring 0: Prep up to 2, Load up to 1, Train 0.
    at_return, in_gap, _ = boundary_run(lambda plan: SWPipeline(plan, device="cpu", **TIMEOUTS), PREP_LOAD_TRAIN,
                                        CHAIN, held=("Prep", 2))
    assert at_return == units(Prep=2, Load=1, Train=0)
    assert in_gap == set()


@pytest.mark.parametrize("max_depth, expected", [
    (2, units(Load=1, Train=1)),  # contexts 0, 1: every unit of iteration 1 is handed out and runs ahead
    (4, units(Load=3, Train=3)),
])
def test_the_data_flow_engine_settles_what_it_handed_out_before_the_boundary(max_depth: int,
                                                                          expected: Set[Unit]) -> None:
    # The training of iteration max_depth - 1 runs ahead of the retirements: it is held until iteration 0
    # retired, and the boundary must still wait for it (it was handed out), then start nothing more.
    at_return, in_gap, _ = boundary_run(
        lambda plan: DataFlowPipeline(plan, max_depth=max_depth, device="cpu", **TIMEOUTS), LOAD_TRAIN,
        [("Train", "Load")], held=("Train", max_depth - 1))
    assert at_return == expected
    assert in_gap == set()


def test_the_data_flow_engine_stops_at_a_unit_behind_an_iteration_not_fetched() -> None:
    # One thread group runs Load (stage 0) and Train (stage 1) in the order P0 [Load0], P1 [Load1, Train0],
    # P2 [Load2, Train1]: with max_depth 2, Train(1) sits behind Load(2), whose batch is not fetched until
    # advance(); and Note (another group) waits for Train, so Note(1) cannot run either: the boundary must
    # not wait for them.
    spec = {"Load": (0, "copy", "g"), "Train": (1, None, "g"), "Note": (1, "note", "notes")}
    at_return, in_gap, _ = boundary_run(lambda plan: DataFlowPipeline(plan, max_depth=2, device="cpu", **TIMEOUTS),
                                        spec, [("Train", "Load"), ("Note", "Train")], held=None)
    assert at_return == units(Load=1, Train=0, Note=0)
    assert in_gap == set()


def test_the_data_flow_engine_with_the_training_on_the_callers_thread_stops_where_the_clock_does() -> None:
    # A group on the caller's thread runs only inside progress(), up to iteration 0's last period: the
    # training of iteration 1 waits for the next call, as on SWPipeline.
    at_return, in_gap, _ = boundary_run(
        lambda plan: DataFlowPipeline(plan, max_depth=3, device="cpu", caller_thread_group="compute", **TIMEOUTS),
        PREP_LOAD_TRAIN, CHAIN, held=("Prep", 2))
    assert at_return == units(Prep=2, Load=2, Train=0)
    assert in_gap == set()


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_a_task_that_fails_after_the_retirement_surfaces_from_the_boundary(engine: str) -> None:
    class Boom(Exception):
        pass

    def load(ctx: IterContext) -> None:
        if ctx.iter_idx == 1:
            raise Boom("load 1")

    log = ExecLog()
    plan = make_plan(log, LOAD_TRAIN, [("Train", "Load")], work={"Load": load})
    pipe = SWPipeline(plan, device="cpu") if engine == "SWPipeline" else DataFlowPipeline(plan, max_depth=2,
                                                                                          device="cpu")
    it = pipe.fill_pipeline(range(5))
    with pytest.raises(Boom) as info:
        pipe.progress(it, advance=False)  # iteration 0 retires; Load(1) was handed out and fails
    assert (getattr(info.value, "swp_task"), getattr(info.value, "swp_iter")) == ("Load", 1)
    assert swp_threads() == []
    pipe.drain()


# -- random plans, a boundary at every step -------------------------------------------------------------


def clock_boundary(stages: Dict[str, int], fetched: int, k: int) -> Set[Unit]:
    """What ``SWPipeline`` has run at the boundary after retiring iteration ``k`` (no step without a batch so far):
    exactly the units of the periods released, ``k + depth`` of them, of the ``fetched`` iterations."""
    depth = max(stages.values()) + 1
    return {(name, i) for name, stage in stages.items() for i in range(min(k + depth - stage, fetched))}


def data_flow_boundary(pipe: Any, fetched: int, ended: bool) -> Set[Unit]:
    """What ``DataFlowPipeline`` has run at a boundary (no step without a batch so far: iteration i entered in
    period i), worked out here from the plan and each thread group's order alone.

    Handed out: each group's order (by period, then submission position) up to its first unit the rule holds
    back: one of an iteration not fetched, or one that takes turns in a period past the newest fetched iteration
    (its turns are not dealt yet), unless the data ended. Run: every unit handed out whose group's earlier units,
    dependencies and earlier turns (every unit of a dealt period that takes turns on the same line) have run.
    """
    schedule, plan = pipe._schedule, pipe.plan
    decided = sys.maxsize if ended else fetched - 1
    last_period = fetched + schedule.depth - 1
    orders: Dict[str, List[Tuple[int, Any, int]]] = {}
    for group, slots in schedule.lanes.items():
        order = orders[group] = []
        for period, slot in ((p, s) for p in range(last_period) for s in slots):
            it = period - slot.stage
            if it > decided or (slot.takes_turns and period > decided):
                break
            if 0 <= it < fetched:
                order.append((period, slot, it))

    def lines(slot: Any) -> List[Any]:
        return (["global order"] if slot.ordered else []) + ([slot.stream_key] if slot.shares_stream else [])

    turns: Dict[Any, List[Unit]] = {}  # each line's units, in the order they take their turns
    for period in range(min(decided + 1, last_period)):
        for slot in schedule.slots:
            if 0 <= period - slot.stage < fetched:
                for line in lines(slot):
                    turns.setdefault(line, []).append((slot.task, period - slot.stage))
    ran: Set[Unit] = set()
    heads = dict.fromkeys(orders, 0)
    moved = True
    while moved:
        moved = False
        for group, order in orders.items():
            while heads[group] < len(order):
                _, slot, it = order[heads[group]]
                unit = (slot.task, it)
                if not (all((dep, it) in ran for dep in plan.intra[slot.task])
                        and all((dep, it - back) in ran for dep, back in plan.inter[slot.task] if it >= back)
                        and all(set(turns[line][:turns[line].index(unit)]) <= ran for line in lines(slot))):
                    break
                ran.add(unit)
                heads[group] += 1
                moved = True
    return ran


def drive_with_boundaries(pipe: Any, log: ExecLog, batches: int, stages: Optional[Dict[str, int]]) -> int:
    """progress(advance=False) at every step, every third one without a batch; returns the steps.

    At every boundary nothing starts in the gap; up to the first step without a batch the units started are
    exactly those the engine's rule runs: with ``stages``, the clock's (``clock_boundary``), else the data-flow
    engine's (``data_flow_boundary``).
    """
    it = pipe.fill_pipeline(iter(range(batches)))
    k = 0
    while True:
        try:
            assert pipe.progress(None if k % 3 == 2 else it, advance=False) == k
        except StopIteration:
            return k
        at_return = set(log.starts())
        assert wait_until(workers_parked)
        assert set(log.starts()) == at_return, f"started in the gap after iteration {k}"
        if k < 2:
            fetched = len(pipe.contexts_in_flight()) + k + 1
            if stages is not None:
                assert at_return == clock_boundary(stages, fetched, k)
            else:
                assert fetched == min(batches, pipe.max_depth + k)  # nothing fetched since the last advance()
                assert at_return == data_flow_boundary(pipe, fetched, ended=batches < pipe.max_depth + k), k
        pipe.advance()
        k += 1


@pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=valid_plans(), batches=st.integers(1, 9), extra_depth=st.integers(0, 2))
def test_random_plans_never_run_a_task_between_a_boundary_and_advance(shape: Dict[str, Any], batches: int,
                                                                     extra_depth: int) -> None:
    serial_plan, _, serial_values = output_plan(shape)
    SWPipeline(serial_plan, device="cpu").run_serial(range(batches))
    stages = {name: stage for name, (stage, _, _) in shape["spec"].items()}
    for engine in ("SWPipeline", "DataFlowPipeline"):
        plan, log, values = output_plan(shape)
        pipe: Any
        if engine == "SWPipeline":
            pipe = SWPipeline(plan, device="cpu", **TIMEOUTS)
        else:
            pipe = DataFlowPipeline(plan, max_depth=plan.depth + extra_depth, device="cpu", **TIMEOUTS)
        try:
            steps = drive_with_boundaries(pipe, log, batches, stages if engine == "SWPipeline" else None)
        finally:
            pipe.abandon()
        assert steps == batches and values == serial_values  # every batch, as the serial loop computes it
    assert swp_threads() == []


@pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=valid_plans(), batches=st.integers(1, 9), extra_depth=st.integers(0, 2), data=st.data())
def test_random_plans_with_any_group_on_the_callers_thread_and_mixed_steps_compute_as_serial(
        shape: Dict[str, Any], batches: int, extra_depth: int, data: st.DataObject) -> None:
    # Whichever group runs on the caller's thread, a step that goes on runs it only up to the oldest iteration's
    # last units and a held step its whole period: every batch still runs, in dependency order, as serially.
    serial_plan, _, serial_values = output_plan(shape)
    SWPipeline(serial_plan, device="cpu").run_serial(range(batches))
    caller = data.draw(st.sampled_from(sorted({group for _, _, group in shape["spec"].values()})), label="caller")
    holds = data.draw(st.lists(st.booleans(), min_size=batches, max_size=batches), label="held steps")
    for engine in ("SWPipeline", "DataFlowPipeline"):
        plan, log, values = output_plan(shape)
        pipe: Any
        if engine == "SWPipeline":
            pipe = SWPipeline(plan, device="cpu", caller_thread_group=caller, **TIMEOUTS)
        else:
            pipe = DataFlowPipeline(plan, max_depth=plan.depth + extra_depth, device="cpu", caller_thread_group=caller,
                                    **TIMEOUTS)
        it = pipe.fill_pipeline(iter(range(batches)))
        retired = []
        try:
            for k in range(batches + 1):
                try:
                    retired.append(pipe.progress(it, advance=not holds[k % batches]))
                except StopIteration:
                    break
                pipe.advance()
        finally:
            pipe.abandon()
        assert retired == list(range(batches)) and values == serial_values, engine
        check_dependencies(log, plan, batches)
        assert log.threads_of(next(n for n, (_, _, g) in shape["spec"].items() if g == caller)) <= {
            threading.current_thread().name}
    assert swp_threads() == []
