"""The plan model: what a pipeline runs, written by the user, checked before anything runs.

* ``context.py``: ``IterContext``, the per-iteration scratch space a task is handed (``FreedAttributeError``);
* ``model.py``: ``DeclaredIO``, ``PipelineTask``, ``TaskSchedule``, ``PipelinePlan``;
* ``ordering.py``: pure functions of a plan: the stage rules, each stream's order, the submission
  order of a period, the serial order, the longest stage chain;
* ``rng.py``: ``task_generator``, a task's own random generator per iteration.

May import: the leaves (``errors.py``, ``scoped.py``, ``version.py``) and torch.
"""

from typing import List

__all__: List[str] = []
