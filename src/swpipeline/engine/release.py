"""When a unit may be handed out: each engine's release rule, written once.

A *unit* is one task on one iteration. In period ``p`` the slot of a task at stage ``s``
works on the iteration that entered the pipeline in period ``p - s`` (the unit's
*entry*), if one did. Each thread group runs its units in one fixed order, by period
and then by position in the submission order (``Schedule.walk``). A release rule says
how far along that order units may be handed out, from which entries are *decided*:
an iteration entered there, or none ever will (a *gap*)::

    SWPipeline      a unit of period p when p <= the last released period; one more period
                    is released per tick (fill: depth ticks; each retire: one), and the batch
                    drawn in a tick enters in its period
    DataFlow        a unit of entry e when e is decided: batches are drawn while fewer than
                    max_depth iterations are alive, each entering in the next period
    both            a unit that takes turns (the sequencer, a shared stream) also needs its
                    period's turns numbered: p <= the last decided entry, or the data ended
    caller's group  only inside progress(), and only p <= e + depth - 1, e the oldest live
                    iteration's entry: its last period (of which a progress() that goes on
                    runs the units up to the last stage's: Schedule.runs_before_retire)

A step without a batch (``progress(None)``, ``drain()``) decides the entries up to the
next iteration's last period as gaps, on both engines, so that every group's order
reaches that iteration's units. With no gaps (the paper runs of ``paper.check`` and
the simulator) iteration ``i`` enters in period ``i``.

The engines (``handout.HandOut``) and the paper runs (``paper.PaperEngine``: the deadlock
check and the simulator) all ask these objects, so a rule changes in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Generic, List, Optional, Tuple, TypeVar

__all__: List[str] = []

T = TypeVar("T")
ALL = 1 << 62  # "no bound": every period, every entry


# How far every thread group's order may be handed out now: ``(through_period, decided)``, units of periods
# <= through_period whose entries are <= decided (ALL: the data ended, every entry is decided); a unit that
# takes turns also needs its period <= decided. A plain pair, made once per iteration: a named tuple would
# cost a fifth of a microsecond more each time.
Released = Tuple[int, int]


@dataclass
class Entries(Generic[T]):
    """Which iteration entered in which period: what a release rule reads and changes.

    ``T`` is what an engine keeps per iteration (its context; an iteration number on paper).
    """

    entered: Dict[int, T] = field(default_factory=dict)  # period -> the live iteration that entered in it
    entry_of: Dict[int, int] = field(default_factory=dict)  # iteration -> the period it entered in (live ones)
    next_entry: int = 0  # every period before it is decided
    last_entry: int = -1  # the period the newest iteration entered in
    ended: bool = False  # the data ended: no iteration enters any more
    drawn: int = 0  # iterations drawn so far: the next one is numbered so

    def enter(self, item: T) -> None:
        """The next iteration (numbered ``drawn``) enters in the next period."""
        period = self.next_entry
        self.entered[period] = item
        self.entry_of[self.drawn] = self.last_entry = period
        self.next_entry, self.drawn = period + 1, self.drawn + 1

    def retire(self, iteration: int) -> None:
        del self.entered[self.entry_of.pop(iteration)]

    def oldest_entry(self) -> Optional[int]:
        """The period the oldest live iteration entered in (iterations enter, and retire, in order)."""
        for period in self.entered:
            return period
        return None

    def horizon(self, depth: int) -> int:
        """The last period any unit can have: every later one is empty for good (ALL: not known yet)."""
        return self.last_entry + depth - 1 if self.ended else ALL


Fetch = Callable[[], Optional[T]]  # draw the next batch's item: None when there is none (now or ever)


class ReleaseRule:
    """What both rules share: the fill, the gaps of a step without a batch, and the caller's group's limit."""

    name = ""
    fill_steps = 1  # how many hand-outs a fill is made of (the clock: one tick per period)
    yields_after_hand_out = False  # a worker just handed work takes the GIL at once (handout.HandOut)

    def __init__(self, depth: int) -> None:
        self.depth = depth

    @property
    def max_live(self) -> int:
        """The most iterations alive at once."""
        return self.depth

    @property
    def allows_caller_group(self) -> bool:
        """Whether ``run()`` may run a thread group on the caller's thread (see ``caller_through``)."""
        return self.caller_group_refusal() is None

    def caller_group_refusal(self) -> Optional[str]:
        """Why no thread group may run on the caller's thread under this rule, in words (None: one may)."""
        return None

    def fill_step(self, entries: Entries[T], fetch: Fetch[T]) -> None:
        """One hand-out of the fill."""
        raise NotImplementedError

    def released(self, entries: Entries[T]) -> Released:
        raise NotImplementedError

    def retired(self, entries: Entries[T], oldest: Optional[int], fetch: Optional[Fetch[T]]) -> Released:
        """What the engines do once per iteration, in one call: ``oldest`` retires (None: it did already), the
        rule draws what comes next (``fetch`` None: a step without a batch), and how far every order may now be
        handed out. Each rule writes it out in one function, since it runs once per iteration; the engines
        (``handout.HandOut``) and their hand-out on paper (``paper.PaperEngine``) call this same function."""
        raise NotImplementedError

    def caller_through(self, entries: Entries[T]) -> int:
        """The last period whose units the caller's group runs in one ``progress()`` call: the oldest live
        iteration's last (every period released so far when none is live)."""
        for oldest in entries.entered:
            return oldest + self.depth - 1
        return entries.next_entry - 1

    def _gaps_through_next(self, entries: Entries[T]) -> None:
        """A step without a batch: decide the entries up to the next live iteration's last period as gaps."""
        oldest = entries.oldest_entry()
        if oldest is not None:
            entries.next_entry = max(entries.next_entry, oldest + self.depth)

    @staticmethod
    def _draw(entries: Entries[T], fetch: Fetch[T]) -> bool:
        item = fetch()
        if item is None:
            return False
        entries.enter(item)
        return True


class ClockRule(ReleaseRule):
    """SWPipeline: the period clock. Each tick releases one period and draws the batch entering in it."""

    name = "clock"
    yields_after_hand_out = True  # with several worker threads, the one just handed its period may be the bottleneck

    def __init__(self, depth: int) -> None:
        super().__init__(depth)
        self.fill_steps = depth

    def fill_step(self, entries: Entries[T], fetch: Fetch[T]) -> None:
        if entries.ended:
            entries.next_entry += 1  # a tick without a batch
        else:
            self._tick(entries, fetch)

    def retired(self, entries: Entries[T], oldest: Optional[int], fetch: Optional[Fetch[T]]) -> Released:
        # ``oldest`` retires (None: it did already), then one tick (drawing its batch unless the step has none or
        # the data ended), then the gaps of _gaps_through_next; written out, since it runs once per iteration
        if oldest is not None:
            del entries.entered[entries.entry_of.pop(oldest)]  # (Entries.retire)
        period = entries.next_entry
        if fetch is not None and not entries.ended:
            item = fetch()
            if item is None:
                entries.ended = True
            else:
                entries.entered[period] = item
                entries.entry_of[entries.drawn] = entries.last_entry = period
                entries.drawn += 1
        last = period  # every period up to the last released one is decided: its batch entered, or none did
        for first in entries.entered:  # the oldest live iteration: its last period must be released
            if first + self.depth > period + 1:
                last = first + self.depth - 1
            break
        entries.next_entry = last + 1
        return last, last  # (released)

    def _tick(self, entries: Entries[T], fetch: Fetch[T]) -> None:
        if not self._draw(entries, fetch):
            entries.ended = True
            entries.next_entry += 1

    def released(self, entries: Entries[T]) -> Released:
        last = entries.next_entry - 1  # every released period is decided: its batch entered, or none did
        return last, last


class DataFlowRule(ReleaseRule):
    """DataFlowPipeline: no clock. Batches are drawn while fewer than ``max_live`` iterations are alive."""

    name = "dataflow"

    def __init__(self, depth: int, max_live: int) -> None:
        super().__init__(depth)
        self.live = max_live

    @property
    def max_live(self) -> int:
        return self.live

    def caller_group_refusal(self) -> Optional[str]:
        """Only with ``max_live >= depth``: with fewer live iterations a unit of the caller's group could wait
        for work the caller hands out only after retiring an iteration."""
        if self.live >= self.depth:
            return None
        return (f"a thread group on the caller's thread needs max_depth >= the plan's depth ({self.depth}), got "
                f"max_depth={self.live}: with fewer live iterations its units could wait for work the "
                f"caller hands out only after retiring an iteration; raise max_depth or pass None")

    def fill_step(self, entries: Entries[T], fetch: Fetch[T]) -> None:
        self.retired(entries, None, fetch)  # draw while fewer than max_live iterations are alive

    def released(self, entries: Entries[T]) -> Released:
        return ALL, ALL if entries.ended else entries.next_entry - 1

    def retired(self, entries: Entries[T], oldest: Optional[int], fetch: Optional[Fetch[T]]) -> Released:
        # ``oldest`` retires (None: it did already); then draw while fewer than max_live iterations are alive, or,
        # in a step without a batch, the gaps of _gaps_through_next
        entered = entries.entered
        if oldest is not None:
            del entered[entries.entry_of.pop(oldest)]  # (Entries.retire)
        if fetch is None:
            self._gaps_through_next(entries)
        else:
            while len(entered) < self.live and not entries.ended:
                item = fetch()
                if item is None:
                    entries.ended = True
                else:
                    entries.enter(item)
        return ALL, ALL if entries.ended else entries.next_entry - 1


def rule_of(engine: str, depth: int, max_live: int) -> ReleaseRule:
    """The release rule of an engine by its name in the tuning tools: ``"clocked"`` or ``"dataflow"``."""
    return ClockRule(depth) if engine == "clocked" else DataFlowRule(depth, max_live)
