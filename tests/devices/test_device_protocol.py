"""The GPU half of the two-phase protocol, proven on the simulated device.

``SimulatedDevice`` logs, per stream, every launch, event record and event wait in
submission order. From that log ``happens_before`` decides what a GPU would be
forced to order (stream FIFO plus event waits). For every declared dependency in
every iteration the producer's launch must happen-before the consumer's launch,
and each cross-stream wait must name the record made right after the producer's
launch of the right iteration (not a later reuse of the event slot).
"""

from __future__ import annotations

from typing import Any, Dict, List, Set, Tuple

import pytest

from engine_helpers import ExecLog, make_plan, sparse_dist_plan
from swpipeline import DataFlowPipeline, PipelinePlan, SimulatedDevice, SWPipeline


# Plans here put several thread groups on one stream on purpose (the turns are what is tested).
pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")


def expected_producer(plan: PipelinePlan, task: str, it: int) -> List[Tuple[str, int]]:
    deps = [(d, it) for d in plan.intra[task]]
    deps += [(d, it - back) for d, back in plan.inter[task] if it >= back]
    return deps


def prove(pipe: SWPipeline, sim: SimulatedDevice, num_iters: int) -> int:
    launches = sim.launches()
    assert len(launches) == num_iters * len(pipe.plan.task_names)
    proofs = 0
    for (task, it), where in launches.items():
        for producer in expected_producer(pipe.plan, task, it):
            assert sim.happens_before(launches[producer], where), f"{producer} not ordered before {(task, it)}"
            proofs += 1
    return proofs


def fetch_positions(sim: SimulatedDevice) -> Dict[int, Tuple[str, int]]:
    """Iteration -> (stream, position) where its batch was drawn."""
    return {op[1]: (name, pos) for name, ops in sim.log.items() for pos, op in enumerate(ops) if op[0] == "fetch"}


def waits_before_launch(sim: SimulatedDevice, stream: str, pos: int) -> Set[Tuple[str, int]]:
    """The event positions waited on between the previous launch on ``stream`` and the one at ``pos``."""
    found = set()
    for p in range(pos - 1, -1, -1):
        op = sim.log[stream][p]
        if op[0] == "launch":
            break
        if op[0] == "wait":
            found.add(op[1])
    return found


@pytest.mark.parametrize("num_iters", [1, 3, 9])
def test_every_dependency_is_ordered_on_the_device(num_iters: int) -> None:
    sim = SimulatedDevice()
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device=sim)
    pipe.run(range(num_iters))
    expected = num_iters * 8 + (num_iters - 1) * 1
    assert prove(pipe, sim, num_iters) == expected


INTER_AT_ONE = [("A", "B"), ("B", "C"), ("C", "A"), ("D", "C")]
# the same at distances 2, 3, 3 and 2: C(i) (stage 2) reads A(i-3) (stage 0) five periods after A ran, so
# with fewer event slots than the live iterations plus the distance, A(i+1) would reuse the slot before
# C(i) waits on it: the wait would name another iteration's record
INTER_FURTHER = [("A", "B", 2), ("B", "C", 3), ("C", "A", 3), ("D", "C", 2)]


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
@pytest.mark.parametrize("inter", [INTER_AT_ONE, INTER_FURTHER], ids=["distance-1", "distances-1-to-3"])
def test_cross_stream_waits_name_the_producers_own_record(inter: List[Any], engine: str) -> None:
    sim = SimulatedDevice()
    log = ExecLog()
    # Inter dependencies across streams with stage gaps 1, 0 and -1, plus intra ones.
    spec = {"A": (0, "s0", "g0"), "B": (1, "s1", "g1"), "C": (2, None, "g2"), "D": (1, "s0", "g0")}
    plan = make_plan(log, spec, intra=[("B", "A"), ("C", "B"), ("D", "A")], inter=inter)
    pipe = SWPipeline(plan, device=sim) if engine == "SWPipeline" else DataFlowPipeline(plan, max_depth=4, device=sim)
    pipe.run(range(12))
    launches = sim.launches()
    fetches = fetch_positions(sim)
    # D is a sink on a side stream: retiring an iteration makes the default stream wait for it.
    retire_waits = {launches[("D", j)] for j in range(12)}
    for (task, it), (stream, pos) in launches.items():
        if task == "A":  # the iteration's first task, on a side stream: it waits for its batch to be drawn
            assert sim.happens_before(fetches[it], (stream, pos))
            batch_waits = {w for w in waits_before_launch(sim, stream, pos) if w[0] == "default"}
            assert len(batch_waits) == 1 and min(batch_waits)[1] >= fetches[it][1], it
        expected = set()
        for producer in expected_producer(plan, task, it):
            p_stream, p_pos = launches[producer]
            if p_stream != stream:
                # the record op follows the producer's launch directly on its stream
                assert sim.log[p_stream][p_pos + 1][0] == "record"
                expected.add((p_stream, p_pos))
        waits = waits_before_launch(sim, stream, pos)
        if task == "A":
            waits = {w for w in waits if w[0] != "default"}
        assert expected <= waits and waits - expected <= retire_waits, (task, it)
        if stream != "default":
            assert waits == expected, (task, it)
    assert prove(pipe, sim, 12) == 12 * 3 + sum(12 - (entry[2] if len(entry) == 3 else 1) for entry in inter)


def test_same_stream_dependencies_need_no_event() -> None:
    sim = SimulatedDevice()
    spec: Dict[str, Tuple[int, Any, str]] = {"A": (0, "s", "g0"), "B": (1, "s", "g1")}
    pipe = SWPipeline(make_plan(ExecLog(), spec, intra=[("B", "A")]), device=sim)
    pipe.run(range(5))
    ops = [op[0] for op in sim.log["s"]]
    # Stream FIFO orders A before B: no wait between them. A, the first task of its iteration, waits
    # for its batch (drawn on the default stream); B records only for the caller's stream at retirement.
    assert (ops.count("launch"), ops.count("record"), ops.count("wait")) == (10, 5, 5)
    fetches = fetch_positions(sim)
    launches = sim.launches()
    assert all(sim.happens_before(fetches[i], launches[("A", i)]) for i in range(5))
    b_records = [p for p, op in enumerate(sim.log["s"]) if op[0] == "record"]
    for k, p in enumerate(b_records):  # the k-th record comes after B's k-th launch
        assert sum(1 for op in sim.log["s"][:p] if op[:2] == ("launch", "B")) >= k + 1
    assert prove(pipe, sim, 5) == 5


def test_a_missing_dependency_is_visible_in_the_proof() -> None:
    # Negative control: without the declared dependency nothing orders the two streams.
    sim = SimulatedDevice()
    spec: Dict[str, Tuple[int, Any, str]] = {"A": (0, "s0", "g0"), "B": (1, "s1", "g1")}
    pipe = SWPipeline(make_plan(ExecLog(), spec), device=sim)
    pipe.run(range(3))
    launches = sim.launches()
    assert not sim.happens_before(launches[("A", 0)], launches[("B", 0)])


def test_caller_stream_waits_for_side_stream_sinks_at_retire() -> None:
    sim = SimulatedDevice()
    spec: Dict[str, Tuple[int, Any, str]] = {"Load": (0, "copy", "io"), "Train": (1, None, "default"),
                                             "Log": (1, "side", "default")}
    pipe = SWPipeline(make_plan(ExecLog(), spec, intra=[("Train", "Load"), ("Log", "Load")]), device=sim)
    pipe.run(range(4))
    launches = sim.launches()
    # "Log" is a sink on a side stream: each retirement makes the default stream wait for it.
    retire_waits = [op[1] for op in sim.log["default"] if op[0] == "wait" and op[1][0] == "side"]
    assert retire_waits == [launches[("Log", i)] for i in range(4)]
