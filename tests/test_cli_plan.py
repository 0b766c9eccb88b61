"""``swpipeline plan TRACE.json``: reading a trace back, the report, the suggestion, errors."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List

import pytest

from swpipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
from swpipeline.cli import main
from swpipeline.planning.overheads import EngineOverheads
from swpipeline.planning.simulator import simulate
from swpipeline.planning.trace_read import plan_from_timeline, read_trace

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
    assert {t: plan.inter[t] for t in plan.task_names} == {"Load": ["Load"], "Prep": ["Prep"], "Fwd": ["Bwd", "Fwd"],
                                                           "Bwd": ["Bwd", "Fwd"]}
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
                                        "dependencies: Prep <- Load, Fwd <- Prep, Bwd <- Fwd, Fwd <- Bwd(i-1)"]
    assert out[-3:] == ["streams                             3          2",
                        "critical path mostly              Bwd        Bwd",
                        "predicted speedup               1.00x      1.90x"]


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
