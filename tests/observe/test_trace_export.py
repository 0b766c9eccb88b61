"""Chrome/Perfetto trace JSON (src/swpipeline/observe/trace_export.py), checked against the trace-event format.

The format (the "Trace Event Format" document that chrome://tracing and Perfetto
read): a JSON object whose ``traceEvents`` list holds complete events (``ph: "X"``,
with ``name``, ``ts`` and ``dur`` in microseconds, ``pid`` and ``tid``) and
metadata events (``ph: "M"``: ``process_name``/``thread_name`` with ``args.name``,
``*_sort_index`` with ``args.sort_index``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from engine_helpers import ExecLog, make_plan, sparse_dist_plan, wait_until
from swpipeline import DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule


# Plans here put several thread groups on one stream on purpose (the turns are what is tested).
pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")

Track = Tuple[int, int]


def ns(value: float) -> int:
    """A microsecond value of the trace as whole nanoseconds (the exporter's resolution)."""
    return round(value * 1000)


def validate_trace(doc: Dict[str, Any]) -> Dict[Track, List[Dict[str, Any]]]:
    """Assert ``doc`` is valid trace-event JSON with non-overlapping tracks; returns the spans per track."""
    assert set(doc) >= {"traceEvents"} and isinstance(doc["traceEvents"], list)
    names: Dict[Track, str] = {}
    processes: Dict[int, str] = {}
    spans: Dict[Track, List[Dict[str, Any]]] = defaultdict(list)
    for event in doc["traceEvents"]:
        assert isinstance(event.get("name"), str) and event["name"] and event.get("ph") in ("X", "M"), event
        assert isinstance(event.get("pid"), int) and isinstance(event.get("tid"), int), event
        if event["ph"] == "M":
            key = "sort_index" if event["name"].endswith("_sort_index") else "name"
            assert event["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index")
            assert key in event["args"], event
            if event["name"] == "thread_name":
                names[(event["pid"], event["tid"])] = event["args"]["name"]
            if event["name"] == "process_name":
                processes[event["pid"]] = event["args"]["name"]
            continue
        for field in ("ts", "dur"):
            assert isinstance(event.get(field), (int, float)) and event[field] >= 0, event
        assert isinstance(event.get("cat"), str) and isinstance(event.get("args"), dict)
        spans[(event["pid"], event["tid"])].append(event)
    for track, events in spans.items():
        assert track in names, f"track {track} has no thread_name metadata"
        assert track[0] in processes, f"process {track[0]} has no process_name metadata"
        events.sort(key=lambda e: (e["ts"], e["dur"]))
        for before, after in zip(events, events[1:]):
            assert ns(before["ts"]) + ns(before["dur"]) <= ns(after["ts"]), (
                f"spans overlap on {names[track]}: {before} and {after}")
    return spans


def check_waits_end_before_their_consumer(spans: Dict[Track, List[Dict[str, Any]]]) -> int:
    """Assert every dependency wait ends before the task that waited starts; returns how many waits."""
    count = 0
    for events in spans.values():
        starts = {(e["name"], e["args"]["iteration"]): ns(e["ts"]) for e in events if e["cat"] == "task"}
        for wait in (e for e in events if e["cat"] == "dependency_wait"):
            consumer = starts[(wait["args"]["task"], wait["args"]["iteration"])]
            assert ns(wait["ts"]) + ns(wait["dur"]) <= consumer
            assert wait["name"] == f"wait {wait['args']['dependency']}"
            count += 1
    return count


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_trace_of_a_run_is_valid_trace_event_json(engine: str, tmp_path: Path) -> None:
    plan = sparse_dist_plan(ExecLog())
    pipe = SWPipeline(plan, device="cpu") if engine == "SWPipeline" else DataFlowPipeline(plan, 3, device="cpu")
    path = tmp_path / "run.json"
    pipe.run(range(15), trace=path)
    doc = json.loads(path.read_text())
    spans = validate_trace(doc)
    check_waits_end_before_their_consumer(spans)
    assert doc["otherData"]["engine"] == engine and doc["otherData"]["iterations"] == 15
    meta = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    # run() runs the last stage's group on the caller's thread: its track is named so
    default = "MainThread (default)"
    assert sorted(meta.values()) == sorted(["swp-io", "swp-dist", default, "stream memcpy",
                                            "stream data_dist", "stream default"])
    tasks = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "task"]
    assert len(tasks) == 2 * 15 * 8  # each unit on its thread's track and on its stream's track
    for event in tasks:
        args = event["args"]
        assert set(args) >= {"iteration", "stage", "thread_group", "stream", "wait_ms", "waits_ms"}
        thread = default if args["thread_group"] == "default" else f"swp-{args['thread_group']}"
        assert meta[(event["pid"], event["tid"])] in (thread, f"stream {args['stream']}")
        assert ("period" in args) == (engine == "SWPipeline")
    assert pipe.timeline is not None and doc == pipe.timeline.to_chrome_trace()


def test_trace_shows_a_wait_on_the_waiting_thread() -> None:
    holder: List[SWPipeline] = []

    def producer(ctx: IterContext) -> None:
        if ctx.iter_idx == 0:  # hold on until the consumer blocks on us: a certain wait
            assert wait_until(lambda: holder[0]._run.board.waiters[0] > 0)

    a, b = PipelineTask("A", producer), PipelineTask("B", lambda ctx: None)
    pipe = SWPipeline(PipelinePlan({a: TaskSchedule(stage=0, thread_group="ta", stream="sa"),
                                    b: TaskSchedule(stage=1, thread_group="tb", stream="sb")},
                                   intra_iter_deps=[(b, a)]), device="cpu")
    holder.append(pipe)
    pipe.run(range(4), trace=True)
    assert pipe.timeline is not None
    doc = pipe.timeline.to_chrome_trace()
    spans = validate_trace(doc)
    assert check_waits_end_before_their_consumer(spans) >= 1
    waits = [e for e in doc["traceEvents"] if e.get("cat") == "dependency_wait"]
    thread_names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
                    if e["name"] == "thread_name" and e["pid"] == 1}
    first = waits[0]
    # tb, the last stage's group, runs on the caller's thread in run()
    assert (first["name"], thread_names[first["tid"]], first["args"]["dependency_iteration"]) == \
        ("wait A", "MainThread (tb)", 0)
    b0 = next(e for e in doc["traceEvents"] if e["name"] == "B" and e["pid"] == 1 and e["args"]["iteration"] == 0)
    assert b0["args"]["waits_ms"].keys() == {"A(i0)"} and b0["args"]["wait_ms"] >= 0


def test_shared_stream_track_has_no_overlap() -> None:
    spec = {"A": (0, "shared", "t1"), "B": (0, "shared", "t2")}
    pipe = DataFlowPipeline(make_plan(ExecLog(), spec), max_depth=4, device="cpu")
    pipe.run(range(30), trace=True)
    assert pipe.timeline is not None
    spans = validate_trace(pipe.timeline.to_chrome_trace())
    assert len(spans[(2, 1)]) == 60  # both tasks on the one stream track
