"""Helpers for tasks that train: ``WeightVersions``, weight stashing across pipeline stages.

May import: the plan model and the leaves (not the engine: a helper inside the tasks).
"""

from typing import List

__all__: List[str] = []
