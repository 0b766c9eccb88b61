"""Which rank holds which stage: in a loop, in a V, or as a custom schedule's actions place them.

::

    4 stages on 2 ranks      stage:  0  1  2  3
    loop (most schedules)     rank:  0  1  0  1      stage s on rank s % p
    V (ZBV, DualPipeV)        rank:  0  1  1  0      stage s on rank s, then 2p - 1 - s

With ``v`` stages per rank the V zigzags: block ``b`` of ``p`` stages runs down the ranks
when ``b`` is even and back up when it is odd, so a rank's two stages of a V are the first
and the last of the ones it holds on its way (rank ``p - 1`` holds two neighbours, which
hand their values over in memory). Every rank computes the placement from the schedule
alone, like the schedule's orders. A schedule written as data (``ScheduleFromActions``, or a
subclass that sets ``pipeline_order`` as torch's custom schedules do) places each stage on the
rank whose list holds its actions (``of_orders``): any placement, five stages on two ranks as
``0 0 1 1 0`` too; one that is a loop or a V is named so.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Set, Tuple, Union

from .actions import Action

__all__: List[str] = []

LOOP, V = "loop", "v"
Placement = Union[str, Tuple[int, ...]]  # LOOP, V, or each stage's rank


def rank_of(stage: int, num_ranks: int, style: Placement = LOOP) -> int:
    """The rank that holds ``stage``."""
    if isinstance(style, tuple):
        return style[stage]
    block, place = divmod(stage, num_ranks)
    if style == V and block % 2:
        return num_ranks - 1 - place
    return place


def stages_of(rank: int, num_ranks: int, num_stages: int, style: Placement = LOOP) -> List[int]:
    """The stages ``rank`` holds, in pipeline order."""
    return [s for s in range(num_stages) if rank_of(s, num_ranks, style) == rank]


def of_orders(orders: Mapping[int, Iterable[Action]], num_ranks: int, num_stages: int) -> Placement:
    """Where the actions place the stages: each stage on the one rank whose list holds its actions. A stage listed
    on no rank, or on several, is placed as in a loop (the actions' check then says what is wrong with them)."""
    homes: Dict[int, Set[int]] = {}
    for rank, actions in orders.items():
        if 0 <= rank < num_ranks:
            for action in actions:
                homes.setdefault(action.stage, set()).add(rank)
    ranks = tuple(min(homes[s]) if len(homes.get(s, ())) == 1 else rank_of(s, num_ranks) for s in range(num_stages))
    for style in (LOOP, V):
        if ranks == tuple(rank_of(s, num_ranks, style) for s in range(num_stages)):
            return style
    return ranks


def rule(num_ranks: int, style: Placement = LOOP) -> str:
    """The placement in words, for error messages."""
    if isinstance(style, tuple):
        held = "; ".join(f"rank {r}: {stages_of(r, num_ranks, len(style), style)}" for r in range(num_ranks))
        return f"as the schedule's actions place them ({held})"
    if style == V:
        return f"stage s lives on rank s for s < {num_ranks}, then on rank {2 * num_ranks - 1} - s (a V)"
    return f"stage s lives on rank s % {num_ranks}"
