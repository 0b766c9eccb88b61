"""What the analysis hands a pipeline for ``check_races=True`` and ``free_early=analyze(plan, batch)``.

The engine never imports the analysis: this module registers ``engine_hooks`` with the
engine's ``engine.hooks`` when it is imported, and the pipeline's constructor calls it
there and keeps what it returns, which the engine takes as plain values,

* a *task wrapper* (``shortcut.TaskWrapper``): ``RaceChecker.wrap``, which the engine
  applies to each function it launches without knowing what it does;
* per task, the context attributes ``free_early`` frees after it (``lifetime.attribute_uses``,
  given a ``PlanAnalysis`` as the ``ObservedUses`` it found).
"""

from __future__ import annotations

from typing import List

from ..engine import hooks
from ..engine.hooks import EngineHooks
from ..engine.lifetime import ObservedUses, attribute_uses
from ..plan.model import PipelinePlan
from .checker import RaceChecker
from .report import PlanAnalysis

__all__: List[str] = []


def engine_hooks(plan: PipelinePlan, *, check_races: bool, free_early: object, keep: object) -> EngineHooks:
    """The task wrapper and the attribute sets for a pipeline's ``check_races=``, ``free_early=`` and ``keep=``.

    Raises:
        TypeError, ValueError: ``free_early`` or ``keep`` is invalid (``lifetime.attribute_uses``).
    """
    checker = RaceChecker(plan) if check_races else None
    observed = observed_uses(free_early) if isinstance(free_early, PlanAnalysis) else free_early
    return EngineHooks(None if checker is None else checker.wrap, checker, attribute_uses(plan, observed, keep))


def observed_uses(analysis: PlanAnalysis) -> ObservedUses:
    """Per task of the analysed plan, the context attributes it reads or writes (``ctx.x`` as ``x``)."""
    return ObservedUses(analysis.plan.task_names,
                        {task: frozenset(_context_attribute(n) for n in analysis.reads[task] | analysis.writes[task]
                                         if n.startswith("ctx."))
                         for task in analysis.plan.task_names})


def _context_attribute(name: str) -> str:
    """``ctx.x`` (or ``ctx.batch['img']``, a write through it) -> ``x`` (``batch``)."""
    return name[4:].split("[", 1)[0].split(".", 1)[0]


hooks.provide(engine_hooks)
