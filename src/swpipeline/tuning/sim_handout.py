"""The engine's hand-out of work on paper, with times: what the caller's release and top-up actions do.

A hand-out (one clock tick, or a data-flow top-up) is the engine's own release rule
(``release.py``) applied to paper entries, exactly as ``handout.HandOut`` applies it to a
run: the rule draws batches (each costs the engine's period cost plus the data time, on
the caller's clock), the turns of every period now decided are numbered, and every thread
group's order (``Schedule.walk``) is handed to its lane of the interpreter as far as the
rule allows. What this module adds is when: each lane's hand-outs and each period's
numbering keep the time and the caller action that made them, which the threads wait for
(a unit cannot start before it is handed out, nor take its turn before its period's turns
are numbered) and the critical path reads back.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from ..engine.interpreter import Interpreter
from ..engine.paper import OnPaper, PaperEngine
from ..engine.release import rule_of
from .overheads import EngineOverheads
from .sim_model import CompiledPlan

__all__: List[str] = []


class TimedHandOut:
    """One simulated run's hand-out: the engine's on paper (``paper.PaperEngine``), each lane's hand-outs and each
    period's numbering timed."""

    def __init__(self, compiled: CompiledPlan, interpreter: Interpreter, engine: str, max_live: int,
                 num_iterations: int, overheads: EngineOverheads, data_seconds: float) -> None:
        self.compiled, self.interpreter, self.num_iterations = compiled, interpreter, num_iterations
        self.period_cost, self.data_seconds = overheads.period, data_seconds
        # the engine's own release rule (release.py), applied to paper entries as the engine applies it
        self.engine = PaperEngine(0, OnPaper(compiled.schedule, rule_of(engine, compiled.depth, max_live)),
                                  interpreter, self._fetch)
        self.created = 0
        self.created_at = [0.0] * num_iterations
        self.known_at: List[float] = []  # when each period's turns were numbered
        self.known_by: List[int] = []  # ... and by which caller action
        # per lane: (units handed out so far, time, caller action) after each hand-out, and the one read last
        # (the threads read when their unit h was handed out: the first entry whose count passes h)
        self.batches: List[List[Tuple[int, float, int]]] = [[] for _ in compiled.groups]
        self.read: List[int] = [0] * len(compiled.groups)
        self._clock = 0.0

    def hand_out(self, clock: float, action: int) -> float:
        """A step of the fill, or what follows a retirement (the clock: one tick; the data-flow engine: a top-up),
        by caller action ``action`` starting at ``clock``; returns the caller's clock after it."""
        self._clock, created = clock, self.created
        numbered, handed = self.engine.step()  # (drawing takes time: _fetch)
        if self.created == created:
            self._clock += self.period_cost  # handing out without a new batch
        for _ in numbered:
            self.known_at.append(self._clock)
            self.known_by.append(action)
        for g, count in enumerate(handed):  # (the schedule's lanes are the simulator's groups, in order)
            if count:
                self.batches[g].append((len(self.interpreter.lanes[g]), self._clock, action))
        return self._clock

    def _fetch(self) -> Optional[int]:
        """The release rule draws a batch: the next iteration, or None past the last."""
        it = self.created
        if it >= self.num_iterations:
            return None
        self._clock += self.period_cost + self.data_seconds
        self.created_at[it], self.created = self._clock, it + 1
        return it

    def caller_upto(self, g: int) -> int:
        """How far the caller's group ``g`` runs in one ``progress()`` call, of what was handed out: up to the
        last-stage units of the rule's ``caller_through``, the oldest iteration's last period
        (``Schedule.runs_before_retire``)."""
        last, cut = self.engine.rule.caller_through(self.engine.entries), self.compiled.schedule.retire_cut
        units, h = self.interpreter.lanes[g], self.interpreter.heads[g]
        handed = len(units)
        # Schedule.runs_before_retire, written out: this runs once per unit of every simulated candidate
        while h < handed:
            period, slot, _ = units[h]
            if period > last or period == last and slot.position > cut:
                break
            h += 1
        return h
