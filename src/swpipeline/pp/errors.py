"""What a pipeline-parallel schedule raises that a caller may want to catch by type."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

__all__: List[str] = []


class ScheduleHangError(ValueError):
    """A schedule that could never finish, refused before any rank sends anything.

    ``units`` lists the ``(rank, action)`` pairs of the cycle of waits (or the unmatched
    send or receive), in the order each waits for the next.
    """

    def __init__(self, message: str, units: Sequence[Tuple[int, str]]) -> None:
        super().__init__(message)
        self.units: List[Tuple[int, str]] = list(units)

    @property
    def ranks(self) -> List[int]:
        return sorted({rank for rank, _ in self.units})


class ScheduleMismatchError(ValueError):
    """Two ranks of one pipeline run different schedules: their classes, microbatches, stages, placement, skips,
    scaling, or step() against eval(). Found when a rank's step starts, in the first message from each peer; the
    message says what each of the two runs."""


class PipelineRankError(RuntimeError):
    """Another rank's step failed (or stopped answering), so this rank stopped its own step.

    Attributes name where the first failure happened: ``rank``, ``stage``, ``microbatch``
    and ``action`` (``None`` where it was not in an action, e.g. a timeout between
    steps) and ``error``, the original exception as text (``"ValueError: ..."``).
    """

    def __init__(self, message: str, *, rank: int, stage: Optional[int], microbatch: Optional[int],
                 action: Optional[str], error: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.stage = stage
        self.microbatch = microbatch
        self.action = action
        self.error = error


class RankTimeoutError(PipelineRankError):
    """A rank waited longer than the schedule's ``timeout`` for a message from another rank."""
