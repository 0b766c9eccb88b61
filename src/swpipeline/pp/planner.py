"""Choosing a schedule and a number of microbatches from measured costs, on paper.

``PipelineSchedule.measure(...)`` runs one step with its timeline recorded and gathers, from
every rank, what each stage's forward and backward of one microbatch took (``StageCosts``).
``simulate`` then times any schedule with any number of microbatches on paper: every rank's
units as the check proves them (``check.paper_times``), each compute action costing::

    fixed_ms + (measured_ms - fixed_ms) * rows / measured_rows       (a microbatch of ``rows`` rows)

a received message ``message_ms`` (its way between the ranks and its taking), a sent one ``send_ms`` on the
sending rank (packing and posting it), plus ``step_ms``
per step for what surrounds the actions (starting and joining the step's threads, HELLO and
DONE). ``autoplan`` simulates every
candidate and returns the fastest. The split backward costs ``input_share`` of a full
backward for ``I`` and the rest for ``W``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from . import orders
from .actions import BWD, BWD_I, BWD_W, FWD, RankOrders
from .check import paper_times
from .comms import Skip, derive
from .placement import LOOP, Placement
from .units import Unit, units_of_rank

__all__: List[str] = []

SCHEDULES = tuple(orders.BUILT_IN)


@dataclass(frozen=True)
class StageCosts:
    """What one microbatch of ``rows`` rows costs each stage, in milliseconds.

    Args:
        forward_ms: per stage, one forward.
        backward_ms: per stage, one full backward.
        rows: the microbatch size they were measured at.
        fixed_ms: the part of every action that does not grow with the rows (the engine's, Python's).
        message_ms: what one message adds to the path it is on: its way between the ranks, and taking it.
        send_ms: what sending one message costs the sending rank's compute thread (packing and posting it).
        step_ms: what a step costs besides its actions (its threads, its start and end).
        input_share: the share of a backward that its input-gradient half (I) takes.
    """

    forward_ms: Tuple[float, ...]
    backward_ms: Tuple[float, ...]
    rows: int
    fixed_ms: float = 0.05
    message_ms: float = 0.1
    step_ms: float = 0.5
    send_ms: float = 0.0
    input_share: float = 0.5

    def action_ms(self, kind: str, stage: int, rows: float) -> float:
        full = self.forward_ms[stage] if kind == FWD.value else self.backward_ms[stage]
        scaled = self.fixed_ms + max(full - self.fixed_ms, 0.0) * rows / self.rows
        if kind == BWD_I.value:
            return scaled * self.input_share
        if kind == BWD_W.value:
            return scaled * (1 - self.input_share)
        return scaled


def schedule_orders(schedule: str, num_ranks: int, local: int, n: int) -> RankOrders:
    """The compute actions of a built-in schedule, by its class name."""
    if schedule not in orders.BUILT_IN:
        raise ValueError(f"unknown schedule {schedule!r}; the built-in ones are {', '.join(SCHEDULES)}")
    return orders.BUILT_IN[schedule](num_ranks, local, n, True)


def simulate(schedule: str, num_ranks: int, n_microbatches: int, batch: int, costs: StageCosts,
             skips: Sequence[Skip] = ()) -> float:
    """Milliseconds per step of ``schedule`` with ``n_microbatches`` microbatches of a batch of ``batch`` rows, on
    paper, with the stages of ``costs`` (``len(costs.forward_ms)`` stages over ``num_ranks`` ranks).

    Raises:
        ValueError: the stages do not divide over the ranks, or a single-stage schedule gets several per rank.
    """
    num_stages = len(costs.forward_ms)
    if num_stages % num_ranks:
        raise ValueError(f"simulate: {num_stages} stages do not divide over {num_ranks} ranks")
    local = num_stages // num_ranks
    reason = orders.unfit(schedule, num_ranks, local, n_microbatches) if schedule in orders.BUILT_IN else None
    if reason is not None:
        raise ValueError(f"simulate: {reason}")
    return simulate_orders(schedule_orders(schedule, num_ranks, local, n_microbatches), num_ranks, n_microbatches,
                           batch, costs, skips, orders.placement_of(schedule))


def simulate_orders(rank_orders: RankOrders, num_ranks: int, n_microbatches: int, batch: int, costs: StageCosts,
                    skips: Sequence[Skip] = (), placement: Placement = LOOP) -> float:
    """``simulate`` for any orders (``schedule.pipeline_order`` without its idle steps, a custom list), whose stages
    are placed as ``placement`` says (``placement.py``)."""
    num_stages = len(costs.forward_ms)
    work = derive(rank_orders, num_ranks, num_stages, n_microbatches, True, skips, placement)
    rows = {m: len(range(batch)[m::n_microbatches]) for m in range(n_microbatches)}  # tensor_split's sizes

    def cost(unit: Unit) -> float:
        if unit.action is not None:
            return costs.action_ms(unit.action.kind.value, unit.action.stage, rows[unit.action.microbatch])
        if unit.message is None:
            return 0.0
        return costs.message_ms if unit.role == "recv" else costs.send_ms

    times = paper_times({rank: units_of_rank(work, rank) for rank in range(num_ranks)}, cost)
    return max(end for _, end in times.values()) + costs.step_ms


def autoplan(num_ranks: int, batch: int, costs: StageCosts, schedules: Optional[Iterable[str]] = None,
             microbatches: Optional[Iterable[int]] = None) -> List[Tuple[float, str, int]]:
    """Every candidate ``(ms per step, schedule, n_microbatches)`` on paper, fastest first.

    ``schedules`` defaults to the built-in ones that fit ``costs``' stages over ``num_ranks`` ranks;
    ``microbatches`` to 1..min(batch, 32).
    """
    local = len(costs.forward_ms) // num_ranks
    counts = list(microbatches) if microbatches is not None else list(range(1, min(batch, 32) + 1))
    pairs = [(name, n) for name in (schedules if schedules is not None else SCHEDULES) for n in counts if n <= batch]
    if schedules is None:  # the built-in schedules that can run these stages and microbatches
        pairs = [(name, n) for name, n in pairs if orders.unfit(name, num_ranks, local, n) is None]
    found = [(simulate(name, num_ranks, n, batch, costs), name, n) for name, n in pairs]
    return sorted(found)


def costs_from_timelines(durations: Sequence[Dict[str, List[float]]], num_stages: int, rows: int,
                         step_ms: float) -> StageCosts:
    """``StageCosts`` from each rank's action durations (ms, by action name such as ``"1F3"``)."""
    forward: Dict[int, List[float]] = {}
    backward: Dict[int, List[float]] = {}
    split: Dict[int, List[float]] = {}
    messages: List[float] = []
    sends: List[float] = []
    for per_rank in durations:
        for name, values in per_rank.items():
            if "RECV" in name:
                messages += values
                continue
            if "SEND" in name:
                sends += values
                continue
            if not name[:1].isdigit():
                continue
            stage = int(name[:len(name) - len(name.lstrip("0123456789"))])
            kind = name.lstrip("0123456789")[:1]
            target = forward if kind == FWD.value else backward if kind == BWD.value else split
            target.setdefault(stage, []).extend(values)
    for stage, values in split.items():  # I and W measured apart: a full backward is their sum, per microbatch
        backward.setdefault(stage, []).append(2 * sum(values) / max(len(values), 1))
    missing = [s for s in range(num_stages) if s not in forward or s not in backward]
    if missing:
        raise ValueError(f"measure: no forward or backward was recorded for stages {missing}")

    def median(values: List[float]) -> float:
        ordered = sorted(values)
        return ordered[len(ordered) // 2]

    # a receive whose message is there already costs the least: what taking one costs
    return StageCosts(tuple(median(forward[s]) for s in range(num_stages)),
                      tuple(median(backward[s]) for s in range(num_stages)), rows,
                      message_ms=min(messages) if messages else 0.1, step_ms=max(step_ms, 0.0),
                      send_ms=median(sends) if sends else 0.0)
