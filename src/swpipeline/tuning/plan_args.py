"""The checks of ``autoplan``'s arguments, and the search space they define."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from .costs import TaskCosts
from .overheads import EngineOverheads
from ..plan.model import NamedOnlyTask, PipelinePlan, PipelineTask, TaskSchedule
from .plan_search import Space
from .plan_space import TaskGraph

__all__: List[str] = []


@dataclass(frozen=True)
class SearchArgs:
    space: Space
    costs: TaskCosts
    overheads: EngineOverheads


def _positive_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"autoplan: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"autoplan: {name} must be >= {minimum}, got {value}")
    return value


def _task_objects(tasks: object) -> Tuple[PipelineTask, ...]:
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, (list, tuple)) or not tasks:
        raise TypeError(f"autoplan: tasks must be a non-empty list of PipelineTask objects or names, got {tasks!r}")
    out: List[PipelineTask] = []
    for task in tasks:
        if isinstance(task, str):
            out.append(NamedOnlyTask(task))
        elif isinstance(task, PipelineTask):
            out.append(task)
        else:
            raise TypeError(f"autoplan: tasks must be PipelineTask objects or names, got {type(task).__name__} "
                            f"{task!r}")
    return tuple(out)


def _names(what: str, values: Optional[Sequence[Any]], allow_none: bool) -> Optional[Tuple[Any, ...]]:
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)) or not values:
        raise TypeError(f"autoplan: {what} must be None or a non-empty list of names, got {values!r}")
    for value in values:
        if value is None and allow_none:
            continue
        if not isinstance(value, str) or not value:
            raise TypeError(f"autoplan: {what} must hold non-empty names{' or None' if allow_none else ''}, "
                            f"got {value!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"autoplan: {what} lists a name twice: {list(values)}; list each once")
    return tuple(values)


def _pins(pinned: object, names: Tuple[str, ...], allowed: Optional[Sequence[str]]) -> Tuple[Optional[str], ...]:
    """Per task, the thread group ``pinned`` keeps it on (None: free)."""
    if not isinstance(pinned, Mapping):
        raise TypeError(f"autoplan: pinned must be a dict of task name -> thread group, got {type(pinned).__name__}")
    unknown = sorted(set(pinned) - set(names))
    if unknown:
        raise ValueError(f"autoplan: pinned names unknown task(s) {unknown} (tasks: {list(names)})")
    for task, group in pinned.items():
        if not isinstance(group, str) or not group:
            raise TypeError(f"autoplan: pinned[{task!r}] must be a thread group name, got {group!r}")
        if allowed is not None and group not in allowed:
            raise ValueError(f"autoplan: pinned[{task!r}] = {group!r} is not one of thread_groups {list(allowed)}; "
                             f"add it there")
    return tuple(pinned.get(n) for n in names)


def check_search_args(tasks: object, intra: Any, inter: Any, costs: object, max_in_flight: object,
                      thread_groups: Optional[Sequence[str]], streams: Optional[Sequence[Optional[str]]],
                      engine: object, baseline: object, num_iterations: object, tolerance: object,
                      overheads: object, globally_ordered: Iterable[str], exhaustive_limit: object,
                      budget: object, pinned: Mapping[str, str], caller_thread_group: Optional[str],
                      cores: Optional[int]) -> SearchArgs:
    """Check ``search_plan``'s arguments; the space they define, the costs and the overheads.

    Raises:
        TypeError, ValueError: an invalid argument, named in the message.
    """
    objects = _task_objects(tasks)
    probe = PipelinePlan({t: TaskSchedule() for t in objects}, intra, inter)  # names, references, cycles
    names = tuple(probe.task_names)
    index = {name: k for k, name in enumerate(names)}
    graph = TaskGraph(names, tuple((index[t], index[d]) for t in names for d in probe.intra[t]),
                      tuple((index[t], index[d], back) for t in names for d, back in probe.inter[t]))
    task_costs = TaskCosts.coerce(costs)
    task_costs.check_covers(names, "autoplan")
    live = _positive_int("max_in_flight", max_in_flight)
    if engine not in ("clocked", "dataflow"):
        raise ValueError(f"autoplan: engine must be 'clocked' or 'dataflow', got {engine!r}")
    _positive_int("num_iterations", num_iterations)
    _positive_int("exhaustive_limit", exhaustive_limit, 0)
    _positive_int("budget", budget)
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        raise ValueError(f"autoplan: tolerance must be a number in [0, 1), got {tolerance!r}")
    if overheads is None:
        overheads = EngineOverheads()
    elif not isinstance(overheads, EngineOverheads):
        raise TypeError(f"autoplan: overheads must be an EngineOverheads or None, got {type(overheads).__name__}")
    pins = _pins(pinned, names, thread_groups)
    groups = _names("thread_groups", thread_groups, False) or tuple(dict.fromkeys(
        [*(p for p in pins if p is not None), "default", *(f"g{k}" for k in range(1, len(names)))]))
    stream_names = _names("streams", streams, True)
    ordered: Set[str] = set(globally_ordered)
    unknown = sorted(ordered - set(names))
    if unknown:
        raise ValueError(f"autoplan: globally_ordered names unknown task(s) {unknown} (tasks: {list(names)})")
    if baseline is not None:
        if not isinstance(baseline, PipelinePlan):
            raise TypeError(f"autoplan: baseline must be a PipelinePlan or None, got {type(baseline).__name__}")
        if set(baseline.task_names) != set(names):
            raise ValueError(f"autoplan: the baseline plan's tasks {sorted(baseline.task_names)} differ from "
                             f"tasks {sorted(names)}; compare plans of the same tasks")
        ordered |= {n for n in names if baseline.schedules[n].globally_ordered}
    if caller_thread_group is not None and not isinstance(caller_thread_group, str):
        raise ValueError(f"autoplan: caller_thread_group must be a thread group name, \"auto\" or None; got "
                         f"{caller_thread_group!r}")
    if cores is not None:
        _positive_int("cores", cores)
    space = Space(graph, objects, live, tuple(groups), stream_names, task_costs.has_device_times,
                  tuple(n in ordered for n in names), pins, caller_thread_group, cores)
    return SearchArgs(space, task_costs, overheads)
