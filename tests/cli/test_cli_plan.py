"""``swpipeline plan TRACE.json``: reading a trace back, the report, the suggestion, errors."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from swpipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
from swpipeline.cli import main
from swpipeline.tuning.overheads import EngineOverheads
from swpipeline.tuning.simulator import simulate
from swpipeline.tuning.trace_read import plan_from_timeline, read_trace

PLAN = PipelinePlan({"Load": TaskSchedule(0, "io", "io"), "Prep": TaskSchedule(1, "prep", "prep"),
                     "Fwd": TaskSchedule(2), "Bwd": TaskSchedule(2)},
                    [("Prep", "Load"), ("Fwd", "Prep"), ("Bwd", "Fwd")], [("Fwd", "Bwd")])
ONE_THREAD = PipelinePlan({n: TaskSchedule(s.stage, s.stream, "default") for n, s in PLAN.schedules.items()},
                          [("Prep", "Load"), ("Fwd", "Prep"), ("Bwd", "Fwd")], [("Fwd", "Bwd")])
COSTS = {"Load": 0.002, "Prep": 0.003, "Fwd": 0.002, "Bwd": 0.003}


def write_trace(path: Path, plan: PipelinePlan = PLAN) -> None:
    """A trace of a simulated run (exact, integer milliseconds), written as run(trace=...) writes one."""
    simulate(plan, COSTS, 20, overheads=EngineOverheads.zero()).timeline().save_chrome_trace(path)


def run_cli(args: List[str], capsys: pytest.CaptureFixture[str]) -> List[str]:
    assert main(args) == 0
    return capsys.readouterr().out.splitlines()


def test_trace_reads_back_as_the_timeline(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write_trace(path)
    timeline, other = read_trace(path)
    original = simulate(PLAN, COSTS, 20, overheads=EngineOverheads.zero()).timeline()
    assert other["engine"] == "simulated clocked"
    assert timeline.tasks == ("Load", "Prep", "Fwd", "Bwd")
    assert [(r.task, r.iteration, r.thread_group, r.stream, r.stage, r.period) for r in timeline.records] == \
        [(r.task, r.iteration, r.thread_group, r.stream, r.stage, r.period) for r in original.records]
    assert [t for r in timeline.records for t in (r.cpu_start, r.cpu_end)] == pytest.approx(
        [t for r in original.records for t in (r.cpu_start, r.cpu_end)], abs=1e-9)
    assert [(r.task, r.iteration, [(w.task, w.iteration) for w in r.waits]) for r in timeline.records[:5]] == [
        ("Load", 0, []), ("Load", 1, []), ("Prep", 0, [("Load", 0)]), ("Load", 2, []), ("Fwd", 0, [("Prep", 0)])]


def test_dependencies_are_rebuilt_from_waits_and_thread_order(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write_trace(path)
    plan, declared = plan_from_timeline(read_trace(path)[0])
    assert not declared
    assert {t: plan.intra[t] for t in plan.task_names} == {"Load": [], "Prep": ["Load"], "Fwd": ["Prep"],
                                                           "Bwd": ["Fwd"]}
    # each thread's order is kept: a task after its thread's tasks of the previous iteration, where allowed
    assert {t: [d for d, _ in plan.inter[t]] for t in plan.task_names} == {
        "Load": ["Load"], "Prep": ["Prep"], "Fwd": ["Bwd", "Fwd"], "Bwd": ["Bwd", "Fwd"]}
    assert {back for t in plan.task_names for _, back in plan.inter[t]} == {1}
    assert {n: (s.stage, s.thread_group, s.stream) for n, s in plan.schedules.items()} == {
        "Load": (0, "io", "io"), "Prep": (1, "prep", "prep"), "Fwd": (2, "default", None), "Bwd": (2, "default", None)}


def test_report_and_suggestion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    write_trace(path)
    out = run_cli(["plan", str(path), "--overheads", "zero", "--skip-first", "0"], capsys)
    assert out[0] == f"trace {path}: simulated clocked on simulated, 20 iterations in 0.105 s (5.250 ms/iteration)"
    assert out[3:9] == ["task        ms    p95 ms  spread  device ms",
                        "----  --------  --------  ------  ---------",
                        "Load     2.000     2.000    0.0%          -",
                        "Prep     3.000     3.000    0.0%          -",
                        "Fwd      2.000     2.000    0.0%          -",
                        "Bwd      3.000     3.000    0.0%          -"]
    assert out[10] == "the traced plan, simulated from these costs: 0.105 s for 20 iterations (+0.0% against the trace)"
    assert "thread default   95.2%     4.8%" in out
    assert "critical path (share of the run): Bwd 57.1%, Fwd 38.1%, Prep 2.9%, Load 1.9%" in out
    start = out.index("suggestion (exhaustive, 64 plans simulated, at most 3 iterations alive):")
    assert out[start + 1] == "no plan is predicted faster than the traced one by more than 0.5%: keep it"
    assert out[-1] == "predicted speedup               1.00x      1.00x"


def test_plan_option_gives_the_dependencies(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run.json"
    write_trace(path, ONE_THREAD)  # everything on one thread: 10 ms per iteration
    # without the plan, the order on the one thread is kept (Prep(i) after Bwd(i-1), ...): only Load overlaps
    out = run_cli(["plan", str(path), "--overheads", "zero", "--skip-first", "0"], capsys)
    assert out[-1] == "predicted speedup               1.00x      1.23x"
    (tmp_path / "my_plan_module.py").write_text(
        "from swpipeline import PipelinePlan, TaskSchedule\n"
        "def plan():\n"
        "    return PipelinePlan({'Load': TaskSchedule(0, 'io'), 'Prep': TaskSchedule(1, 'prep'),\n"
        "                         'Fwd': TaskSchedule(2), 'Bwd': TaskSchedule(2)},\n"
        "                        [('Prep', 'Load'), ('Fwd', 'Prep'), ('Bwd', 'Fwd')], [('Fwd', 'Bwd')])\n")
    monkeypatch.chdir(tmp_path)
    out = run_cli(["plan", str(path), "--plan", "my_plan_module:plan", "--overheads", "zero", "--skip-first", "0",
                   "--max-in-flight", "2", "--thread-groups", "default,prep"], capsys)
    assert out[1] == "dependencies from my_plan_module:plan"
    start = out.index("suggestion (exhaustive, 6 plans simulated, at most 2 iterations alive):")
    assert out[start + 1:start + 8] == ["task  thread   stream   stage  globally ordered",
                                        "----  -------  -------  -----  ----------------",
                                        "Load  prep     prep         0",
                                        "Prep  prep     prep         0",
                                        "Fwd   default  default      1",
                                        "Bwd   default  default      1",
                                        "dependencies: Prep <- Load, Fwd <- Prep, Bwd <- Fwd, Prep <- Fwd(i-1), "
                                        "Fwd <- Bwd(i-1)"]
    end = out.index("predicted speedup               1.00x      1.90x")
    assert out[end - 2:end] == ["streams                             3          2",
                                "critical path mostly              Bwd        Bwd"]
    # Prep(i+1) followed Fwd(i) on the one thread: the suggestion moves Prep to the preparation thread and
    # declares that order (Prep <- Fwd(i-1) above), and is as fast as without it
    assert out[end + 1:] == [
        "",
        "the suggestion keeps every order the traced run got from its placement alone (1): tasks on one thread or "
        "stream run in a fixed order, and a trace cannot tell which of these orders the tasks need"]


def test_a_real_traced_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def sleeper(seconds: float) -> PipelineTask:
        return PipelineTask(f"S{int(seconds * 1e4)}", lambda ctx: time.sleep(seconds))

    a, b = sleeper(0.0005), sleeper(0.001)
    plan = PipelinePlan({a: TaskSchedule(0, "a", "a"), b: TaskSchedule(1, "b", "b")}, [(b, a)])
    path = tmp_path / "real.json"
    SWPipeline(plan, device="cpu").run(range(12), trace=str(path))
    out = run_cli(["plan", str(path)], capsys)
    assert out[0].startswith(f"trace {path}: SWPipeline on cpu, 12 iterations in ")
    assert out[1] == "dependencies as declared in the trace"  # a traced run writes its plan's
    assert out[-1].startswith("predicted speedup")
    data = json.loads(path.read_text())
    assert data["otherData"]["plan"] == {"intra": [["S10", "S5"]], "inter": [], "globally_ordered": []}


@pytest.mark.parametrize("content, message", [
    ("not json", "is not a JSON trace"),
    (json.dumps({"traceEvents": []}), "holds no task spans"),
    (json.dumps([1, 2]), "has no traceEvents list"),
])
def test_bad_traces_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["plan", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_missing_trace_and_bad_plan_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(tmp_path / "none.json")]) == 2
    assert "swpipeline plan: error:" in capsys.readouterr().err
    path = tmp_path / "run.json"
    write_trace(path)
    assert main(["plan", str(path), "--plan", "no_colon"]) == 2
    assert "--plan must be MODULE:NAME (e.g. mytrain:plan), got 'no_colon'" in capsys.readouterr().err


# -- options in command-line words, before any work -------------------------------------------------------------


def refused(argv: List[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``swpipeline plan`` with a bad option or trace: exit 2, nothing on stdout, one line on stderr."""
    status: object
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse refused an option
        status = exc.code
    assert status == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    return captured.err.rstrip("\n")


@pytest.mark.parametrize("option, value, message", [
    ("--max-in-flight", "0", "argument --max-in-flight: must be an integer >= 1, got 0"),
    ("--max-in-flight", "-3", "argument --max-in-flight: must be an integer >= 1, got -3"),
    ("--iterations", "0", "argument --iterations: must be an integer >= 1, got 0"),
    ("--cores", "0", "argument --cores: must be an integer >= 1, got 0"),
    ("--skip-first", "-1", "argument --skip-first: must be an integer >= 0, got -1"),
    ("--cores", "two", "argument --cores: must be an integer >= 1, got 'two'"),
    ("--thread-groups", "", "argument --thread-groups: must list thread group names separated by commas, e.g. "
                            "default,prep; got ''"),
    ("--thread-groups", "default,,prep", "argument --thread-groups: must list thread group names separated by "
                                         "commas, e.g. default,prep; got 'default,,prep'"),
    ("--thread-groups", "a,b,a", "argument --thread-groups: lists a more than once; name each thread group once"),
    ("--streams", ",", "argument --streams: must list stream names separated by commas, e.g. default,prep; got ','"),
    ("--keep-order", "Fwd,Bwd", "argument --keep-order: must be TASK,DEP,intra or TASK,DEP,inter (e.g. "
                                "Forward,OptimizerStep,inter: Forward(i+1) after OptimizerStep(i)); got 'Fwd,Bwd'"),
    ("--drop-order", "Fwd:Bwd", "argument --drop-order: must be TASK,DEP,intra or TASK,DEP,inter (e.g. "
                                "Forward,OptimizerStep,inter: Forward(i+1) after OptimizerStep(i)); got 'Fwd:Bwd'"),
    ("--drop-order", "Fwd,Bwd,inter", "--drop-order Fwd,Bwd,inter: Fwd(i+1) after Bwd(i) is not an order the traced "
                                      "placement alone gave (the dependencies give it); those it gave: none"),
    ("--weight-versions", "Fwd,Bwd,Load", "argument --weight-versions: must be FORWARD,STEP, the task that computes "
                                          "on the weights and the optimizer step that updates them (e.g. "
                                          "Forward,OptimizerStep); got 'Fwd,Bwd,Load'"),
])
def test_a_bad_option_is_one_line_in_command_line_words(option: str, value: str, message: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    write_trace(path)
    assert refused(["plan", str(path), option, value], capsys) == f"swpipeline plan: error: {message}"


def test_an_abbreviated_option_is_not_taken_for_another(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    write_trace(path)
    assert refused(["plan", str(path), "--max", "2"], capsys) == \
        "swpipeline: error: unrecognized arguments: --max 2"


def test_skipping_every_traced_iteration_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    write_trace(path)  # 20 iterations
    for skip in ("20", "50"):
        assert refused(["plan", str(path), "--skip-first", skip], capsys) == (
            f"swpipeline plan: error: --skip-first {skip}: the trace has 20 iteration(s), so no cost would be left; "
            f"leave out at most 19")
    assert main(["plan", str(path), "--skip-first", "19", "--overheads", "zero"]) == 0
    assert "0.0% against the trace)" in capsys.readouterr().out  # costs from the last iteration alone


def test_a_picture_a_folder_or_a_missing_file_given_as_the_trace(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    picture = tmp_path / "chart.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    assert refused(["plan", str(picture)], capsys) == (
        f"swpipeline plan: error: {picture}: is a PNG picture, not a JSON trace; pass a trace written by "
        f"pipe.run(data, trace='run.json')")
    assert refused(["plan", str(tmp_path)], capsys) == (
        f"swpipeline plan: error: {tmp_path}: cannot be read (Is a directory); pass a trace written by "
        f"pipe.run(data, trace='run.json')")
    assert refused(["plan", str(tmp_path / "none.json")], capsys) == (
        f"swpipeline plan: error: {tmp_path / 'none.json'}: cannot be read (No such file or directory); pass a "
        f"trace written by pipe.run(data, trace='run.json')")


def test_a_plan_option_that_cannot_be_loaded(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run.json"
    write_trace(path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plans_here.py").write_text("def broken():\n    raise RuntimeError('no GPU')\n")
    assert refused(["plan", str(path), "--plan", "no_such_module_here:plan"], capsys) == (
        "swpipeline plan: error: --plan no_such_module_here:plan: cannot import no_such_module_here "
        "(ModuleNotFoundError: No module named 'no_such_module_here')")
    assert refused(["plan", str(path), "--plan", "plans_here:missing"], capsys) == (
        "swpipeline plan: error: --plan plans_here:missing: module plans_here has no 'missing'; name the plan, or a "
        "function returning it")
    assert refused(["plan", str(path), "--plan", "plans_here:broken"], capsys) == (
        "swpipeline plan: error: --plan plans_here:broken: broken() raised RuntimeError: no GPU")


# -- traces from elsewhere -------------------------------------------------------------------------------------


def span(name: str, cat: str, pid: int, args: Dict[str, Any], ts: Any = 0.0, dur: Any = 10.0) -> Dict[str, Any]:
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": 1, "args": args}


TASK_ARGS = {"iteration": 0, "stage": 0, "thread_group": "default", "stream": "default"}


@pytest.mark.parametrize("events, message", [
    ([span("Forward", "task", 1, {})], "traceEvents[0], a task span 'Forward', has no args.iteration"),
    ([span("Forward", "task", 1, {"iteration": 0, "stage": 0, "stream": "default"})],
     "traceEvents[0], a task span 'Forward', has no args.thread_group"),
    ([span("Forward", "task", 1, dict(TASK_ARGS, iteration="3"))],
     "traceEvents[0], a task span 'Forward', has args.iteration '3', not a whole number >= 0"),
    ([{"name": "Forward", "cat": "task", "ph": "X", "ts": 5.0, "pid": 1, "tid": 1, "args": TASK_ARGS}],
     "traceEvents[0], a task span 'Forward', has no 'dur'"),
    ([span("Load", "task", 1, TASK_ARGS), {"name": "Forward", "cat": "task", "ph": "X", "dur": 5.0, "pid": 1,
                                          "tid": 1, "args": TASK_ARGS}],
     "traceEvents[1], a task span 'Forward', has no 'ts'"),
    ([span("Forward", "task", 1, TASK_ARGS, ts="soon")],
     "traceEvents[0], a task span 'Forward', has ts 'soon', not a number of microseconds"),
    ([span("Forward", "task", 1, TASK_ARGS, dur=-4.0)],
     "traceEvents[0], a task span 'Forward', has a negative dur -4.0"),
    ([span("Forward", "task", 1, TASK_ARGS), span("wait Load", "dependency_wait", 1, {"task": "Forward",
                                                                                      "iteration": 0})],
     "traceEvents[1], a dependency wait 'wait Load', has no args.dependency"),
    ([span("Forward", "task", 1, TASK_ARGS),
      span("wait Load", "dependency_wait", 1, {"task": "Forward", "iteration": 0, "dependency": "Load",
                                                "dependency_iteration": 0})],
     "traceEvents[1], a dependency wait of Forward(i0), waits for 'Load', which has no task span in the trace"),
    ([span("Forward", "device", 2, {})], "traceEvents[0], a device span 'Forward', has no args.iteration"),
    ([span("aten::mm", "cpu_op", 7, {"External id": 3}), span("ProfilerStep#1", "user_annotation", 7, {})],
     "holds no task spans (events of category 'task' on process 1)"),
])
def test_a_trace_from_elsewhere_is_refused_in_one_line(events: List[Dict[str, Any]], message: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"traceEvents": events}))
    err = refused(["plan", str(path)], capsys)
    assert err.startswith(f"swpipeline plan: error: {path}: {message}")
    assert err.endswith("pass a trace written by pipe.run(data, trace='run.json')") or \
        err.endswith("at least one task")


def test_other_tools_events_in_a_trace_are_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    write_trace(path)
    data = json.loads(path.read_text())
    data["traceEvents"] += [{"name": "aten::mm", "ph": "X", "cat": "cpu_op", "pid": 9, "tid": 9},  # no ts, no dur
                            {"ph": "i", "name": "marker", "pid": 1, "cat": "task"}, "not an event", 7]
    path.write_text(json.dumps(data))
    assert main(["plan", str(path), "--overheads", "zero"]) == 0
    assert capsys.readouterr().out.startswith(f"trace {path}: simulated clocked on simulated, 20 iterations")


@pytest.mark.parametrize("plan_value, message", [
    ("everything", "otherData.plan is not an object of dependencies"),
    ({"intra": [["Prep"]]}, "otherData.plan.intra holds ['Prep'], not a [task, depends_on] pair of task names"),
    ({"inter": "Fwd,Bwd"}, "otherData.plan.inter is not a list"),
    ({"intra": [["Prep", "Ghost"]]}, "otherData.plan.intra names 'Ghost', which has no task span in the trace"),
    ({"globally_ordered": [3]}, "otherData.plan.globally_ordered holds 3, not a task name"),
])
def test_a_bad_plan_record_in_a_trace_is_refused(plan_value: Any, message: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    write_trace(path)
    data = json.loads(path.read_text())
    data["otherData"]["plan"] = plan_value
    path.write_text(json.dumps(data))
    assert refused(["plan", str(path)], capsys) == (f"swpipeline plan: error: {path}: {message}; pass a trace "
                                                    f"written by pipe.run(data, trace='run.json')")


def test_deeply_nested_json_is_refused_not_a_recursion_error(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    assert refused(["plan", str(path)], capsys) == (
        f"swpipeline plan: error: {path}: its JSON is nested too deeply to read (a trace's events are flat); pass "
        f"a trace written by pipe.run(data, trace='run.json')")
    path.write_text(json.dumps({"traceEvents": [span("F", "task", 1, TASK_ARGS)], "otherData": {"wall_ms": "1s"}}))
    assert refused(["plan", str(path)], capsys) == (
        f"swpipeline plan: error: {path}: otherData.wall_ms is '1s', not a number of milliseconds; pass a trace "
        f"written by pipe.run(data, trace='run.json')")
