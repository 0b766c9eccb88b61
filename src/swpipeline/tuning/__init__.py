"""The tuning: predict a plan's throughput from measured costs, and search for a faster plan.

* ``costs.py``: ``TaskCost``/``TaskCosts``, from a traced run, the profiler or by hand;
* ``overheads.py``, ``calibrate.py``: the engine's own costs (``EngineOverheads``);
* ``simulator.py`` (``simulate``), with ``sim_model.py`` (the plan as the engine runs it),
  ``sim_core.py`` (the engine's interpreter of units, ``engine/interpreter.py``, with times:
  the threads and the caller), ``sim_handout.py`` (the engine's hand-out on paper, timed),
  ``sim_path.py`` (the critical path) and ``sim_result.py`` (``SimResult``);
* ``autoplan.py`` (``autoplan``, ``search_plan``), with ``plan_space.py`` (the candidate
  plans), ``plan_search.py`` (exhaustive and local search), ``plan_args.py``,
  ``plan_report.py`` and ``kept_orders.py`` (the orders a plan gets from its placement
  alone, which a suggestion keeps unless the user drops them by name);
* ``staleness.py``: the plan that lets a forward overlap the optimizer step before it,
  made exact by ``WeightVersions`` (the staleness trade-off);
* ``trace_read.py``: the traces ``swpipeline plan TRACE.json`` reads (the command is in ``cli/``).

The public names are exported by the ``swpipeline`` package.

May import: the analysis, the engine and everything below it.
"""

from typing import List

__all__: List[str] = []
