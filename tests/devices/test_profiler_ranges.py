"""``SWP/{Task}/iter{N}`` ranges in the torch profiler, on the worker thread that ran the task.

torch.profiler records only the thread that started it unless it is told to record
every thread (torch >= 2.6: ``experimental_config=_ExperimentalConfig(profile_all_threads=True)``).
Then ``torch.autograd._profiler_enabled()`` is False on every thread, so the engine
also reads the flag every Python-started profiler sets (``annotations.profiler_active``).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Dict

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from engine_helpers import ExecLog, sparse_dist_plan
from swpipeline import DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
from swpipeline.devices.annotations import profiler_active


# Plans here put several thread groups on one stream on purpose (the turns are what is tested).
pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")

_ExperimentalConfig = torch._C._profiler._ExperimentalConfig


def all_threads_config() -> object:
    try:
        return _ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        pytest.skip("this torch has no profile_all_threads")


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_ranges_appear_on_the_worker_thread_of_their_task(engine: str, tmp_path: Path) -> None:
    native_ids: Dict[str, int] = {}

    def note_thread(group: str) -> None:
        native_ids[group] = threading.get_native_id()

    plan = sparse_dist_plan(ExecLog())
    pipe = (SWPipeline(plan, device="cpu", worker_init=note_thread) if engine == "SWPipeline"
            else DataFlowPipeline(plan, 3, device="cpu", worker_init=note_thread))
    with profile(activities=[ProfilerActivity.CPU], experimental_config=all_threads_config()) as prof:
        assert profiler_active() and not torch.autograd._profiler_enabled()  # why the flag is needed
        pipe.run(range(4))
    assert not profiler_active()
    path = tmp_path / "torch_trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    ranges = {e["name"]: e["tid"] for e in events if e.get("ph") == "X" and e["name"].startswith("SWP/")}
    expected = {f"SWP/{t}/iter{i}": native_ids[plan.schedules[t].thread_group]
                for t in plan.task_names for i in range(4)}
    assert ranges == expected


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OS thread names are set on Linux only")
def test_workers_name_their_os_threads() -> None:
    # Profilers (torch's trace: "thread 1234 (swp-io)"), top -H and py-spy show the OS thread name.
    seen: Dict[str, str] = {}

    def note(ctx: IterContext) -> None:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as comm:
            seen[threading.current_thread().name] = comm.read().strip()

    a, b = PipelineTask("A", note), PipelineTask("B", note)
    SWPipeline(PipelinePlan({a: TaskSchedule(thread_group="io"), b: TaskSchedule(thread_group="a-very-long-group")}),
               device="cpu", caller_thread_group=None).run(range(2))  # every group on a worker thread
    assert seen == {"swp-io": "swp-io", "swp-a-very-long-group": "swp-a-very-long"}  # 15 bytes at most
