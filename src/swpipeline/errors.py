"""The exceptions callers may want to catch specifically.

Plan mistakes are ``TypeError``/``ValueError``. An exception raised by a task
function reaches the caller as itself (same type, same object) with a note naming
the task and the iteration, and the attributes ``swp_task`` and ``swp_iter``.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import List, Optional, Type

__all__: List[str] = []


class PipelineTimeoutError(RuntimeError):
    """Something the pipeline waited for did not happen within its timeout."""


class DependencyTimeoutError(PipelineTimeoutError):
    """A task waited longer than ``signal_timeout`` for one of its dependencies."""

    def __init__(self, task: str, iter_idx: int, dependency: str, dep_iter: int, timeout: float) -> None:
        kind = "intra-iteration" if dep_iter == iter_idx else "inter-iteration"
        super().__init__(
            f"task {task!r} (iteration {iter_idx}) waited {timeout:g} s for its {kind} dependency "
            f"{dependency!r} (iteration {dep_iter}), which never completed; check that {dependency!r} "
            f"is scheduled and not blocked, or raise signal_timeout"
        )
        self.task = task
        self.iter_idx = iter_idx
        self.dependency = dependency
        self.dep_iter = dep_iter


class ProgressTimeoutError(PipelineTimeoutError):
    """``progress()`` waited longer than ``progress_timeout`` for the oldest iteration."""

    def __init__(self, iter_idx: int, unfinished: List[str], timeout: float, waits: List[str],
                 waited_for: Optional[str] = None) -> None:
        blocked = "".join(f"; {w}" for w in waits)
        what = waited_for or f"iteration {iter_idx} to complete"
        super().__init__(
            f"progress() waited {timeout:g} s for {what}; tasks not yet done: "
            f"{unfinished}{blocked}; a task is slow or blocked (raise progress_timeout if it is just slow)"
        )
        self.iter_idx = iter_idx
        self.unfinished = unfinished


class SequencerTimeoutError(PipelineTimeoutError):
    """A task waited longer than ``signal_timeout`` for its turn (globally ordered, or on a shared stream)."""

    def __init__(self, task: str, iter_idx: int, seq: Optional[int], next_seq: int, timeout: float,
                 holder: Optional[str], what: str = "the sequencer") -> None:
        waiting_for = f" (the turn belongs to {holder!r})" if holder else ""
        kind = "globally ordered task" if what == "the sequencer" else f"task on {what}"
        if seq is None:
            turn = ("its turn, which was never assigned (the units before it in the schedule are not known yet: "
                    "an iteration was not fetched)")
        else:
            turn = f"its turn #{seq}"
        super().__init__(
            f"{kind} {task!r} (iteration {iter_idx}) waited {timeout:g} s for {turn}; {what} is still at "
            f"#{next_seq}{waiting_for}"
        )
        self.task = task
        self.iter_idx = iter_idx


class SharedStreamWarning(UserWarning):
    """Tasks of different thread groups share a stream, so they take turns and never overlap each other."""


class PipelineAborted(RuntimeError):
    """Internal: raised inside worker threads to unwind once the pipeline has failed or was abandoned."""


def warn_caller(message: str, category: Type[Warning]) -> None:
    """``warnings.warn`` attributed to the first frame outside this package (the user's line)."""
    package = os.path.dirname(os.path.abspath(__file__))
    level, frame = 2, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        level, frame = level + 1, frame.f_back  # type: ignore[assignment]
    warnings.warn(message, category, stacklevel=level)


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, or nothing if the exception refuses notes (a frozen dataclass, odd ``__notes__``)."""
    try:
        exc.add_note(note)
    except Exception:  # the error path must never fail, nor replace the user's exception
        pass


def annotate(exc: BaseException, task: str, iter_idx: int) -> BaseException:
    """Attach the task and iteration to an exception raised by a task, once; never raises."""
    try:
        if getattr(exc, "swp_task", None) is not None:
            return exc
        setattr(exc, "swp_task", task)
        setattr(exc, "swp_iter", iter_idx)
    except Exception:  # exceptions with __slots__, frozen dataclasses, properties that raise
        pass
    add_note(exc, f"swpipeline: raised by task {task!r} at iteration {iter_idx}")
    return exc


def stop_iteration_error(exc: StopIteration, task: str, iter_idx: int) -> RuntimeError:
    """A StopIteration from a task must not look like the end of the data (as PEP 479 does for generators)."""
    error = RuntimeError(f"task {task!r} raised StopIteration at iteration {iter_idx}; a task must not end the "
                         f"data (the engine would stop as if the data iterator were exhausted and drop what "
                         f"is left): raise another exception, or stop the data iterator instead")
    error.__cause__ = exc
    return error
