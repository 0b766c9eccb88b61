"""Running a plan: the schedule, the release rules, the threads, and the two pipelines.

* ``schedule.py``: the schedule as data, each thread group's order (``walk``), ``check`` on paper;
* ``release.py``: when a unit is handed out: the period clock (``ClockRule``) and the data-flow
  engine's rule (``DataFlowRule``); ``handout.py``: applying a rule for one run;
* ``signals.py``: completion signals and turns; ``runtime.py``: each task resolved per pipeline,
  bound per run; ``executor.py``: one unit, the two-phase protocol; ``worker.py``: the threads;
* ``run.py``: one fill's state machine; ``shutdown.py``: runs nobody stopped; ``driving.py``: who may
  drive a pipeline; ``modes.py``: the caller's torch modes; ``lifetime.py``: memory across streams;
* ``pipeline.py``: what both engines share; ``clocked.py``: ``SWPipeline``; ``dataflow.py``:
  ``DataFlowPipeline``; ``serial.py``, ``tracing.py``: parts of a pipeline; ``hooks.py``: what the
  tools lend the engine without the engine importing them.

May import: the plan model, devices, observers, shortcut and the leaves. Never the analysis,
the planning tools, the applications or the command line.
"""

from typing import List

__all__: List[str] = []
