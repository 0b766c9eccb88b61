"""State every iteration shares, as the race checker logs it: named tensors and random generators.

A context attribute belongs to one iteration, and its log to that iteration's context. A
parameter, a gradient, optimizer state, a buffer or a generator is one for all iterations:
a step of iteration ``i`` writes what the forward of ``i + 1`` reads. ``SharedLog`` keeps,
per name and per task, the kind of access (``READ``, ``WRITE``; ``DRAW`` for a generator,
which a draw reads and advances) in each of the task's last ``KEPT`` iterations.

Two accesses conflict when one of them is not a read. A new access is compared with each
other task's accesses in the same iteration, the one before, the one after and that task's
latest: that is enough to find a race, since a task's earlier iterations happen before its
latest, and a conflict between iterations further apart is ordered once every consecutive
pair is (a chain through the writer's own iterations). Each access is logged before it is
compared, under one lock, so of two conflicting accesses the later one sees the earlier.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Protocol, Tuple

from .access import READ

__all__: List[str] = []

KEPT = 8  # iterations kept per task and name (the latest alone would find every race)

Unit = Tuple[int, int]  # (task index in the plan, iteration)
Access = Tuple[Unit, str]  # (unit, kind)


class Judge(Protocol):
    """What the log asks of the race checker: whether two units are ordered, and what to do with a race."""

    def _ordered(self, one: Unit, other: Unit) -> bool: ...

    def _raises(self, one: Unit, other: Unit) -> bool: ...

    def _earliest(self, pairs: Iterable[Tuple[Access, Access]]) -> Tuple[Access, Access]: ...

    def _report(self, attribute: str, one: Access, other: Access) -> None: ...


class SharedLog:
    """The accesses to shared state, per name, per task, per iteration (see the module docstring).

    Not locked itself: the race checker calls ``add`` and ``clear`` under its lock.
    """

    def __init__(self, judge: Judge) -> None:
        self._judge = judge
        self._log: Dict[str, Dict[int, Dict[int, str]]] = {}  # name -> task -> iteration -> kind

    def clear(self) -> None:
        """A new run numbers its iterations from 0 again: forget the last one's."""
        self._log.clear()

    def add(self, name: str, unit: Unit, kind: str) -> None:
        """Log one access and compare it with the other tasks' (``judge._report`` raises or warns for a race)."""
        task, iteration = unit
        by_task = self._log.setdefault(name, {})
        mine = by_task.setdefault(task, {})
        was = mine.get(iteration)
        if was is not None and (was != READ or kind == READ):
            return
        mine[iteration] = kind
        if len(mine) > KEPT:
            del mine[next(iter(mine))]
        judge = self._judge
        for other, seen in list(by_task.items()):
            if other == task:
                continue
            for j in (iteration, iteration - 1, iteration + 1, next(reversed(seen))):
                other_kind = seen.get(j)
                if other_kind is None or (other_kind == READ and kind == READ) or judge._ordered((other, j), unit):
                    continue
                pair = ((other, j), other_kind), (unit, kind)
                if judge._raises((other, j), unit):
                    pair = judge._earliest((((other, k), seen_kind), ((task, i), my_kind))
                                           for i, my_kind in mine.items() for k, seen_kind in seen.items()
                                           if seen_kind != READ or my_kind != READ)
                judge._report(name, *pair)
