"""swpipeline.pp's schedules as data, checked on paper: no process group, no threads.

Actions and their string form, each built-in schedule's orders, the messages derived
from them, and the cross-rank proof: every built-in order proved over a range of ranks,
stages and microbatches, and a crossed custom order refused with the ranks, microbatches
and actions of its cycle. The proof is the engine's interpreter's (``check.py``); the
rule pp ran on its own before (``reference_times`` below: a receive waits for its send,
then a topological sort of "waits for") is kept here as an independent reference, and
the two agree on every built-in schedule and on a set of reordered ones.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import pytest

from swpipeline.pp import Action, Kind, ScheduleHangError
from swpipeline.engine.paper import ScheduleError, check_together
from swpipeline.pp import check, comms, orders, units
from swpipeline.pp.actions import RankOrders, format_orders, parse_orders


def _units(o: RankOrders, ranks: int, stages: int, n: int, backward: bool = True,
           placement: str = "loop") -> Dict[int, units.RankUnits]:
    work = comms.derive(o, ranks, stages, n, backward, placement=placement)
    return {r: units.units_of_rank(work, r) for r in range(ranks)}


def _text(o: RankOrders) -> Dict[int, str]:
    return {rank: " ".join(map(str, actions)) for rank, actions in o.items()}


# -- actions ----------------------------------------------------------------------------------------

def test_action_string_form_parses_back() -> None:
    assert str(Action(1, Kind.FORWARD, 3)) == "1F3"
    assert Action.parse("12SEND_F7") == Action(12, Kind.SEND_F, 7)
    for kind in Kind:
        action = Action(4, kind, 11)
        assert Action.parse(str(action)) == action
    assert repr(Action.parse(" 0W2 ")) == "Action('0W2')"


@pytest.mark.parametrize("text", ["F3", "1X3", "1F", "1 F3", "-1F3"])
def test_unreadable_actions_are_refused_with_the_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"write <stage><kind><microbatch>, e\.g\. '1F3'"):
        Action.parse(text)


def test_parse_orders_reads_strings_lists_and_skips_idle_steps() -> None:
    parsed = parse_orders({0: "0F0 0B0", 1: ["1F0", None, Action(1, Kind.BACKWARD, 0)]})
    assert _text(parsed) == {0: "0F0 0B0", 1: "1F0 1B0"}
    with pytest.raises(ValueError, match=r"actions\[1\]\[0\]: cannot read the action '1Z0'"):
        parse_orders({1: ["1Z0"]})
    with pytest.raises(TypeError, match="keys are ranks"):
        parse_orders({"0": ["0F0"]})


# -- the built-in orders ----------------------------------------------------------------------------

def test_gpipe_and_1f1b_orders() -> None:
    assert _text(orders.gpipe(2, 3)) == {0: "0F0 0F1 0F2 0B0 0B1 0B2", 1: "1F0 1F1 1F2 1B0 1B1 1B2"}
    assert _text(orders.one_f_one_b(3, 4)) == {0: "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3",
                                               1: "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3",
                                               2: "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3"}
    # fewer microbatches than stages: the warm-up is every microbatch
    assert _text(orders.one_f_one_b(4, 2)) == {0: "0F0 0F1 0B0 0B1", 1: "1F0 1F1 1B0 1B1",
                                               2: "2F0 2F1 2B0 2B1", 3: "3F0 3B0 3F1 3B1"}
    assert _text(orders.one_f_one_b(2, 2, backward=False)) == {0: "0F0 0F1", 1: "1F0 1F1"}


def test_interleaved_orders_run_groups_of_microbatches_through_each_stage() -> None:
    assert _text(orders.interleaved(2, 2, 4)) == {0: "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 "
                                                     "0B2 0B3",
                                                  1: "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 "
                                                     "1B2 1B3"}
    zero_bubble = orders.interleaved(2, 2, 4, zero_bubble=True)
    # rank 1 holds its weight gradients back by one backward; rank 0 runs each right after its I
    assert _text(zero_bubble)[1] == "1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 " \
                                    "3W3 1I3 1W2 1W3"
    assert _text(zero_bubble)[0].startswith("0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 ")
    assert orders.microbatch_groups(4, 10) == [range(0, 5), range(5, 10)]
    assert orders.microbatch_groups(4, 3) == [range(0, 3)]
    assert orders.microbatch_groups(2, 7) == [range(0, 3), range(3, 5), range(5, 7)]


def test_looped_bfs_runs_every_microbatch_through_a_stage_before_the_next() -> None:
    assert _text(orders.looped_bfs(2, 2, 2)) == {0: "0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1",
                                                 1: "1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1"}
    assert _text(orders.looped_bfs(2, 1, 3)) == _text(orders.gpipe(2, 3))  # one stage per rank: GPipe
    assert _text(orders.looped_bfs(2, 2, 2, backward=False)) == {0: "0F0 0F1 2F0 2F1", 1: "1F0 1F1 3F0 3F1"}
    assert set(orders.BUILT_IN) == {"ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
                                    "ScheduleInterleavedZeroBubble", "ScheduleLoopedBFS", "ScheduleZBVZeroBubble",
                                    "ScheduleDualPipeV"}


def test_side_by_side_on_paper() -> None:
    aligned = check.aligned_orders(_units(orders.one_f_one_b(3, 4), 3, 3, 4), units.COMPUTE)
    assert format_orders(aligned) == "\n".join([
        "         rank 0  rank 1  rank 2",
        "step  0: 0F0",
        "step  1: 0F1     1F0",
        "step  2: 0F2     1F1     2F0",
        "step  3:                 2B0",
        "step  4:         1B0     2F1",
        "step  5: 0B0     1F2     2B1",
        "step  6: 0F3     1B1     2F2",
        "step  7: 0B1     1F3     2B2",
        "step  8:         1B2     2F3",
        "step  9: 0B2             2B3",
        "step 10:         1B3",
        "step 11: 0B3"])


# -- messages -------------------------------------------------------------------------------------

def test_messages_follow_the_producer_s_order_on_both_ends() -> None:
    work = comms.derive(orders.interleaved(2, 2, 2), 2, 4, 2, True)
    sent = [m.send_name for m in work.ranks[0].sends[1]]
    assert sent == ["0SEND_F0", "0SEND_F1", "2SEND_F0", "2SEND_F1", "2SEND_B0", "2SEND_B1"]
    assert [m.send_name for m in work.ranks[1].recvs[0]] == sent
    assert [m.recv_name for m in work.ranks[1].recvs[0]] == ["1RECV_F0", "1RECV_F1", "3RECV_F0", "3RECV_F1",
                                                            "1RECV_B0", "1RECV_B1"]
    one = comms.derive(orders.interleaved(1, 2, 1), 1, 2, 1, True)  # both stages on one rank: in memory
    assert not one.ranks[0].sends and [str(m.producer) for m in one.ranks[0].local] == ["0F0", "1B0"]


@pytest.mark.parametrize("given, error", [
    ({0: "0F0 0B0", 1: "1F0"}, r"rank 1 never runs 1B0 \(stage 1, microbatch 0\).*add 1B0 to rank 1's list"),
    ({0: "0F0 0F0 0B0", 1: "1F0 1B0"}, r"rank 0 runs 0F0 twice \(steps 0 and 1\)"),
    ({0: "0F0 0B0 1F0", 1: "1B0"}, r"rank 0, step 2: 1F0 belongs to stage 1, which lives on rank 1"),
    ({0: "0B0 0F0", 1: "1F0 1B0"}, r"rank 0 runs 0B0 \(step 0\) before 0F0; a backward needs its forward"),
    ({0: "0F0 0W0 0I0", 1: "1F0 1B0"}, r"runs 0W0 \(step 1\) before 0I0"),
    ({0: "0F0 0B0 0F2", 1: "1F0 1B0"}, r"names microbatch 2; the microbatches are 0\.\.0"),
    ({0: "0F0 0SEND_F0 0B0", 1: "1F0 1B0"}, r"0SEND_F0 is a communication action; list only compute actions"),
])
def test_incomplete_actions_are_refused_naming_rank_stage_and_microbatch(given: Dict[int, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        comms.derive(parse_orders(given), 2, 2, 1, True)


# -- the proof ------------------------------------------------------------------------------------

def test_a_crossed_order_is_refused_naming_ranks_microbatches_and_actions() -> None:
    crossed = parse_orders({0: "0F0 0B0 0F1 0B1", 1: "1F0 1F1 1B0 1B1"})
    with pytest.raises(ScheduleHangError) as caught:
        check.prove(_units(crossed, 2, 2, 2))
    text = str(caught.value)
    assert text.startswith("the schedule would hang: ranks 0, 1 wait on each other in a cycle (microbatches 0, 1):")
    assert "0B0 on rank 0 waits for rank 0 0RECV_B0 (the input gradient of stage 1, microbatch 0, for stage 0 " \
           "(rank 1 -> rank 0)): it needs it" in text
    assert "1B0 on rank 1 waits for rank 1 1F1: it runs after it on rank 1's compute thread" in text
    assert "0F1 on rank 0 waits for rank 0 0B0: it runs after it on rank 0's compute thread" in text
    assert "move 1B0 before 1F1 on rank 1" in text
    assert caught.value.ranks == [0, 1]
    assert {name for _, name in caught.value.units} >= {"0B0", "1B0", "1F1", "0F1"}


def test_an_unmatched_send_is_refused() -> None:
    mine = _units(orders.gpipe(2, 1), 2, 2, 1)
    mine[1][units.COMPUTE] = [u for u in mine[1][units.COMPUTE] if u.name != "1RECV_F0"]
    with pytest.raises(ScheduleHangError, match=r"rank 0 sends 0SEND_F0 to rank 1 \(message 1 from rank 0 to rank "
                                                r"1\) but rank 1 never receives it"):
        check.prove(mine)


def test_a_value_handed_over_in_memory_before_it_is_made_is_refused() -> None:
    # stages 0 and 1 on one rank: 1F0 takes 0F0's output, so it cannot come first
    with pytest.raises(ScheduleHangError, match=r"rank 0 runs 1F0 \(step 0\) before 0F0 \(step 1\), which makes the "
                                                r"activations it takes \(stages 0 and 1 both live on rank 0.*move 1F0 "
                                                r"after 0F0") as caught:
        comms.derive(parse_orders({0: "1F0 0F0 1B0 0B0"}), 1, 2, 1, True)
    assert caught.value.units == [(0, "1F0"), (0, "0F0")]


# -- the proof is the engine's interpreter's, and agrees with the rule pp had of its own ---------------------------

Node = Tuple[int, str]
Times = Dict[Node, Tuple[float, float]]


def reference_times(schedules: Dict[int, units.RankUnits], cost: Callable[[units.Unit], float]) -> Optional[Times]:
    """The rule pp ran before the interpreter did (None: it would hang): a unit waits for its dependencies, the unit
    before it in its thread group and, a receive, for its send; it starts once all of those ended."""
    found: Dict[Node, units.Unit] = {}
    waits: Dict[Node, Set[Node]] = {}
    ends: Dict[Tuple[int, int, int], Dict[str, Node]] = {}
    for rank, groups in schedules.items():
        for group_units in groups.values():
            for k, unit in enumerate(group_units):
                me = (rank, unit.name)
                found[me] = unit
                waits[me] = {(rank, dep) for dep in unit.deps} | ({(rank, group_units[k - 1].name)} if k else set())
                if unit.channel is not None:
                    ends.setdefault(unit.channel, {})[unit.role] = me
    for pair in ends.values():
        waits[pair["recv"]].add(pair["send"])
    times: Times = {}
    while len(times) < len(found):
        ready = [n for n in found if n not in times and all(w in times for w in waits[n])]
        if not ready:
            return None
        for node in ready:
            start = max((times[w][1] for w in waits[node]), default=0.0)
            times[node] = (start, start + cost(found[node]))
    return times


def _cost(unit: units.Unit) -> float:
    """Compute actions of different lengths, receives that take time, sends that take none."""
    if unit.action is not None:
        return {"F": 1.0, "B": 2.0, "I": 1.25, "W": 0.75}[unit.action.kind.value] + 0.125 * unit.action.stage
    return 0.5 if unit.role == "recv" and unit.message is not None else 0.0


def _built_ins() -> Iterator[Tuple[str, int, int, int, RankOrders, str]]:
    """Every schedule the package builds for 1-4 ranks, 1-3 stages per rank, 1-12 microbatches, with its
    placement."""
    for ranks, n in itertools.product((1, 2, 3, 4), range(1, 13)):
        yield "gpipe", ranks, 1, n, orders.gpipe(ranks, n), "loop"
        yield "1f1b", ranks, 1, n, orders.one_f_one_b(ranks, n), "loop"
        for local in (1, 2, 3):
            yield "interleaved", ranks, local, n, orders.interleaved(ranks, local, n), "loop"
            yield "zero bubble", ranks, local, n, orders.interleaved(ranks, local, n, zero_bubble=True), "loop"
            yield "looped bfs", ranks, local, n, orders.looped_bfs(ranks, local, n), "loop"
        yield "zbv", ranks, 2, n, orders.zbv_zero_bubble(ranks, 2, n), "v"
        if n >= 2 * ranks:
            yield "dualpipev", ranks, 2, n, orders.dual_pipe_v(ranks, 2, n), "v"


def test_every_built_in_order_is_proved_as_the_old_rule_did_and_keeps_each_stage_s_backwards_in_order() -> None:
    count = 0
    for name, ranks, local, n, o, placement in _built_ins():
        schedules = _units(o, ranks, ranks * local, n, placement=placement)
        # proved by the interpreter (it raises if the order could hang), with the paper times the old rule gave
        assert check.paper_times(schedules, _cost) == reference_times(schedules, _cost), (name, ranks, local, n)
        count += 1
        for actions in o.values():
            for kinds in ("B", "I", "BW"):  # gradients summed in microbatch order: the bits of one process
                per_stage: Dict[int, List[int]] = {}
                for a in actions:
                    if a.kind.value in kinds:
                        per_stage.setdefault(a.stage, []).append(a.microbatch)
                assert all(ms == sorted(ms) for ms in per_stage.values()), (name, ranks, local, n)
    assert count == 4 * 12 * 11 + 4 * 12 + sum(13 - 2 * p for p in (1, 2, 3, 4))


def test_the_v_shaped_orders_are_torch_s() -> None:
    import torch.distributed.pipelining.schedules as torch_schedules

    def theirs(cls: Any, ranks: int, n: int) -> Dict[int, str]:
        schedule = object.__new__(cls)  # only what its order reads
        schedule.pp_group_size, schedule.num_stages, schedule._num_stages = ranks, 2 * ranks, 2 * ranks
        schedule._n_microbatches = n
        found = {}
        for rank in range(ranks):
            flat = []
            for action in schedule._calculate_single_rank_operations(rank):
                for one in getattr(action, "sub_actions", None) or ([action] if action is not None else []):
                    flat.append(str(one).replace("FULL_BACKWARD", "B"))
            found[rank] = " ".join(flat)
        return found

    compared = 0
    for ranks in (1, 2, 3, 4):
        for n in range(1, 13):
            assert _text(orders.zbv_zero_bubble(ranks, 2, n)) == theirs(torch_schedules.ScheduleZBVZeroBubble, ranks, n)
            compared += 1
            if n >= 2 * ranks:
                assert _text(orders.dual_pipe_v(ranks, 2, n)) == theirs(torch_schedules.ScheduleDualPipeV, ranks, n)
                compared += 1
    assert compared == 48 + 32
    assert _text(orders.zbv_zero_bubble(2, 2, 4))[1] == (
        "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3")
    with pytest.raises(ValueError, match="ScheduleDualPipeV needs at least 4 microbatches on 2 ranks, not 3"):
        orders.dual_pipe_v(2, 2, 3)


def _reordered() -> Iterator[Tuple[Dict[int, units.RankUnits], str]]:
    """Built-in orders with one action of one rank moved one to three places earlier, where each stage's work stays
    complete and in order: some hang, some do not."""
    for (make, local), ranks, n in itertools.product(
            [(lambda p, v, n: orders.one_f_one_b(p, n), 1), (lambda p, v, n: orders.gpipe(p, n), 1),
             (orders.interleaved, 2), (lambda p, v, n: orders.interleaved(p, v, n, zero_bubble=True), 2)],
            (2, 3), (2, 3)):
        base = make(ranks, local, n)
        for rank, k, back in ((r, k, b) for r in base for k in range(len(base[r])) for b in (1, 2, 3) if k >= b):
            swapped = {r: list(actions) for r, actions in base.items()}
            swapped[rank].insert(k - back, swapped[rank].pop(k))
            try:
                work = comms.derive(swapped, ranks, ranks * local, n, True)
            except ValueError:  # a stage's work out of order on its own rank: refused before any proof
                continue
            yield {r: units.units_of_rank(work, r) for r in range(ranks)}, f"{ranks} ranks, {n} mb, {swapped}"


def test_the_interpreter_and_the_old_rule_agree_on_reordered_custom_orders() -> None:
    verdicts = {True: 0, False: 0}
    for schedules, what in _reordered():
        expected = reference_times(schedules, _cost)
        try:
            found: Optional[Times] = check.paper_times(schedules, _cost)
        except ScheduleHangError as hang:
            found = None
            assert set(hang.ranks) <= set(schedules) and len(hang.ranks) >= 2, what
        assert found == expected, what
        verdicts[found is None] += 1
    assert verdicts[True] >= 20 and verdicts[False] >= 20, verdicts  # both verdicts, many times each


def test_a_send_is_posted_and_never_waits_so_1f1b_s_crossing_sends_pass() -> None:
    # The proof pairs each receive with its send as a one-way wait: the transport posts a send and goes on. Were a
    # send to wait for its receive (a blocking send), 1F1B would hang: rank 0 sends 0F1 while rank 1 sends 1B0.
    schedules = _units(orders.one_f_one_b(2, 2), 2, 2, 2)
    check.prove(schedules)
    plans = check.rank_plans(schedules)
    met = [((r[0], r[1], 0), (s[0], s[1], 0)) for r, s in plans.messages]
    check_together(plans.engines, 1, cross=met)
    data = [m for m in met if not m[0][1].startswith(("HELLO", "DONE"))]  # the HELLOs and DONEs cross too
    markers = [m for m in met if m not in data]
    with pytest.raises(ScheduleError, match="0SEND_F1 of iteration 0, which runs together with 1RECV_F1"):
        check_together(plans.engines, 1, together=data, cross=markers)
    with pytest.raises(ScheduleError, match="HELLO0>1 of iteration 0, which runs together with HELLO0>1"):
        check_together(plans.engines, 1, together=met)


def test_the_verdict_is_the_engine_s_paper_run_of_every_rank_s_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    handed: List[Tuple[Any, ...]] = []
    real = check.check_together

    def spy(engines: Any, num_batches: int, **kwargs: Any) -> None:
        handed.append((engines, num_batches, kwargs))
        real(engines, num_batches, **kwargs)

    monkeypatch.setattr(check, "check_together", spy)
    schedules = _units(orders.one_f_one_b(3, 2), 3, 3, 2)
    check.prove(schedules)
    [(engines, num_batches, kwargs)] = handed
    assert num_batches == 1  # a step is one iteration of each rank's plan
    assert [(e.name, e.caller_group, type(e.rule).__name__) for e in engines] == [
        ("rank 0", "compute", "ClockRule"), ("rank 1", "compute", "ClockRule"), ("rank 2", "compute", "ClockRule")]
    for rank, engine in enumerate(engines):  # each rank's lanes: its thread groups' units in their order
        assert {g: [s.task for s in slots] for g, slots in engine.schedule.lanes.items()} == {
            g: [u.name for u in us] for g, us in schedules[rank].items()}
    # every message a one-way wait of its receive for its send, iteration 0: 2 microbatches, 2 ways, 2 channels, and
    # a HELLO and a DONE each way on each
    assert ((1, "1RECV_F0", 0), (0, "0SEND_F0", 0)) in kwargs["cross"] and "together" not in kwargs
    assert len(kwargs["cross"]) == 2 * 2 * 2 + 2 * 2 * 2


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_peer_s_hello_is_taken_on_the_compute_thread_just_before_the_first_receive_from_it(ranks: int) -> None:
    """A peer's data is used only once its HELLO said it runs the same schedule as this rank; one thread, the
    caller's, runs the whole step (no thread is started per step), the DONEs last."""
    for rank, groups in _units(orders.one_f_one_b(ranks, 4), ranks, ranks, 4).items():
        assert list(groups) == [units.COMPUTE]
        names = [u.name for u in groups[units.COMPUTE]]
        peers = [p for p in (rank - 1, rank + 1) if 0 <= p < ranks]
        for peer in peers:
            first = next(u.name for u in groups[units.COMPUTE] if u.role == "recv" and u.peer == peer
                         and not u.marker)
            assert names[names.index(first) - 1] == units.hello_name(peer, rank)
        tail = [units.done_name(rank, p) for p in peers] + [units.done_name(p, rank) for p in peers]
        assert names[-len(tail):] == tail
