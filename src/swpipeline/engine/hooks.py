"""What the tools above the engine lend it, without the engine importing them.

Two constructor arguments need the analysis package: ``check_races=True`` (a race check
wrapped around each task's function) and ``free_early=analyze(plan, batch)`` (the context
attributes each task was seen to use). The engine asks this module for them; the
analysis package registers its provider when it is imported (``import swpipeline``
imports it), so the engine depends on this small interface only, and takes plain
values: a task wrapper it applies without knowing what it does, and per task the
attributes to free after it.
"""

from __future__ import annotations

from typing import Any, Callable, FrozenSet, List, NamedTuple, Optional

from ..plan.model import PipelinePlan
from ..shortcut.replay import TaskWrapper
from .lifetime import attribute_uses

__all__: List[str] = []


class EngineHooks(NamedTuple):
    """What a pipeline takes from the tools (see the module docstring)."""

    task_wrapper: Optional[TaskWrapper]  # None: launch each function as it is
    race_checker: Any  # the race checker whose wrap the task wrapper is (check_races=True), for its warnings
    free_uses: Optional[List[FrozenSet[str]]]  # per task (plan order), the attributes freed after it; None: off


Provider = Callable[..., EngineHooks]  # (plan, *, check_races, free_early, keep) -> EngineHooks
_provider: Optional[Provider] = None


def provide(provider: Provider) -> None:
    """Register the tools' provider (the analysis package does, when imported)."""
    global _provider
    _provider = provider


def hooks_for(plan: PipelinePlan, *, check_races: bool, free_early: object, keep: object) -> EngineHooks:
    """The task wrapper and the attribute sets for a pipeline's ``check_races=``, ``free_early=`` and ``keep=``.

    Raises:
        TypeError, ValueError: ``free_early`` or ``keep`` is invalid.
        RuntimeError: a check needs the analysis package and it was never imported.
    """
    if _provider is not None:
        return _provider(plan, check_races=check_races, free_early=free_early, keep=keep)
    if check_races:  # pragma: no cover - import swpipeline always loads the analysis
        raise RuntimeError("check_races=True needs swpipeline.analysis, which was never imported; import swpipeline")
    return EngineHooks(None, None, attribute_uses(plan, free_early, keep))
