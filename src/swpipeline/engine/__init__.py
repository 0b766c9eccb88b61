"""Running a plan: the schedule and its one interpreter, the release rules, a run and its parts, the two pipelines.

* the schedule, as data and on paper: ``schedule.py`` (slots, each thread group's order ``walk``,
  the turns' order ``turn_units``), ``interpreter.py`` (**the one interpreter of the schedule's
  units**: when a unit may run, turns, retirement; over one schedule or several with cross waits),
  ``paper.py`` (runs on paper: the deadlock check ``check``/``check_together``, the step boundary
  ``boundary``, the engine's hand-out ``PaperEngine``), ``stuck.py`` (a stuck paper run in words);
* ``release.py``: when a unit is handed out: the period clock (``ClockRule``) and the data-flow
  engine's rule (``DataFlowRule``);
* a run: ``assemble.py`` (**where a run is assembled**, from its parts), ``run.py`` (``Run``: the
  parts together: start, retire, the step boundary, stop), ``run_state.py`` (its life cycle and
  first failure), ``feed.py`` (the data iterator and the contexts in flight), ``crew.py`` (the
  workers), ``handout.py`` (the release rule applied to a run); ``signals.py`` (completion signals
  and turns), ``runtime.py`` (each task resolved per pipeline, bound per run), ``executor.py`` (one
  unit, the two-phase protocol), ``worker.py`` (the threads), ``modes.py`` (the caller's torch
  modes), ``lifetime.py`` (memory across streams);
* a pipeline: ``parts.py`` (what a pipeline is made of, and the public methods of its parts),
  ``pipeline.py`` (the life cycle both engines share), ``clocked.py`` (``SWPipeline``),
  ``dataflow.py`` (``DataFlowPipeline``); ``serial.py``, ``tracing.py`` (two of its parts);
  ``driving.py`` (who may drive a pipeline), ``shutdown.py`` (runs nobody stopped), ``hooks.py``
  (what the tools lend the engine without the engine importing them).

May import: the plan model, devices, observers, shortcut and the leaves. Never the analysis,
the tuning tools, the applications or the command line.
"""

from typing import List

__all__: List[str] = []
