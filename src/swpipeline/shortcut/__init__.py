"""Task shortcut: run a task once, then replay what it left on the context.

* ``recording.py``: the recording view of a context (also used by the analysis);
* ``snapshot.py``: copies of values a replay can reproduce faithfully;
* ``replay.py``: caching, replay, the gradient bridge, and a pipeline's shortcut settings.

May import: the plan model and the leaves.
"""

from typing import List

__all__: List[str] = []
