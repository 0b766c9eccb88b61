"""The critical path of a simulated run: the chain of waits that decided when the run ended.

Every unit and caller action of a ``Simulation`` keeps its *cause*, what it waited for
last. Reading causes back from the run's last action gives one unbroken chain from
time 0 to the end, made of three kinds of step::

    task     a unit's function running                     e.g. Forward(i7)  12.0 - 15.0 ms
    engine   the gap before a unit: a wake-up (+ the engine's per-unit cost)
    caller   a caller action: starting threads, fetching and handing out a period, retiring

so the steps' durations add up to the run's (host) wall time, and a task's share of
the path is what making it faster can buy at most.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Tuple

from .sim_core import (CALLER, CALLER_UNITS, CORE, DEP, END, KNOWN, RELEASE, RELEASE_PERIOD, RETIRE, START, THREAD,
                       TOPUP, TURN)
from .sim_core import Simulation

__all__: List[str] = []

ENGINE, CALLER_LABEL = "(hand-offs)", "(caller)"
_ACTION_NAMES = {START: "start threads", RELEASE_PERIOD: "release period", CALLER_UNITS: "caller's own tasks",
                 RETIRE: "retire", TOPUP: "top up", END: "stop threads"}


class PathStep(NamedTuple):
    """One step of the critical path (seconds since the run started).

    ``kind`` is ``"task"`` (``name`` is the task, ``iteration`` its iteration), ``"engine"``
    (the wake-up and per-unit cost before the task that follows) or ``"caller"`` (``name``
    says which action of the thread that drives the pipeline; ``iteration`` is -1 unless
    it retired one).
    """

    kind: str
    name: str
    iteration: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


def critical_path(sim: Simulation) -> Tuple[PathStep, ...]:
    """The chain of causes from the run's last caller action back to time 0, in time order."""
    steps: List[PathStep] = []
    names, n = sim.c.names, sim.c.n
    node_is_unit, ref = False, len(sim.action_time) - 1
    while ref >= 0:
        if node_is_unit:
            key = ref
            task, it = key % n, key // n
            start, end = sim.start[key], sim.end[key]
            steps.append(PathStep("task", names[task], it, start, end))
            why, ref = sim.cause[key], sim.cause_ref[key]
            if why in (THREAD, DEP, TURN, CORE) and ref >= 0:
                before, node_is_unit = sim.end[ref], True
            elif why in (RELEASE, CALLER, KNOWN) and ref >= 0:
                before, node_is_unit = sim.action_time[ref][1], False
            else:  # the group's first unit, on a thread that was free from the start
                before, ref = 0.0, -1
            if start > before:
                steps.append(PathStep("engine", ENGINE, -1, before, start))
            continue
        begin, end = sim.action_time[ref]
        kind, arg = sim.actions[ref]
        why, cause_ref = sim.action_cause[ref]
        label = f"{_ACTION_NAMES[kind]} P{arg}" if kind == RELEASE_PERIOD else _ACTION_NAMES[kind]
        iteration = arg if kind == RETIRE else -1
        if why == THREAD:  # the caller's own units: the action ended with the last of them
            ref, node_is_unit = cause_ref, True
            continue
        if why == DEP:  # a retire that waited for the iteration's last unit
            unit_end = sim.end[cause_ref]
            steps.append(PathStep("caller", f"retire i{arg}", iteration, unit_end, end))
            ref, node_is_unit = cause_ref, True
            continue
        if end > begin or kind == RETIRE:
            steps.append(PathStep("caller", label if kind != RETIRE else f"retire i{arg}", iteration, begin, end))
        ref = ref - 1 if why == CALLER else -1
    steps.reverse()
    return tuple(steps)


def path_shares(path: Tuple[PathStep, ...]) -> Dict[str, float]:
    """Seconds on the path per task, plus ``(hand-offs)`` and ``(caller)``, largest first."""
    shares: Dict[str, float] = {}
    for step in path:
        key = step.name if step.kind == "task" else ENGINE if step.kind == "engine" else CALLER_LABEL
        shares[key] = shares.get(key, 0.0) + step.duration
    return dict(sorted(shares.items(), key=lambda kv: (-kv[1], kv[0])))
