"""Helpers for tasks that train: ``WeightVersions``, weight stashing across pipeline stages.

* ``weights.py``: ``WeightVersions`` (runs, forwards, steps, the versions) and ``VersionStats``;
* ``tables.py``: the parameter tables that show a thread its iteration's version;
* ``live.py``: the live parameters, their layout and copies, and what a step refuses.

May import: the plan model and the leaves (not the engine: a helper inside the tasks).
"""

from typing import List

__all__: List[str] = []
