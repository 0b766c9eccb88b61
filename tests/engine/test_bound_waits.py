"""What a unit waits for: a dependency its own thread group's order meets already is not waited on again.

Both engines run a thread group's units on one thread in the schedule's order, which puts
every producer unit before its consumers; so only a producer in another group needs the CPU
wait, and only one on another stream its device event.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from swpipeline import IterContext, PipelinePlan, PipelineTask, SimulatedDevice, TaskSchedule
from swpipeline.devices.device import resolve_device
from swpipeline.engine.runtime import bind_run, build_tasks


def nothing(ctx: IterContext) -> None:
    pass


Waits = Tuple[List[Tuple[str, bool]], List[Tuple[str, bool, int]]]


def waits(device: Any, streams: Dict[str, Any]) -> Dict[str, Waits]:
    """Per task: (its intra waits, its inter waits), each dependency named, with whether it waits on an event."""
    a, b, c = (PipelineTask(n, nothing) for n in "ABC")
    plan = PipelinePlan({a: TaskSchedule(stage=0, thread_group="g", stream=streams["A"]),
                         b: TaskSchedule(stage=0, thread_group="g", stream=streams["B"]),
                         c: TaskSchedule(stage=1, thread_group="h", stream=streams["C"])},
                        intra_iter_deps=[(b, a), (c, b)], inter_iter_deps=[(a, b, 1), (b, c, 1)])
    bound = bind_run(build_tasks(plan, device), device, 4, device.default_stream())
    names = [t.name for t in bound]
    return {t.name: ([(names[d], e is not None) for d, e in t.wait_intra],
                     [(names[d], e is not None, k) for d, e, k in t.wait_inter]) for t in bound}


def test_on_the_cpu_only_producers_of_other_groups_are_waited_for() -> None:
    found = waits(resolve_device("cpu"), {"A": None, "B": None, "C": None})
    assert found == {"A": ([], []), "B": ([], [("C", False, 1)]), "C": ([("B", False)], [])}


def test_a_producer_of_the_same_group_on_another_stream_leaves_its_event_to_wait_on() -> None:
    found = waits(SimulatedDevice(), {"A": "s1", "B": "s2", "C": "s2"})
    assert found == {"A": ([], [("B", True, 1)]), "B": ([("A", True)], [("C", False, 1)]), "C": ([("B", False)], [])}
