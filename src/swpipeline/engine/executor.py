"""One unit of work: the two-phase protocol, written once.

A unit (``schedule.Unit``: its period, its slot, the iteration's context) runs on its
thread group's worker, as the run's task of that slot::

    if it reads the batch first:        # no producer in its iteration, on a device with events
        device.wait(stream, batch_event)  #   only if the caller drew the batch on another stream
    for dep in deps:                    # intra: iteration i; inter: iteration i - distance
        wait(dep, it)                   # phase 1: CPU signal (returns at once if done); only if
                                        #   dep is in another thread group: the group's own order
                                        #   ran it already (BoundTask.wait_intra / wait_inter)
        device.wait(stream, event)      # phase 2: only if dep ran on another stream
    launch(task, ctx)                   # fn(ctx) with the task's stream current, in its turns:
                                        #   on its stream, if several thread groups share it;
                                        #   in the sequencer, if it is globally ordered
    keep_alive(written, consumers)      # tensors it left on ctx, for readers on other streams
                                        #   (devices that track memory only, see lifetime.py)
    free(task, ctx)                     # free_early: attributes no other task uses any more
    device.record(event, stream)        # only if a consumer is on another stream
    board.complete(task, i)             # sets the CPU signal

A worker runs a queue item's units through ``make_batch_runner``: one after the other,
each through the unit executor above, except a unit with nothing but the launch and the
signal to do (no batch event, no dependency to wait for, no turns, events, keep-alive or
early frees, a device that calls the function directly: most units on the CPU), which
the batch runner does in line (``bare_functions``).

A traced run wraps this same function (``traced``): it times the phase-1 waits
through the ``wait`` it passes in and the task body through the recorder's shadow
task; nothing of the protocol is repeated, and an untraced run takes no recording
branch anywhere.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from ..devices.annotations import run_annotated
from ..devices.device import Device
from .lifetime import keep_written
from ..plan.context import IterContext
from .runtime import BoundTask
from .schedule import Work

if TYPE_CHECKING:
    from .signals import CompletionBoard
    from ..observe.timeline import Recorder

__all__: List[str] = []

RunUnit = Callable[[Work], None]


Launch = Callable[[BoundTask, IterContext], None]


def make_launches(device: Device, labels: Dict[int, str], nvtx: bool) -> Tuple[Launch, Launch]:
    """How to run a task's function on its stream: ``(plain, annotated)``.

    ``annotated`` wraps each call in a ``SWP/{label}/iter{N}`` range (a torch profiler
    range, and an NVTX range when ``nvtx``); ``plain`` is the same as ``annotated``
    when ``nvtx``, and otherwise calls the function directly where the device needs
    nothing around it (the CPU: a thread group already runs its lane's units one at a
    time, and the turns of a lane shared by several groups make them exclusive).
    """

    def annotated(task: BoundTask, ctx: IterContext) -> None:
        fn = partial(run_annotated, f"SWP/{labels[task.index]}/iter{ctx.iter_idx}", task.exec_fn, nvtx=nvtx)
        device.launch(task.stream, fn, ctx, task.name)

    if nvtx:
        return annotated, annotated
    if device.launches_directly:
        def plain(task: BoundTask, ctx: IterContext) -> None:
            task.exec_fn(ctx)
        plain.direct = True  # type: ignore[attr-defined]  # the unit executor may call exec_fn itself
    else:
        def plain(task: BoundTask, ctx: IterContext) -> None:
            device.launch(task.stream, task.exec_fn, ctx, task.name)
    return plain, annotated


def make_unit_runner(board: "CompletionBoard", device: Device, launch: Launch, tasks: Sequence[BoundTask],
                     event_slots: int, signal_timeout: float, wait: Optional[Callable[..., None]] = None,
                     free: Optional[Callable[[int, IterContext], None]] = None,
                     batch_events: Sequence[Any] = (), batch_streams: Sequence[Any] = ()) -> RunUnit:
    """The unit executor of one run (see the module docstring); ``tasks[slot.index]`` is a unit's task.

    ``batch_events[i % event_slots]`` is recorded on stream ``batch_streams[i % event_slots]``
    after the caller drew iteration ``i``'s batch (``feed.Feed.draw``), a stream of None meaning
    that no task needs to wait for it.
    """
    done = board.done
    complete = board.complete
    wait_task = wait or board.wait_task
    slots, timeout = event_slots, signal_timeout
    direct = getattr(launch, "direct", False)  # launch(task, ctx) is task.exec_fn(ctx): save the call

    def in_turns(task: BoundTask, ctx: IterContext, i: int) -> None:
        key, call = (task.index, i), partial(launch, task, ctx)
        if task.turns is not None:
            call = partial(task.turns.run_in_turn, key, call, timeout, task.name, i)
        if task.stream_turns is not None:
            task.stream_turns.run_in_turn(key, call, timeout, task.name, i)
        else:
            call()

    def launch_and_more(task: BoundTask, ctx: IterContext, i: int) -> None:
        """Launch in turns if it takes them; then keep-alive, early frees, its event (each only if needed)."""
        keep = task.keep_for
        if keep:
            before = dict(vars(ctx))
        if task.turns is None and task.stream_turns is None:
            launch(task, ctx)
        else:
            in_turns(task, ctx, i)
        if keep:
            keep_written(device, vars(ctx), before, keep)
        if free is not None:
            free(task.index, ctx)
        if task.events is not None:
            device.record(task.events[i % slots], task.stream)

    def run_unit(unit: Work) -> None:
        _, slot, ctx = unit
        task = tasks[slot.index]
        i = ctx.iter_idx
        stream = task.stream
        if task.waits_batch:
            drawn_on = batch_streams[i % slots]
            if drawn_on is not None and drawn_on != stream:
                device.wait(stream, batch_events[i % slots])
        for dep, dep_events in task.wait_intra:  # (the dependencies its group's order does not meet already)
            if done[dep] <= i:
                wait_task(dep, i, timeout, task.name, i)
            if dep_events is not None:
                device.wait(stream, dep_events[i % slots])
        for dep, dep_events, distance in task.wait_inter:
            back = i - distance
            if back >= 0:
                if done[dep] <= back:
                    wait_task(dep, back, timeout, task.name, i)
                if dep_events is not None:
                    device.wait(stream, dep_events[back % slots])
        if task.plain and free is None:
            if direct:
                task.exec_fn(ctx)
            else:
                launch(task, ctx)
        else:
            launch_and_more(task, ctx, i)
        complete(task.index, i)

    return run_unit


class Holder(Protocol):
    """The worker a batch runs for: it names the unit it is running and reports a failure."""

    current: Optional[Work]

    def report(self, exc: BaseException, unit: Optional[Work]) -> None: ...


RunBatch = Callable[[Sequence[Work], Holder], bool]


def bare_functions(tasks: Sequence[BoundTask], launch: Launch,
                   free: Optional[Callable[[int, IterContext], None]] = None) -> List[Optional[Callable[..., Any]]]:
    """Per task index: the task's function if a unit of it has nothing to do but call it and signal (no batch
    event, no dependency to wait for, plain, no early frees, a launch that calls the function directly), else
    None. On the CPU most units are so."""
    bare: List[Optional[Callable[..., Any]]] = [None] * (max((t.index for t in tasks), default=-1) + 1)
    if getattr(launch, "direct", False) and free is None:
        for t in tasks:
            if t.plain and not (t.waits_batch or t.wait_intra or t.wait_inter):
                bare[t.index] = t.exec_fn
    return bare


def make_batch_runner(board: "CompletionBoard", run_unit: RunUnit,
                      bare: Sequence[Optional[Callable[..., Any]]] = ()) -> RunBatch:
    """What a worker runs a queue item with: its units in order, each through ``run_unit``, or, for a task
    with a function in ``bare`` (``bare_functions``), that function and the signal written out in line
    (``board.complete``: see ``CompletionBoard.waiters``), one call less per unit.

    ``run_batch(units, holder)`` checks before each unit that the run was not aborted, names the unit in
    ``holder.current`` while it runs (None once the batch is over, or failed: no code of the run's runs
    between two units of a batch), hands a failure to ``holder.report``, and returns False if the worker
    must end (aborted, or a unit failed).
    """
    done, waiters, wake = board.done, board.waiters, board.wake
    bare = list(bare) + [None] * (len(board.done) - len(bare))

    def run_batch(units: Sequence[Work], holder: Holder) -> bool:
        for unit in units:
            if board.aborted:
                holder.current = None
                return False
            holder.current = unit
            try:
                _, slot, ctx = unit
                index = slot.index
                fn = bare[index]
                if fn is None:
                    run_unit(unit)
                else:
                    i = ctx.iter_idx
                    fn(ctx)
                    done[index] = i + 1
                    if waiters[index]:
                        wake(index)
            except BaseException as exc:
                holder.current = None
                holder.report(exc, unit)
                return False
        holder.current = None
        return True

    return run_batch


def traced(run_unit: RunUnit, recorder: "Recorder", clocked: bool) -> RunUnit:
    """``run_unit`` (made with the recorder's shadow tasks, ``recorder.runtimes``) that records every unit it
    runs, with its period when the periods are a clock's (``clocked``); the unit executor itself is unchanged."""
    begin, add = recorder.begin, recorder.add

    def run_traced(unit: Work) -> None:
        period, slot, ctx = unit
        begin(slot.index)
        run_unit(unit)
        add(slot.index, ctx.iter_idx, period if clocked else None)

    return run_traced

