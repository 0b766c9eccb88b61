"""Where a run is assembled: one fill's parts, each made whole from plain values, in the order they need each other.

::

    tasks      runtime.bind_run      the pipeline's tasks bound to this run: its device events, its turns
    board      signals.CompletionBoard
    life       run_state.RunLife     the state machine and the first failure (board and turns to wake)
    feed       feed.Feed             the data iterator and the contexts in flight (batch events too)
    executors  executor.*            how a worker runs a queue item (traced: through the recorder)
    crew       crew.Crew             one worker per thread group, reporting to life; none started
    handout    handout.HandOut       the release rule: draws through the feed, puts on the crew's queues
    run        run.Run               the parts, and what needs several of them at once

No part refers to the run or to a part made after it; the run's threads start only in
``Run.start``. What a pipeline fixes once for all its runs is a ``RunSettings``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch

from ..devices.device import Device
from ..observe.timeline import Recorder
from .crew import Crew
from .executor import Launch, RunBatch, bare_functions, make_batch_runner, make_launches, make_unit_runner, traced
from .feed import Feed
from .handout import HandOut
from .lifetime import EarlyFree
from .release import ReleaseRule
from .run import Run
from .run_state import RunLife, progress_timeout_error
from .runtime import BoundTask, TaskSpec, all_turns, bind_run, run_default_stream
from .schedule import Schedule
from .signals import CompletionBoard
from .worker import enter_worker_thread

__all__: List[str] = []

NewRecorder = Callable[[Sequence[BoundTask], Optional[str]], Optional[Recorder]]  # (tasks, caller group)


@dataclass(frozen=True)
class RunSettings:
    """What a pipeline fixes once for every run it makes."""

    schedule: Schedule
    rule: ReleaseRule
    tasks: List[TaskSpec]
    groups: List[str]  # the thread groups, in the order their workers are made and started
    device: Device
    event_slots: int  # device events per producing task: live iterations + reach (runtime.bind_run)
    signal_timeout: float
    progress_timeout: float
    join_timeout: float
    worker_init: Optional[Callable[[str], None]]
    free_uses: Optional[Any]  # free_early's attribute sets (lifetime.EarlyFree), or None
    yield_after_hand_out: bool  # the engine's wish: a worker handed work takes the GIL at once (see handout)


def assemble_run(settings: RunSettings, data_iter: Iterator[Any], caller_group: Optional[str],
                 labels: Dict[int, str], nvtx: bool, new_recorder: NewRecorder) -> Run:
    """A run of ``data_iter``, whole and not started (see the module docstring).

    ``caller_group``: the thread group run on the calling thread, if any; ``labels``: each task's name
    as profiler ranges show it; ``nvtx``: NVTX ranges around every unit; ``new_recorder``: the
    pipeline's tracing, which gives a recorder when the fill is traced.

    Raises:
        ValueError: the stream current on the calling thread is one the plan names for some tasks.
    """
    device, event_slots = settings.device, settings.event_slots
    default = run_default_stream(device, settings.tasks)
    tasks = bind_run(settings.tasks, device, event_slots, default)
    board = CompletionBoard([t.name for t in tasks])
    feed = Feed(data_iter, device, tasks, event_slots)
    # a unit on the caller's thread is part of a progress() call, which waits progress_timeout at most
    caller_timeout = min(settings.signal_timeout, settings.progress_timeout)
    times_out_first = caller_timeout < settings.signal_timeout
    life = RunLife(board, all_turns(tasks), functools.partial(_caller_timed_out, board, tasks, feed,
                                                              settings.progress_timeout) if times_out_first else None)
    recorder = new_recorder(tasks, caller_group)
    runner = _runner(settings, tasks, board, feed, recorder)
    plain, annotated = make_launches(device, labels, nvtx)
    torch_threads, worker_init = torch.get_num_threads(), settings.worker_init

    def enter(group: str) -> Callable[[], None]:  # must not hold the pipeline (see shutdown.py)
        return functools.partial(enter_worker_thread, torch_threads, device, worker_init, group)

    crew = Crew(settings.groups, (runner(plain, settings.signal_timeout),
                                                runner(annotated, settings.signal_timeout)),
                enter, life.on_worker_error, caller_group,
                (runner(plain, caller_timeout), runner(annotated, caller_timeout)), life.on_caller_error)
    handout = HandOut(settings.schedule, settings.rule, feed.draw, {g: w.put for g, w in crew.workers.items()},
                      tasks, crew.caller, settings.yield_after_hand_out and crew.threads > 1)
    return Run(life, feed, crew, handout, tasks, board, device, default, event_slots=event_slots,
               progress_timeout=settings.progress_timeout, join_timeout=settings.join_timeout)


def _runner(settings: RunSettings, tasks: List[BoundTask], board: CompletionBoard, feed: Feed,
            recorder: Optional[Recorder]) -> Callable[[Launch, float], RunBatch]:
    """How a worker runs its queue items, given how to launch a task and how long a wait may take."""
    device, event_slots = settings.device, settings.event_slots
    wait = recorder.timed_wait(board.wait_task) if recorder is not None else None
    free = EarlyFree(settings.free_uses).done if settings.free_uses is not None else None
    run_tasks = recorder.runtimes if recorder is not None else tasks  # a traced run times shadow tasks
    clocked = settings.rule.name == "clock"

    def runner(launch: Launch, timeout: float) -> RunBatch:
        run_unit = make_unit_runner(board, device, launch, run_tasks, event_slots, timeout, wait, free,
                                    feed.batch_events, feed.batch_streams)
        if recorder is not None:  # every unit through the traced executor
            return make_batch_runner(board, traced(run_unit, recorder, clocked))
        return make_batch_runner(board, run_unit, bare_functions(run_tasks, launch, free))

    return runner


def _caller_timed_out(board: CompletionBoard, tasks: List[BoundTask], feed: Feed, timeout: float) -> Any:
    """A wait on the caller's thread outlasted ``progress_timeout``: the error ``progress()`` raises for it."""
    return progress_timeout_error(board, tasks, feed.next_retire, timeout)
