"""``simulate``: predict a plan's run from its tasks' costs, without running it.

The simulator runs the engine's own schedule (the one a pipeline builds, reused, not
re-derived: see ``sim_model``) on paper with times (``sim_core``): one FIFO worker per
thread group fed in the engine's submission order, every dependency and turn, streams
that never overlap, the period clock (``clocked``) or the ``max_depth`` bound
(``dataflow``), the calling thread's own work and the hand-off latency between threads
(``EngineOverheads``). With integer costs and ``EngineOverheads.zero()`` whole
timelines are exact numbers; with measured costs and overheads it predicts ``run()``'s
wall time.

A clock-driven example, tasks A (stage 0, thread a) -> B (stage 1, thread b), costing
2 and 3, no overheads, 4 batches::

    time     0     2     4  5     7  8    10 11       14
    a        [A0  )[A1  )   [A2  )   [A3  )               A(i+2) enters when i retires (depth 2)
    b              [B0      )[B1      )[B2      )[B3      )   B sets the pace: 3 per iteration
"""

from __future__ import annotations

import functools
from typing import List, Mapping, Optional, Sequence, Tuple, Union

from .costs import TaskCosts
from .overheads import EngineOverheads
from ..plan.model import PipelinePlan
from .sim_core import Simulation
from .sim_model import CompiledPlan, caller_group_allowed, compile_plan, group_index, run_caller_group
from .sim_path import PathStep, critical_path
from .sim_result import SimArrays, SimResult, busy_shares, live_contexts

__all__: List[str] = []

ENGINES = ("clocked", "dataflow", "serial")
CostsLike = Union[TaskCosts, Mapping[str, object]]


def simulate(plan: PipelinePlan, costs: CostsLike, num_iterations: int = 200, engine: str = "clocked",
             max_depth: Optional[int] = None, *, jitter: bool = True, overheads: Optional[EngineOverheads] = None,
             data_seconds: float = 0.0, caller_thread_group: Optional[str] = "auto",
             cores: Optional[int] = None) -> SimResult:
    """Predict what running ``plan`` on ``num_iterations`` batches takes, from what its tasks cost.

    Args:
        plan: the PipelinePlan (its stages must follow the stage rules).
        costs: a ``TaskCosts``, or a dict of task name -> seconds (or ``TaskCost``), one per task.
        num_iterations: how many batches the simulated ``run()`` gets.
        engine: ``"clocked"`` (``SWPipeline``), ``"dataflow"`` (``DataFlowPipeline``) or ``"serial"``
            (``run_serial``: every task in serial order on the calling thread).
        max_depth: the data-flow engine's ``max_depth`` (default: the plan's depth); only for it.
        jitter: use the costs' per-iteration samples where they have some (False: typical costs only).
        overheads: the engine's own costs (default: ``EngineOverheads()``, measured on a 2-core machine;
            ``EngineOverheads.zero()`` for none, ``calibrate()`` to measure this machine's).
        data_seconds: what the data iterator takes per batch, on the calling thread.
        caller_thread_group: as the engines' ``caller_thread_group`` in ``run()``: that group's tasks run
            on the calling thread, at the start of each ``progress()``. The default ``"auto"`` is what
            ``run()`` does: the group of the plan's last stage (for the data-flow engine only with
            ``max_depth`` >= the depth); None: every group on a worker thread.
        cores: at most this many task functions run at once (the cores, or the GIL, the process
            really has for them); a task that finds none free waits for the first to be freed. Default
            None: every thread runs when it can, as if it had a core of its own. Every task counts as
            using a core for its whole duration, sleeps and waits included.

    Returns:
        SimResult: wall time, throughput, busy shares and bubbles per thread and stream, the critical
        path, live contexts; ``result.units()`` and ``result.timeline()`` give the whole schedule.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a missing or unknown task in ``costs``, a plan that breaks a stage rule, an unknown
            engine, or a ``max_depth`` the data-flow engine would refuse for this plan.
    """
    if not isinstance(plan, PipelinePlan):
        raise TypeError(f"simulate: plan must be a PipelinePlan, got {type(plan).__name__}")
    task_costs = TaskCosts.coerce(costs)
    task_costs.check_covers(plan.task_names, "simulate")
    _check_count("num_iterations", num_iterations)
    if engine not in ENGINES:
        raise ValueError(f"simulate: engine must be one of {list(ENGINES)}, got {engine!r}")
    if not isinstance(jitter, bool):
        raise TypeError(f"simulate: jitter must be a bool, got {jitter!r}")
    if overheads is None:
        overheads = EngineOverheads()
    elif not isinstance(overheads, EngineOverheads):
        raise TypeError(f"simulate: overheads must be an EngineOverheads or None, got {type(overheads).__name__}")
    if isinstance(data_seconds, bool) or not isinstance(data_seconds, (int, float)) or not 0 <= data_seconds < 1e9:
        raise ValueError(f"simulate: data_seconds must be a number of seconds >= 0, got {data_seconds!r}")
    compiled = compile_plan(plan)
    live = _max_live(compiled, engine, max_depth)
    if caller_thread_group not in (None, "auto") and not caller_group_allowed(engine, live, plan.depth):
        why = ("run_serial runs every task on the calling thread" if engine == "serial" else
               f"the data-flow engine runs a group on the calling thread only with max_depth >= the plan's "
               f"depth ({plan.depth}), got {live}")
        raise ValueError(f"simulate: caller_thread_group={caller_thread_group!r} with engine={engine!r}: {why}")
    caller_index = group_index(compiled, run_caller_group(plan, engine, live, caller_thread_group))
    if cores is not None:
        _check_count("cores", cores)
    threads = [task_costs[name].thread_times(num_iterations, jitter) for name in compiled.names]
    devices = [task_costs[name].device_times(num_iterations, jitter) for name in compiled.names]
    if engine == "serial":
        return _serial(compiled, threads, num_iterations, overheads, float(data_seconds))
    sim = Simulation(compiled, threads, devices, num_iterations, engine, live, overheads, float(data_seconds),
                     caller_index)
    sim.run(cores)
    return _result(sim, live)


MAX_ITERATIONS = 10_000_000


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"simulate: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"simulate: {name} must be >= 1, got {value}")
    if name == "num_iterations" and value > MAX_ITERATIONS:
        raise ValueError(f"simulate: num_iterations={value} is more than {MAX_ITERATIONS:,} (the simulation keeps "
                         f"every unit's times: about 100 bytes per task and iteration); a steady pipeline's pace "
                         f"shows in a few hundred iterations")


def _max_live(compiled: CompiledPlan, engine: str, max_depth: Optional[int]) -> int:
    """The most iterations alive: the depth (clocked), ``max_depth`` (dataflow, checked as the engine does), 1."""
    if engine != "dataflow":
        if max_depth is not None:
            raise ValueError(f"simulate: max_depth is the data-flow engine's bound (engine='dataflow'); the "
                             f"{engine} engine keeps {'the plan depth' if engine == 'clocked' else 'one'} "
                             f"iteration(s) alive; drop max_depth={max_depth!r}")
        return compiled.depth if engine == "clocked" else 1
    if max_depth is None:
        return compiled.depth
    _check_count("max_depth", max_depth)
    if max_depth < compiled.depth:  # the engine's own check, with its own message
        from ..engine.dataflow import DataFlowPipeline

        DataFlowPipeline(compiled.plan, max_depth=max_depth, device="cpu")
    return max_depth


def _arrays(compiled: CompiledPlan, picked: Sequence[float], start: Sequence[float], end: Sequence[float],
            device: Optional[Tuple[Sequence[float], Sequence[float], Tuple[bool, ...]]] = None) -> SimArrays:
    plan = compiled.plan
    dev_start, dev_end, dev_tasks = device if device is not None else ((), (), ())
    return SimArrays(tasks=compiled.names, stages=tuple(plan.stage(n) for n in compiled.names),
                     groups=tuple(plan.schedules[n].thread_group for n in compiled.names),
                     streams=tuple(compiled.streams[s] for s in compiled.stream_of), picked=picked, start=start,
                     end=end, device_start=dev_start, device_end=dev_end, device_tasks=dev_tasks,
                     intra=compiled.intra, inter=compiled.inter)


def _steady(retired: Sequence[float], skip: int, seconds: float) -> float:
    """Seconds between retirements after the first ``skip`` (the whole run's average if too short)."""
    first = min(skip, len(retired) - 2)
    if first < 0:
        return seconds / max(1, len(retired))
    return (retired[-1] - retired[first]) / (len(retired) - 1 - first)


def _result(sim: Simulation, live: int) -> SimResult:
    compiled = sim.c
    device = None
    if sim.device:
        device = (sim.dev_start, sim.dev_end, tuple(d is not None for d in sim.device_costs))
    arrays = _arrays(compiled, sim.picked, sim.start, sim.end, device)
    total = sim.total
    thread_busy, stream_busy = busy_shares(arrays, total)
    peak, mean = live_contexts(sim.created_at, sim.retired_at, total)
    return SimResult(engine=sim.engine, num_iterations=sim.N, depth=compiled.depth, max_depth=live, seconds=total,
                     steady_seconds_per_iteration=_steady(sim.retired_at, live, total),
                     thread_busy=thread_busy, stream_busy=stream_busy, peak_live_contexts=peak,
                     mean_live_contexts=mean, retire_times=tuple(sim.retired_at), arrays=arrays,
                     path_source=functools.partial(critical_path, sim))


def _serial(compiled: CompiledPlan, threads: Sequence[Sequence[float]], num_iterations: int,
            overheads: EngineOverheads, data_seconds: float) -> SimResult:
    """``run_serial``: each batch fetched, then its tasks in serial order, on the calling thread."""
    n = compiled.n
    start, end = [0.0] * (n * num_iterations), [0.0] * (n * num_iterations)
    created, retired, path = [], [], []
    t = 0.0
    for it in range(num_iterations):
        if data_seconds > 0:
            path.append(PathStep("caller", "fetch", it, t, t + data_seconds))
        t += data_seconds
        created.append(t)
        for task in compiled.serial_order:
            key = it * n + task
            t += overheads.serial_unit
            start[key], t = t, t + threads[task][it]
            end[key] = t
            path.append(PathStep("task", compiled.names[task], it, start[key], t))
        retired.append(t)
    arrays = _arrays(compiled, start, start, end)
    thread_busy, stream_busy = busy_shares(arrays, t)
    steps = tuple(path)
    peak, mean = live_contexts(created, retired, t)
    return SimResult(engine="serial", num_iterations=num_iterations, depth=compiled.depth, max_depth=1, seconds=t,
                     steady_seconds_per_iteration=_steady(retired, 1, t), thread_busy=thread_busy,
                     stream_busy=stream_busy, path_source=lambda: steps, peak_live_contexts=peak,
                     mean_live_contexts=mean, retire_times=tuple(retired), arrays=arrays)
