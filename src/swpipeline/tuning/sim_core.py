"""The simulator's event core: both engines' threads, run on paper with times.

It drives the engine's own interpreter of the schedule's units (``engine/interpreter.py``,
which the deadlock check drives without times) and puts the clock on top: each thread
group is a lane of the interpreter, fed by the engine's hand-out (``sim_handout``); the
caller is a list of actions. A unit may be computed once the interpreter says it can run
(its dependencies done, its turn come); every wait is on something earlier in (period,
submission position), so repeatedly advancing every thread as far as it can always
finishes. Its time is the latest end of what it waited for, the interpreter's own list
of dependencies and the unit before it on each turn line. A unit of task ``T`` at
iteration ``i`` on thread group ``g``::

    picked = free(g)                   if g was busy when the unit was handed out
           = handed_out + wake         if g was idle (blocked on its queue)
    t      = picked + unit             the engine's cost per unit
    t      = max(t, end(D, i) + wake)  for each dependency D still running (then i - 1 for
                                       inter-iteration ones), then each turn not yet come
    start  = t;  end = t + cost(T, i)

On an accelerator (the task has a device time) the thread only launches the work; the
stream runs it after the stream's previous work and after the device work of the
dependencies on other streams, and it ends no earlier than its launch::

    device_start = max(start, stream free, device_end(D) for D on another stream)
    device_end   = max(device_start + device_cost, end)

The caller's actions, per engine (``clocked``: the period clock; ``dataflow``: top-ups)::

    clocked    start threads | release P0 .. P{depth-1} | (run caller-group units, retire k,
               release P{depth+k}) for k = 0 .. N-1 | stop threads
    dataflow   start threads | top up | (retire k, top up) for k = 0 .. N-1 | stop threads

A release (one clock tick) and a top-up are the engine's own hand-out (``sim_handout``);
the caller's group runs, per call, up to the oldest iteration's last units
(``Schedule.runs_before_retire``). Retiring waits for the iteration's last unit (+ wake).
Every unit and caller action keeps what made it wait last
(its *cause*), which is how the critical path is read back.
"""

from __future__ import annotations

import heapq
from typing import List, Optional, Sequence, Tuple

from ..engine.interpreter import Interpreter
from .overheads import EngineOverheads
from .sim_handout import TimedHandOut
from .sim_model import CompiledPlan

__all__: List[str] = []

# causes: what a unit or caller action waited for last
THREAD, RELEASE, DEP, TURN, CALLER, KNOWN, CORE = range(7)
START, RELEASE_PERIOD, CALLER_UNITS, RETIRE, TOPUP, END = range(6)
Ready = Tuple[float, float, int, int]  # when a unit can start: (start, picked, cause, cause_ref)


class Simulation:
    """One simulated run; read its arrays after ``run()`` (times in seconds from the start of ``run()``)."""

    def __init__(self, compiled: CompiledPlan, thread_costs: Sequence[Sequence[float]],
                 device_costs: Sequence[Optional[Sequence[float]]], num_iterations: int, engine: str,
                 max_live: int, overheads: EngineOverheads, data_seconds: float, caller_group: Optional[int]) -> None:
        self.c, self.N, self.engine, self.max_live = compiled, num_iterations, engine, max_live
        self.o, self.caller_group = overheads, caller_group
        self.costs, self.device_costs = thread_costs, device_costs
        self.device = any(d is not None for d in device_costs)
        n = self.n = compiled.n
        size = n * num_iterations
        self.start, self.end, self.picked = [-1.0] * size, [-1.0] * size, [-1.0] * size
        self.dev_start, self.dev_end = ([-1.0] * size, [-1.0] * size) if self.device else ([], [])
        self.cause, self.cause_ref = [0] * size, [0] * size
        # the schedule's units, interpreted as the engines' check does (a unit's key is it * n + task: an index)
        self.units = Interpreter([compiled.schedule])
        self.handout = TimedHandOut(compiled, self.units, engine, max_live, num_iterations, overheads, data_seconds)
        groups = len(compiled.groups)
        self.workers = groups - (caller_group is not None)  # worker threads
        self.free = [0.0] * groups
        self.last_unit = [-1] * groups  # the key of the group's previous unit
        self.stream_free = [0.0] * len(compiled.streams)
        self.iter_end = [0.0] * num_iterations
        self.iter_last = [-1] * num_iterations
        self.retired_at = [0.0] * num_iterations
        self.actions = self._caller_actions()
        self.action_time: List[Tuple[float, float]] = []  # (start, end) of each caller action done
        self.action_cause: List[Tuple[int, int]] = []
        self.pc, self.t = 0, 0.0  # the caller's next action and its clock
        self.caller_mark: Tuple[int, int, float] = (-1, -1, 0.0)  # (action, group's last unit, time) at its start
        self.retired = 0
        self.limit, self.stopped = float("inf"), False  # see run()

    @property
    def created_at(self) -> List[float]:
        """When each iteration's batch was drawn."""
        return self.handout.created_at

    # -- the caller ---------------------------------------------------------------------------------

    def _caller_actions(self) -> List[Tuple[int, int]]:
        N, depth = self.N, self.c.depth
        acts = [(START, 0)]
        if self.engine == "clocked":
            acts += [(RELEASE_PERIOD, p) for p in range(depth)]
            for k in range(N):
                if self.caller_group is not None:
                    acts.append((CALLER_UNITS, k))
                acts += [(RETIRE, k), (RELEASE_PERIOD, depth + k)]
        else:
            acts.append((TOPUP, 0))
            for k in range(N):
                if self.caller_group is not None:
                    acts.append((CALLER_UNITS, k))  # its units up to the last period of iteration k
                acts += [(RETIRE, k), (TOPUP, 0)]
        acts.append((END, 0))
        return acts

    def run(self, cores: Optional[int] = None, limit: float = float("inf")) -> None:
        """Advance every thread and the caller until the run ends (``cores``: see ``_run_in_time_order``).

        With a ``limit``, stop as soon as the caller's clock passes it (the run cannot end
        sooner): ``total`` is then infinite. Searches use it to drop hopeless candidates early.
        """
        self.limit = limit
        if cores is not None:
            self._run_in_time_order(cores)
            return
        groups = [g for g in range(len(self.c.groups)) if g != self.caller_group]
        last = len(self.actions)
        while self.pc < last:
            if self.t > limit:
                self.stopped = True
                return
            moved = False
            for g in groups:
                if self._advance_group(g, self.free[g], False):
                    moved = True
            if self._advance_caller():
                moved = True
            if not moved:  # unreachable for a plan the engines accept; kept as a guard
                raise self._stuck()

    def _stuck(self) -> RuntimeError:
        return RuntimeError(f"the simulation got stuck at caller action {self.actions[self.pc]}; this is a bug in "
                            f"the simulator, please report it with the plan")

    def _advance_caller(self) -> bool:
        moved = False
        while self.pc < len(self.actions) and self._step_caller(True):
            moved = True
        return moved

    def _step_caller(self, run_caller_units: bool) -> bool:
        """Do the caller's next action if it can be done now; returns whether it was.

        ``run_caller_units``: an CALLER_UNITS action runs the caller's own units itself (else they are
        computed one at a time by ``_run_in_time_order`` and the action only ends them).
        """
        o = self.o
        kind, arg = self.actions[self.pc]
        begin, cause = self.t, (CALLER, self.pc - 1)
        if kind == START:
            self.t += o.thread_start * self.workers
        elif kind in (RELEASE_PERIOD, TOPUP):
            self.t = self.handout.hand_out(self.t, self.pc)
        elif kind == CALLER_UNITS:
            g = -1 if self.caller_group is None else self.caller_group
            if self.caller_mark[0] != self.pc:  # entering the action (it may take several calls)
                self.caller_mark = (self.pc, self.last_unit[g], self.t)
            upto = self.handout.caller_upto(g)
            if run_caller_units and self.units.heads[g] < upto:
                self._advance_group(g, self.t, True, upto)
            if self.units.heads[g] < upto:
                return False
            begin = self.caller_mark[2]
            if self.last_unit[g] != self.caller_mark[1]:  # it ends with its last unit
                cause = (THREAD, self.last_unit[g])
        elif kind == RETIRE:
            if not self.units.iteration_done(0, arg):
                return False
            if self.iter_end[arg] > self.t:
                self.t, cause = self.iter_end[arg] + o.wake, (DEP, self.iter_last[arg])
            self.t += o.retire
            self.retired_at[arg], self.retired = self.t, self.retired + 1
            self.handout.engine.retire()  # (iteration arg: iterations retire in order)
        else:
            self.t += o.thread_stop * self.workers
        self.action_time.append((begin, self.t))
        self.action_cause.append(cause)
        self.pc += 1
        return True

    def _caller_due(self) -> Optional[float]:
        """When the caller's next action would start (None while it cannot)."""
        kind, arg = self.actions[self.pc]
        if kind == RETIRE:
            if not self.units.iteration_done(0, arg):
                return None
            return max(self.t, self.iter_end[arg] + self.o.wake)
        return self.t

    def _run_in_time_order(self, cores: int) -> None:
        """``run()`` with at most ``cores`` task functions running at once: units take a free core in the
        order they become ready (a unit that finds none waits for the first to be freed)."""
        free_cores = [(0.0, -1)] * cores  # (free from, the unit that held it), a heap
        workers = [g for g in range(len(self.c.groups)) if g != self.caller_group]
        units = self.units
        while self.pc < len(self.actions):
            if self.t > self.limit:
                self.stopped = True
                return
            best: Optional[Tuple[float, int, Ready]] = None
            caller_turn = self.actions[self.pc][0] == CALLER_UNITS and self.caller_group is not None
            for g in workers + ([self.caller_group] if caller_turn and self.caller_group is not None else []):
                on_caller = g == self.caller_group
                if units.heads[g] < (self.handout.caller_upto(g) if on_caller else len(units.lanes[g])):
                    ready = self._ready(g, self.t if on_caller else self.free[g], on_caller)
                    if ready is not None and (best is None or ready[0] < best[0]):
                        best = (ready[0], g, ready)
            due = self._caller_due()
            if due is not None and (best is None or due <= best[0]):
                if self._step_caller(False):
                    continue
            if best is None:
                raise self._stuck()
            _, g, (t, picked, why, ref) = best
            core_free, holder = free_cores[0]
            if core_free > t:
                t, why, ref = core_free, CORE, holder
            _, slot, it = units.lanes[g][units.heads[g]]
            key = it * self.n + slot.index
            heapq.heapreplace(free_cores, (self._commit(g, g == self.caller_group, t, picked, why, ref), key))

    # -- the threads ---------------------------------------------------------------------------------

    def _advance_group(self, g: int, free: float, on_caller: bool, upto: Optional[int] = None) -> bool:
        """Compute group ``g``'s units in order while they can be (up to unit ``upto``, default every unit
        handed out); returns whether one was.

        ``free`` is when the thread is free: its last unit's end, or the caller's clock for
        the caller's own group (``on_caller``), whose units are never waited for in a queue.
        """
        moved = False
        units = self.units
        end = len(units.lanes[g]) if upto is None else upto
        while units.heads[g] < end:
            ready = self._ready(g, free, on_caller)
            if ready is None:
                break
            free = self._commit(g, on_caller, *ready)
            moved = True
        return moved

    def _ready(self, g: int, free: float, on_caller: bool) -> Optional[Ready]:
        """When group ``g``'s next unit can start: ``(start, picked, cause, cause_ref)``, or None while the
        interpreter says it cannot run yet (see the module docstring)."""
        units = self.units
        h = units.heads[g]
        period, slot, it = units.lanes[g][h]
        task = slot.index
        key = it * self.n + task
        if not units.waits_met(0, task, it, key):  # (the interpreter's can_run, for a head known here)
            return None
        wake, end = self.o.wake, self.end
        if on_caller:  # the caller runs it: after its previous unit, or after the caller's last action
            prev = self.last_unit[g]
            t, why, ref = (free, THREAD, prev) if prev >= 0 and end[prev] == free else (free, CALLER, self.pc - 1)
        else:
            batches, k = self.handout.batches[g], self.handout.read[g]  # when unit h was handed out
            while batches[k][0] <= h:
                k += 1
            self.handout.read[g] = k
            _, released, action = batches[k]
            if free >= released:
                t, why, ref = free, THREAD, self.last_unit[g]
            else:
                t, why, ref = released + wake, RELEASE, action
        t += self.o.unit
        picked = t
        for offset, back in units.deps[0][task]:  # the interpreter's own list of what the unit waits for
            if it >= back:
                e = end[key + offset]
                if e > t:
                    t, why, ref = e + wake, DEP, key + offset
        lines = units.lines_of[0][task]
        if lines:
            known_at = self.handout.known_at
            if known_at[period] > t:  # its turns were numbered when its period's were
                t, why, ref = known_at[period] + wake, KNOWN, self.handout.known_by[period]
            for line in lines:
                taken = units.turns[line]
                if taken:
                    before = units.orders[line][taken - 1]  # the unit whose turn came last on the line
                    if end[before] > t:
                        t, why, ref = end[before] + wake, TURN, before
        return t, picked, why, ref

    def _commit(self, g: int, on_caller: bool, t: float, picked: float, why: int, ref: int) -> float:
        """Record group ``g``'s next unit as starting at ``t``, run on paper; returns its end."""
        key = self.units.run_head(g)
        it, task = divmod(key, self.n)
        finish = t + self.costs[task][it]
        self.start[key], self.end[key], self.picked[key] = t, finish, picked
        self.cause[key], self.cause_ref[key] = why, ref
        if self.device:
            self._run_on_device(task, it, t, finish)
        if on_caller:
            self.t = finish
        else:
            self.free[g] = finish
        self.last_unit[g] = key
        if finish >= self.iter_end[it]:
            self.iter_end[it], self.iter_last[it] = finish, key
        return finish

    def _run_on_device(self, task: int, it: int, launched: float, launch_end: float) -> None:
        """The task's device work on its stream (see the module docstring); host-only tasks end at launch end."""
        c, n = self.c, self.c.n
        key = it * n + task
        costs = self.device_costs[task]
        if costs is None:
            self.dev_start[key], self.dev_end[key] = launched, launch_end
            return
        stream = c.stream_of[task]
        begin = max(launched, self.stream_free[stream])
        for d in c.intra[task]:
            if c.stream_of[d] != stream:
                begin = max(begin, self.dev_end[it * n + d])
        for d, back in c.inter[task]:
            if it >= back and c.stream_of[d] != stream:
                begin = max(begin, self.dev_end[(it - back) * n + d])
        finish = max(begin + costs[it], launch_end)
        self.dev_start[key], self.dev_end[key] = begin, finish
        self.stream_free[stream] = finish

    @property
    def total(self) -> float:
        """The run's wall time: the caller's end, or the device's if it finishes later (the run synchronizes)."""
        if self.stopped:
            return float("inf")
        last_device = max(self.dev_end) if self.device and self.dev_end else 0.0
        return max(self.t, last_device)
