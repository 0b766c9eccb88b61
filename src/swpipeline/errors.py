"""The exceptions callers may want to catch specifically.

Plan mistakes are ``TypeError``/``ValueError``. An exception raised by a task
function reaches the caller as itself (same type, same object) with a note naming
the task and the iteration, and the attributes ``swp_task`` and ``swp_iter``.
"""

from __future__ import annotations

from typing import List, Optional

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

    def __init__(self, iter_idx: int, unfinished: List[str], timeout: float, waits: List[str]) -> None:
        blocked = "".join(f"; {w}" for w in waits)
        super().__init__(
            f"progress() waited {timeout:g} s for iteration {iter_idx} to complete; tasks not yet done: "
            f"{unfinished}{blocked}; a task is slow or blocked (raise progress_timeout if it is just slow)"
        )
        self.iter_idx = iter_idx
        self.unfinished = unfinished


class SequencerTimeoutError(PipelineTimeoutError):
    """A globally ordered task waited longer than ``signal_timeout`` for its turn."""

    def __init__(self, task: str, iter_idx: int, seq: int, next_seq: int, timeout: float,
                 holder: Optional[str]) -> None:
        waiting_for = f" (the turn belongs to {holder!r})" if holder else ""
        super().__init__(
            f"globally ordered task {task!r} (iteration {iter_idx}) waited {timeout:g} s for its turn "
            f"#{seq}; the sequencer is still at #{next_seq}{waiting_for}"
        )
        self.task = task
        self.iter_idx = iter_idx


class PipelineAborted(RuntimeError):
    """Internal: raised inside worker threads to unwind once the pipeline has failed."""


def annotate(exc: BaseException, task: str, iter_idx: int) -> BaseException:
    """Attach the task and iteration to an exception raised by a task, once."""
    if getattr(exc, "swp_task", None) is None:
        try:
            setattr(exc, "swp_task", task)
            setattr(exc, "swp_iter", iter_idx)
        except AttributeError:  # exotic exception types with __slots__
            pass
        exc.add_note(f"swpipeline: raised by task {task!r} at iteration {iter_idx}")
    return exc
