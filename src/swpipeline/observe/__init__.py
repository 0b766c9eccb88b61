"""What a run leaves to look at: its records, timeline, statistics, trace file, charts and tables.

* ``records.py``: the plain records of a traced run; ``timeline.py``: the ``Recorder`` the engine
  fills and the ``Timeline`` made from it; ``stats.py``: ``RunStats``; ``trace_export.py``: the
  Chrome/Perfetto trace; ``charts.py``: pictures; ``tables.py``: printed tables;
  ``progress_line.py``: ``run(verbose=True)``'s progress.

May import: the plan model and the leaves. The engine fills it; it never imports the engine.
"""

from typing import List

__all__: List[str] = []
