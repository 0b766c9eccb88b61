"""Each built-in schedule's compute actions, per rank: pure functions of the configuration.

Every rank computes every rank's order from ``(ranks, stages per rank, microbatches)``
alone, so each rank knows the whole pipeline's schedule without asking the others.
Stage ``s`` lives on rank ``s % ranks`` (looped placement: with ``v`` stages per rank,
rank ``r`` holds ``r, r + p, ..., r + (v - 1) p``). Every order keeps each stage's
backward actions in microbatch order, so each parameter's gradient is summed in the
order a single process sums it: microbatch 0 first.

GPipe and 1F1B, 3 ranks, 4 microbatches (``{stage}F{microbatch}``)::

    GPipe   rank 0:  0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3
    1F1B    rank 0:  0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3        (warm-up: 3 forwards)
            rank 1:  1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3        (2)
            rank 2:  2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3        (1)

Interleaved 1F1B runs the microbatches in groups of about ``p`` (``microbatch_groups``),
each group through the rank's stages in turn (depth first), with ``(v - 1) g + 2 (p - 1 - r)``
forwards of warm-up (``g`` the first group's size); the zero-bubble order is the same with a
warm-up of ``(v - 1) g + (p - 1 - r)``, each backward split in ``I`` then ``W``, and rank
``r``'s weight gradients held back by ``r`` backwards so that they fill the bubble the drain
would leave. Groups of unequal size (``n`` not a multiple of ``p``) are allowed: the tests
prove every order for up to 6 ranks, 4 stages per rank and 16 microbatches.

Looped BFS (breadth first) runs every microbatch through a stage before the rank's next
stage, then the backwards stage by stage from the last; its backwards keep microbatch order
(torch's runs them last microbatch first, which sums each gradient in the reverse order of
one process)::

    LoopedBFS, 2 ranks, 2 stages each, 2 microbatches
            rank 0:  0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1
            rank 1:  1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1

``BUILT_IN`` maps each built-in schedule's class name to its order: the schedules and the
planner take them from there.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

from .actions import BWD, FWD, BWD_I, BWD_W, Action, Kind, RankOrders
from .placement import LOOP, V, stages_of

__all__: List[str] = []


def gpipe(num_ranks: int, n_microbatches: int, backward: bool = True) -> RankOrders:
    """Every forward, then every backward, in microbatch order (one stage per rank)."""
    orders: RankOrders = {}
    for rank in range(num_ranks):
        actions = [Action(rank, FWD, m) for m in range(n_microbatches)]
        if backward:
            actions += [Action(rank, BWD, m) for m in range(n_microbatches)]
        orders[rank] = actions
    return orders


def one_f_one_b(num_ranks: int, n_microbatches: int, backward: bool = True) -> RankOrders:
    """Rank ``r`` runs ``min(n, p - r)`` forwards, then alternates one backward and one forward, then drains."""
    if not backward:
        return gpipe(num_ranks, n_microbatches, backward=False)
    orders: RankOrders = {}
    for rank in range(num_ranks):
        warmup = min(n_microbatches, num_ranks - rank)
        actions = [Action(rank, FWD, m) for m in range(warmup)]
        forward = warmup
        for m in range(n_microbatches):
            actions.append(Action(rank, BWD, m))
            if forward < n_microbatches:
                actions.append(Action(rank, FWD, forward))
                forward += 1
        orders[rank] = actions
    return orders


def microbatch_groups(num_ranks: int, n_microbatches: int) -> List[range]:
    """The microbatches in ``max(1, n // ranks)`` consecutive groups whose sizes differ by at most one (larger
    first): groups of ``ranks`` when ``n`` is a multiple of it, one group of all when ``n < 2 * ranks``."""
    rounds = max(1, n_microbatches // num_ranks)
    base, extra = divmod(n_microbatches, rounds)
    groups: List[range] = []
    start = 0
    for k in range(rounds):
        size = base + (1 if k < extra else 0)
        groups.append(range(start, start + size))
        start += size
    return groups


def _depth_first(rank: int, num_ranks: int, local_stages: int, groups: List[range], reverse: bool) -> List[Action]:
    """The rank's (stage, microbatch) pairs, each group of microbatches through the rank's stages in turn (the
    last stage first when ``reverse``); kind F, the caller changes it."""
    stages = [rank + k * num_ranks for k in range(local_stages)]
    if reverse:
        stages.reverse()
    return [Action(stage, FWD, m) for group in groups for stage in stages for m in group]


def interleaved(num_ranks: int, local_stages: int, n_microbatches: int, backward: bool = True,
                zero_bubble: bool = False) -> RankOrders:
    """Interleaved 1F1B (``zero_bubble``: with the backward split in I and W) over looped stage placement."""
    orders: RankOrders = {}
    groups = microbatch_groups(num_ranks, n_microbatches)
    for rank in range(num_ranks):
        forwards = _depth_first(rank, num_ranks, local_stages, groups, reverse=False)
        if not backward:
            orders[rank] = forwards
            continue
        backwards = [Action(a.stage, BWD_I if zero_bubble else BWD, a.microbatch)
                     for a in _depth_first(rank, num_ranks, local_stages, groups, reverse=True)]
        hops = num_ranks - 1 - rank
        warmup = min(len(forwards), (local_stages - 1) * len(groups[0]) + (hops if zero_bubble else 2 * hops))
        actions = forwards[:warmup]
        pending_weights: List[Action] = []
        held = rank if zero_bubble else 0  # weight gradients held back to fill the drain's bubble
        later = forwards[warmup:]
        for k, back in enumerate(backwards):
            if k < len(later):
                actions.append(later[k])
            actions.append(back)
            if zero_bubble:
                pending_weights.append(Action(back.stage, BWD_W, back.microbatch))
                if len(pending_weights) > held:
                    actions.append(pending_weights.pop(0))
        actions += pending_weights
        orders[rank] = actions
    return orders


def looped_bfs(num_ranks: int, local_stages: int, n_microbatches: int, backward: bool = True) -> RankOrders:
    """Every microbatch's forward through each of the rank's stages in turn; then, from its last stage to its
    first, every microbatch's backward in microbatch order."""
    orders: RankOrders = {}
    for rank in range(num_ranks):
        stages = stages_of(rank, num_ranks, num_ranks * local_stages)
        actions = [Action(stage, FWD, m) for stage in stages for m in range(n_microbatches)]
        if backward:
            actions += [Action(stage, BWD, m) for stage in reversed(stages) for m in range(n_microbatches)]
        orders[rank] = actions
    return orders


class _VRank:
    """One rank's order under V placement, built action by action: its two stages (``down``, the first it holds, and
    ``up``, the one on the way back), and per stage the next microbatch of each kind; a ``W`` queue behind the I's."""

    def __init__(self, rank: int, num_ranks: int, n_microbatches: int) -> None:
        self.down, self.up = rank, 2 * num_ranks - 1 - rank
        self.n = n_microbatches
        self.actions: List[Action] = []
        self.next: Dict[Tuple[int, str], int] = {}
        self.weights: List[Action] = []

    def add(self, stage: int, kind: Kind) -> None:
        """The stage's next microbatch of ``kind`` (a B counts as that microbatch's I and W)."""
        counter = "B" if kind in (BWD, BWD_I) else kind.value
        m = self.next.get((stage, counter), 0)
        self.next[(stage, counter)] = m + 1
        if kind is BWD_I:
            self.weights.append(Action(stage, BWD_W, m))
        if m < self.n:
            self.actions.append(Action(stage, kind, m))

    def weight(self, stage: Optional[int] = None) -> None:
        """The oldest W not yet run (of ``stage``, if given), if any."""
        for k, action in enumerate(self.weights):
            if stage is None or action.stage == stage:
                del self.weights[k]
                if action.microbatch < self.n:
                    self.actions.append(action)
                return

    def count(self, stage: int, kind: str) -> int:
        """How many microbatches of ``stage`` have had ``kind`` (F, or B for B and I) so far."""
        return self.next.get((stage, kind), 0)


def zbv_zero_bubble(num_ranks: int, local_stages: int, n_microbatches: int, backward: bool = True) -> RankOrders:
    """ZBV: two stages per rank in a V; forwards down the V and back up, each backward split in I then W (the W
    right behind its I, but in the drain, where they fill the bubble: the first stage's, then the second's). With
    fewer than ``2p - 1`` microbatches, the order of ``2p - 1`` without the actions of the missing ones."""
    orders: RankOrders = {}
    n = max(2 * num_ranks - 1, n_microbatches)
    for rank in range(num_ranks):
        r = _VRank(rank, num_ranks, n_microbatches)
        down, up = r.down, r.up
        if not backward:
            for stage in (down, up):
                for _ in range(n):
                    r.add(stage, FWD)
            orders[rank] = r.actions
            continue
        for _ in range(2 * (num_ranks - rank) - 1):
            r.add(down, FWD)
        for _ in range(rank):
            r.add(up, FWD)
            r.add(down, FWD)
        for _ in range(num_ranks - rank):
            r.add(up, FWD)
            r.add(up, BWD_I)
            r.weight(up)
        while r.count(up, "F") < r.count(down, "F") or r.count(down, "F") < n:
            if r.count(down, "F") < n:
                r.add(down, FWD)
            r.add(down, BWD_I)
            r.weight(down)
            r.add(up, FWD)
            r.add(up, BWD_I)
            r.weight(up)
        for _ in range(rank):
            r.add(down, BWD_I)
            r.add(up, BWD_I)
        for _ in range(num_ranks - rank):
            r.add(down, BWD_I)
            r.weight(down)
        for stage in (up, down):
            while any(w.stage == stage for w in r.weights):
                r.weight(stage)
        orders[rank] = r.actions
    return orders


def dual_pipe_v(num_ranks: int, local_stages: int, n_microbatches: int, backward: bool = True) -> RankOrders:
    """DualPipeV: two stages per rank in a V, the microbatches fed from the first stage only; in the steady state
    a forward of one stage beside a backward of the other, the second half of the drain in I and W. Needs at least
    ``2p`` microbatches."""
    reason = unfit("ScheduleDualPipeV", num_ranks, local_stages, n_microbatches)
    if reason is not None:
        raise ValueError(reason)
    if not backward:
        return zbv_zero_bubble(num_ranks, local_stages, n_microbatches, backward=False)
    orders: RankOrders = {}
    for rank in range(num_ranks):
        r = _VRank(rank, num_ranks, n_microbatches)
        down, up = r.down, r.up
        for _ in range(2 * (num_ranks - rank - 1)):
            r.add(down, FWD)
        for _ in range(rank + 1):
            r.add(down, FWD)
            r.add(up, FWD)
        for _ in range(num_ranks - rank - 1):
            r.add(up, BWD_I)
            r.weight()
            r.add(up, FWD)
        for k in range(n_microbatches - 2 * num_ranks + rank + 1):  # a forward of one beside a backward of the other
            r.add(down, FWD)
            r.add(up, BWD)
            r.add(up, FWD)
            r.add(down, BWD)
        for _ in range(num_ranks - rank - 1):
            r.add(up, BWD)
            r.add(up, FWD)
            r.add(down, BWD)
        split = False
        half = (rank + 1) // 2
        for k in range(rank + 1):
            if k == half and rank % 2 == 1:
                split = True
            r.add(up, BWD_I if split else BWD)
            if k == half and rank % 2 == 0:
                split = True
            r.add(down, BWD_I if split else BWD)
        for _ in range(num_ranks - rank - 1):
            r.weight()
            r.add(down, BWD_I if split else BWD)
        while r.weights:
            r.weight()
        orders[rank] = r.actions
    return orders


OrdersFn = Callable[[int, int, int, bool], RankOrders]  # (ranks, stages per rank, microbatches, backward) -> orders
BUILT_IN: Dict[str, OrdersFn] = {
    "ScheduleGPipe": lambda ranks, local, n, backward: gpipe(ranks, n, backward),
    "Schedule1F1B": lambda ranks, local, n, backward: one_f_one_b(ranks, n, backward),
    "ScheduleInterleaved1F1B": interleaved,
    "ScheduleInterleavedZeroBubble": lambda ranks, local, n, backward: interleaved(ranks, local, n, backward,
                                                                                   zero_bubble=True),
    "ScheduleLoopedBFS": looped_bfs,
    "ScheduleZBVZeroBubble": zbv_zero_bubble,
    "ScheduleDualPipeV": dual_pipe_v,
}
ONE_STAGE_PER_RANK = ("ScheduleGPipe", "Schedule1F1B")
PLACEMENT = {"ScheduleZBVZeroBubble": V, "ScheduleDualPipeV": V}  # the others: LOOP


def placement_of(schedule: str) -> str:
    """The placement a built-in schedule's stages follow (``placement.py``)."""
    return PLACEMENT.get(schedule, LOOP)


def unfit(schedule: str, num_ranks: int, local_stages: int, n_microbatches: int) -> Optional[str]:
    """Why a built-in schedule cannot run ``local_stages`` stages per rank and ``n_microbatches`` (None: it can)."""
    if schedule in ONE_STAGE_PER_RANK and local_stages != 1:
        return f"{schedule} runs one stage per rank, not {local_stages}"
    if schedule in PLACEMENT and local_stages != 2:
        return f"{schedule} runs two stages per rank (placed in a V), not {local_stages}"
    if schedule == "ScheduleDualPipeV" and n_microbatches < 2 * num_ranks:
        return f"{schedule} needs at least {2 * num_ranks} microbatches on {num_ranks} ranks, not {n_microbatches}"
    return None


def count_by_stage(orders: RankOrders) -> Dict[int, int]:
    """How many actions each stage has (a helper for the tests and the checks)."""
    counts: Dict[int, int] = {}
    for actions in orders.values():
        for action in actions:
            counts[action.stage] = counts.get(action.stage, 0) + 1
    return counts
