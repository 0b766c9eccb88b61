"""Which rank holds which stage: in a loop, or in a V.

::

    4 stages on 2 ranks      stage:  0  1  2  3
    loop (most schedules)     rank:  0  1  0  1      stage s on rank s % p
    V (ZBV, DualPipeV)        rank:  0  1  1  0      stage s on rank s, then 2p - 1 - s

With ``v`` stages per rank the V zigzags: block ``b`` of ``p`` stages runs down the ranks
when ``b`` is even and back up when it is odd, so a rank's two stages of a V are the first
and the last of the ones it holds on its way (rank ``p - 1`` holds two neighbours, which
hand their values over in memory). Every rank computes the placement from the schedule
alone, like the schedule's orders.
"""

from __future__ import annotations

from typing import List

__all__: List[str] = []

LOOP, V = "loop", "v"


def rank_of(stage: int, num_ranks: int, style: str = LOOP) -> int:
    """The rank that holds ``stage``."""
    block, place = divmod(stage, num_ranks)
    if style == V and block % 2:
        return num_ranks - 1 - place
    return place


def stages_of(rank: int, num_ranks: int, num_stages: int, style: str = LOOP) -> List[int]:
    """The stages ``rank`` holds, in pipeline order."""
    return [s for s in range(num_stages) if rank_of(s, num_ranks, style) == rank]


def rule(num_ranks: int, style: str = LOOP) -> str:
    """The placement in words, for error messages."""
    if style == V:
        return f"stage s lives on rank s for s < {num_ranks}, then on rank {2 * num_ranks - 1} - s (a V)"
    return f"stage s lives on rank s % {num_ranks}"
