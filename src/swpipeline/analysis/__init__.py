"""Checking a plan against what its tasks touch: analysis, inferred dependencies, run-time race checks.

* ``access.py``: what a task reads, writes and deletes (context attributes, and state
  outside the context, found through torch);
* ``naming.py``: module-path names for parameters, gradients and optimizer state;
* ``report.py``: ``analyze`` and ``PlanAnalysis``, the conflicts a plan leaves unordered;
* ``inference.py``: ``infer_deps``, a schedule's dependencies from what its tasks touch;
* ``races.py``: ``RaceChecker``, conflicting context accesses caught while a pipeline runs;
* ``engine_hooks.py``: what a pipeline's constructor takes from the analysis (``check_races=True``'s
  task wrapper, ``free_early=analyze(...)``'s attribute sets), which ``shortcut.py`` and
  ``lifetime.py`` then use without importing the analysis.

The public names are exported by the ``swpipeline`` package.
"""

from typing import List

__all__: List[str] = []
