"""Checking a plan against what its tasks touch: analysis, inferred dependencies, run-time race checks.

* ``access.py``: what a task reads, writes and deletes (context attributes, and state
  outside the context, found through torch);
* ``naming.py``: module-path names for parameters, gradients and optimizer state;
* ``report.py``: ``analyze`` and ``PlanAnalysis``, the conflicts a plan leaves unordered;
* ``inference.py``: ``infer_deps``, a schedule's dependencies from what its tasks touch;
* ``races.py``: ``RaceChecker``, conflicting context accesses caught while a pipeline runs;
* ``engine_hooks.py``: what a pipeline's constructor takes from the analysis (``check_races=True``'s
  task wrapper, ``free_early=analyze(...)``'s attribute sets), registered with ``engine.hooks``
  when this package is imported, so the engine never imports the analysis.

May import: the engine and everything below it. The public names are exported by the
``swpipeline`` package.
"""

from typing import List

from . import engine_hooks as engine_hooks  # registers the provider with the engine (see engine_hooks.py)

__all__: List[str] = []
