"""The seed's deadlock scenarios, run end to end, and the submission sequencer.

Scenarios 1 and 2 would deadlock with a stage-ascending submission order; the
engine's order submits the supplier first. We show both halves: the ascending
order breaks a period-local edge (so a FIFO worker would block on a task queued
behind it), and the engine runs the plan to completion with a short signal
timeout (a deadlock would surface as DependencyTimeoutError, not hang).
"""

from __future__ import annotations

import threading
from typing import Dict, List, Tuple

import pytest

from engine_helpers import ExecLog, check_dependencies, make_plan, swp_threads
from swpipeline import SequencerTimeoutError, SWPipeline
from swpipeline.errors import PipelineAborted
from swpipeline.plan.ordering import period_local_edges
from swpipeline.engine.signals import Turns


# Plans here put several thread groups on one stream on purpose (the turns are what is tested).
pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")


def ascending(plan_stages: Dict[str, int]) -> List[str]:
    return sorted(plan_stages, key=lambda n: (plan_stages[n], n))


def breaks_an_edge(order: List[str], edges: List[Tuple[str, str]]) -> bool:
    pos = {n: k for k, n in enumerate(order)}
    return any(pos[src] > pos[dst] for src, dst in edges)


def test_scenario_1_single_thread_k1() -> None:
    log = ExecLog()
    plan = make_plan(log, {"A": (0, None, "T1"), "B": (1, None, "T1")}, inter=[("A", "B")])
    stages = {n: plan.stage(n) for n in plan.task_names}
    assert breaks_an_edge(ascending(stages), period_local_edges(plan))  # A before B: A waits forever
    pipe = SWPipeline(plan, device="cpu", signal_timeout=2.0)
    assert pipe.enqueue_order == ["B", "A"]
    pipe.run(range(50))
    assert check_dependencies(log, plan, 50) == 49


def test_scenario_2_cross_thread_k1() -> None:
    log = ExecLog()
    spec = {"A": (0, "x", "T1"), "D": (1, "y", "T1"), "C": (0, "z", "T2"), "B": (1, "w", "T2")}
    plan = make_plan(log, spec, inter=[("A", "B"), ("C", "D")])
    stages = {n: plan.stage(n) for n in plan.task_names}
    assert breaks_an_edge(ascending(stages), period_local_edges(plan))
    pipe = SWPipeline(plan, device="cpu", signal_timeout=2.0)
    order = pipe.enqueue_order
    assert order.index("B") < order.index("A") and order.index("D") < order.index("C")
    pipe.run(range(50))
    assert check_dependencies(log, plan, 50) == 2 * 49
    assert swp_threads() == []


def test_scenario_3_k2_is_rejected_at_construction() -> None:
    plan = make_plan(ExecLog(), {"fwd": (0, None, "d"), "bwd": (1, None, "d"), "opt": (2, None, "d")},
                     intra=[("bwd", "fwd"), ("opt", "bwd")], inter=[("fwd", "opt")])
    with pytest.raises(ValueError, match=r"'fwd' \(stage 0\) depends on 'opt' \(stage 2\).*gap is 2 > 1"):
        SWPipeline(plan, device="cpu")


@pytest.mark.parametrize("stages", [(0, 0, 0), (0, 0, 1), (0, 1, 1)])
def test_fwd_bwd_opt_arrangements_with_inter_dep_run_serially_correct(stages: Tuple[int, int, int]) -> None:
    # The seed's table "with inter_iter_deps": modes A, B, C are legal and run correctly.
    log = ExecLog()
    f, b, o = stages
    plan = make_plan(log, {"fwd": (f, "s1", "g1"), "bwd": (b, "s2", "g2"), "opt": (o, "s3", "g3")},
                     intra=[("bwd", "fwd"), ("opt", "bwd")], inter=[("fwd", "opt")])
    SWPipeline(plan, device="cpu", signal_timeout=2.0).run(range(30))
    assert check_dependencies(log, plan, 30) == 30 * 2 + 29


def test_globally_ordered_tasks_keep_one_order_across_thread_groups() -> None:
    issued: List[Tuple[str, int]] = []
    log = ExecLog()
    spec = {"Load": (0, None, "io"), "AllToAll": (1, "comm", "comm"), "AllReduce": (2, None, "compute"),
            "Forward": (2, None, "compute")}
    plan = make_plan(log, spec, intra=[("AllToAll", "Load"), ("Forward", "AllToAll"), ("AllReduce", "Forward")],
                     work={"AllToAll": lambda ctx: issued.append(("AllToAll", ctx.iter_idx)),
                           "AllReduce": lambda ctx: issued.append(("AllReduce", ctx.iter_idx))})
    schedule = {t: type(s)(stage=s.stage, stream=s.stream, thread_group=s.thread_group,
                           globally_ordered=t.name in ("AllToAll", "AllReduce"))
                for t, s in zip(plan.tasks, plan.schedules.values())}
    plan = type(plan)(schedule, plan.intra_iter_deps, plan.inter_iter_deps)
    pipe = SWPipeline(plan, device="cpu")
    assert pipe.enqueue_order == ["AllToAll", "Forward", "AllReduce", "Load"]
    pipe.run(range(40))
    # Period p issues AllToAll(p-1) then AllReduce(p-2), whatever thread gets there first.
    expected: List[Tuple[str, int]] = []
    for p in range(42):
        if 0 <= p - 1 < 40:
            expected.append(("AllToAll", p - 1))
        if 0 <= p - 2 < 40:
            expected.append(("AllReduce", p - 2))
    assert issued == expected


def test_sequencer_runs_in_sequence_and_times_out_naming_the_task() -> None:
    seq = Turns("the sequencer")
    out: List[int] = []
    threads = [threading.Thread(target=seq.run_in_turn, args=((0, k), lambda k=k: out.append(k), 5.0, "T", k))
               for k in (3, 1, 2, 0)]
    for t in threads:
        t.start()
    for k in range(4):  # numbers may come after the units are waiting for them
        seq.assign((0, k), f"T(i{k})")
    for t in threads:
        t.join(5)
    assert out == [0, 1, 2, 3]
    seq.assign((1, 7), "AllReduce")
    seq.assign((2, 7), "AllToAll")
    with pytest.raises(SequencerTimeoutError, match=r"'AllToAll' \(iteration 7\) waited 0.1 s for its turn #5; the "
                                                    r"sequencer is still at #4 \(the turn belongs to 'AllReduce'\)"):
        seq.run_in_turn((2, 7), lambda: None, timeout=0.1, task="AllToAll", iter_idx=7)
    with pytest.raises(SequencerTimeoutError, match=r"waited 0.1 s for its turn, which was never assigned"):
        seq.run_in_turn((9, 9), lambda: None, timeout=0.1, task="Late", iter_idx=9)
    lane = Turns("stream 'default'")
    lane.assign((0, 0), "A(i0)")
    lane.assign((1, 0), "B(i0)")
    with pytest.raises(SequencerTimeoutError, match=r"task on stream 'default' 'B' \(iteration 0\) waited 0.1 s "
                                                    r"for its turn #1; stream 'default' is still at #0"):
        lane.run_in_turn((1, 0), lambda: None, timeout=0.1, task="B", iter_idx=0)
    seq.abort()
    with pytest.raises(PipelineAborted):
        seq.run_in_turn((2, 7), lambda: None, timeout=5.0, task="AllToAll", iter_idx=7)
    # Turns belong to one run and are never reset: a new run makes new ones.
    fresh = Turns("the sequencer")
    fresh.assign((0, 0), "T(i0)")
    fresh.run_in_turn((0, 0), lambda: out.append(99), 5.0, "T", 0)
    assert out[-1] == 99
