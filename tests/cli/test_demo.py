"""Tests of ``swpipeline demo`` (src/swpipeline/cli/demo/): the command, its plan, its data and its check.

Wall-clock times and speedups are printed by the demo, never asserted here.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import pytest
import torch

from swpipeline import CPUDevice, Device, SimulatedDevice
from swpipeline.cli import demo
from swpipeline.cli import main
from swpipeline.cli.demo import command as demo_command

# Small enough that every test runs in well under a second.
TINY = replace(demo.DemoConfig(), iters=6, batch_size=32, warmup_iters=2, table_sizes=(50, 30, 20),
               max_events=6, distinct_ids=3, bottom_mlp=(8, 4), top_mlp=(8,), embedding_dim=4)

TINY_ARGS = ["demo", "--iters", "5", "--batch-size", "32", "--warmup-iters", "1", "--device", "cpu"]


@pytest.fixture(autouse=True)
def in_a_scratch_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo writes its trace and pictures under out/ by default: keep them out of the repository."""
    monkeypatch.chdir(tmp_path)


def swp_threads() -> List[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("swp-")]


def test_demo_command_prints_plan_results_and_equal_losses(capsys: pytest.CaptureFixture[str]) -> None:
    threads_before = torch.get_num_threads()
    assert main(TINY_ARGS) == 0
    out = capsys.readouterr().out
    assert "torch.set_num_threads(1)" in out
    assert "#  Task" in out and "| P0    P1    P2    P3    P4" in out  # the schedule, 5 periods
    for row in ("PrepareBatch      prep    prep", "CopyToDevice      copy    copy",
                "Forward           default default"):
        assert row in out
    assert "mode        time (s)   ms/iter  speedup" in out
    assert "\nserial " in out and "\npipelined " in out
    assert "losses equal: yes (all 5 iterations bitwise equal" in out
    assert torch.get_num_threads() == threads_before  # the demo restores the global setting
    assert swp_threads() == []


def test_demo_schedule_is_print_schedules_table_oldest_iteration_first(capsys: pytest.CaptureFixture[str]) -> None:
    # One order everywhere: the demo prints what pipe.print_schedule(5) prints, the last stage's rows (the oldest
    # iteration's work) first, as each period submits them.
    assert main(TINY_ARGS) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("the plan, period by period (pipe.print_schedule(5): a row per task, the last stage first, "
                        "as each period runs them; iN: iteration N runs the task in that period):")
    assert lines[start + 1:start + 8] == [
        "#  Task              Thread  Stream       | P0    P1    P2    P3    P4",
        "-- ----------------- ------- ------------ + ----- ----- ----- ----- -----",
        "0  Forward           default default      | --    --    i0    i1    i2",
        "1  Backward          default default      | --    --    i0    i1    i2",
        "2  OptimizerStep     default default      | --    --    i0    i1    i2",
        "3  CopyToDevice      copy    copy         | --    i0    i1    i2    i3",
        "4  PrepareBatch      prep    prep         | i0    i1    i2    i3    i4",
    ]
    assert "\n".join(lines[start + 1:start + 8]) == demo.TrainingJob(TINY, CPUDevice()).pipe.format_schedule(5)


def test_demo_prints_what_its_speedup_is_measured_against(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(TINY_ARGS) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines.index("mode        time (s)   ms/iter  speedup")
    serial, pipelined = (float(lines[table + k].split()[1]) for k in (2, 3))
    assert lines[table + 4] == (
        f"speedup = serial {serial:.3f} s / pipelined {pipelined:.3f} s: both runs train the same 5 batches from "
        f"the same initial weights on this machine, one after the other")


def test_speedup_line_and_busy_note_name_the_serial_run_they_compare_with() -> None:
    serial = demo.RunResult("serial", 4.431, torch.zeros(1), {}, 5.8)
    pipelined = demo.RunResult("pipelined", 3.797, torch.zeros(1), {}, 4.3)
    assert demo.format_speedup_basis(serial, pipelined, 200) == (
        "speedup = serial 4.431 s / pipelined 3.797 s: both runs train the same 200 batches from the same initial "
        "weights on this machine, one after the other")
    assert demo.format_interference([serial, pipelined]) == (
        "note: other processes used 5.8 CPU-s during the serial run and 4.3 CPU-s during the pipelined run:\n"
        "      the machine was busy, so the speedup (1.17x) says little about pipelining: each run lost a different "
        "share of the cores; run again when it is idle")


def test_demo_writes_the_trace_and_pictures_and_prints_the_stats(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert main(TINY_ARGS) == 0
    out = capsys.readouterr().out
    assert "pipelined run, as traced:\nSWPipeline on cpu: 5 iterations in " in out
    assert "PrepareBatch   prep     prep" in out and "thread prep" in out
    for name in ("demo_trace.json", "demo_timeline.png", "demo_schedule.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
        assert f"out/{name}" in out
    trace = json.loads((tmp_path / "out" / "demo_trace.json").read_text())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "task"} == {
        "PrepareBatch", "CopyToDevice", "Forward", "Backward", "OptimizerStep"}
    assert main([*TINY_ARGS, "--trace", str(tmp_path / "t.json"), "--chart", "", "--schedule-chart", ""]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "t.json").exists() and "timeline chart" not in out and "schedule picture" not in out


def test_demo_command_rejects_a_device_torch_does_not_know(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--iters", "2", "--device", "no-such-device"]) == 2
    assert "--device" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [["--iters", "0"], ["--batch-size", "-3"], ["--warmup-iters", "-1"]])
def test_demo_command_rejects_non_positive_sizes(bad: List[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", *bad])
    assert exc.value.code == 2
    assert bad[0] in capsys.readouterr().err


def test_plan_has_three_stages_on_their_own_threads_and_streams() -> None:
    job = demo.TrainingJob(TINY, CPUDevice())
    plan = job.plan
    layout = {name: (s.stage, s.stream, s.thread_group) for name, s in plan.schedules.items()}
    assert layout == {
        "PrepareBatch": (0, "prep", "prep"),
        "CopyToDevice": (1, "copy", "copy"),
        "Forward": (2, None, "default"),
        "Backward": (2, None, "default"),
        "OptimizerStep": (2, None, "default"),
    }
    assert plan.intra == {"PrepareBatch": [], "CopyToDevice": ["PrepareBatch"], "Forward": ["CopyToDevice"],
                          "Backward": ["Forward"], "OptimizerStep": ["Backward"]}
    assert all(deps == [] for deps in plan.inter.values())
    assert job.pipe.depth == 3


def test_pipelined_losses_equal_serial_losses_exactly() -> None:
    batches = [demo.make_raw_batch(TINY, k) for k in range(TINY.iters)]
    serial = demo.timed_run(TINY, CPUDevice(), batches, pipelined=False)
    pipelined = demo.timed_run(TINY, CPUDevice(), batches, pipelined=True)
    assert serial.losses.shape == (TINY.iters,)
    assert torch.isfinite(serial.losses).all()
    assert torch.equal(serial.losses, pipelined.losses)
    assert demo.format_loss_check(serial, pipelined)[0]
    assert swp_threads() == []


def test_losses_of_a_model_that_trains_differently_are_not_equal() -> None:
    """The check compares real training runs: one extra iteration of weight updates changes the losses."""
    batches = [demo.make_raw_batch(TINY, k) for k in range(TINY.iters)]
    reference = demo.timed_run(TINY, CPUDevice(), batches, pipelined=False)
    shifted = demo.timed_run(TINY, CPUDevice(), batches[:1] + batches[:-1], pipelined=True)
    assert torch.equal(reference.losses[:1], shifted.losses[:1])
    assert not torch.equal(reference.losses, shifted.losses)


def test_gpu_protocol_orders_every_dependency_on_a_simulated_device() -> None:
    """CPU twin of the CUDA run: each consumer's stream waits for its producer's launch."""
    device = SimulatedDevice()
    job = demo.TrainingJob(TINY, device)
    job.pipe.run([demo.make_raw_batch(TINY, k) for k in range(4)])
    launches = device.launches()
    for i in range(4):
        for task, deps in job.plan.intra.items():
            for dep in deps:
                assert device.happens_before(launches[(dep, i)], launches[(task, i)]), (dep, task, i)
    assert len(job.losses) == 4


def test_the_demo_is_free_of_gpu_hazards_with_streams_behind_the_host() -> None:
    """No unordered access, no memory reused under a pending reader: without one record_stream in the demo."""
    device = SimulatedDevice(behind_host=True)
    job = demo.TrainingJob(TINY, device)
    job.pipe.run([demo.make_raw_batch(TINY, k) for k in range(6)])
    assert len(job.losses) == 6
    assert device.hazards == []


def test_run_demo_exits_1_and_says_where_losses_differ(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    real_timed_run = demo.timed_run

    def perturbed(cfg: demo.DemoConfig, device: Device, batches: List[demo.RawBatch],
                  pipelined: bool) -> demo.RunResult:
        result = real_timed_run(cfg, device, batches, pipelined)
        if pipelined:
            result.losses[3] += 1e-6
        return result

    monkeypatch.setattr(demo_command, "timed_run", perturbed)  # where run_demo finds it
    assert demo.run_demo(TINY, CPUDevice()) == 1
    assert "losses equal: NO: first difference at iteration 3" in capsys.readouterr().out


def test_interference_note_only_when_other_processes_took_cpu() -> None:
    def result(mode: str, others: Optional[float]) -> demo.RunResult:
        return demo.RunResult(mode, 2.0, torch.zeros(1), {}, others)

    assert demo.format_interference([result("serial", 0.1), result("pipelined", None)]) is None
    note = demo.format_interference([result("serial", 0.1), result("pipelined", 0.9)])
    assert note is not None and "0.9 CPU-s during the pipelined run" in note and "serial" not in note


def test_batches_are_a_function_of_seed_plus_index() -> None:
    first, again = demo.make_raw_batch(TINY, 3), demo.make_raw_batch(TINY, 3)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first.ids, demo.make_raw_batch(TINY, 4).ids)
    assert torch.equal(demo.make_raw_batch(replace(TINY, seed=1), 3).ids, demo.make_raw_batch(TINY, 4).ids)
    assert first.ids.numel() == int(first.lengths.sum())


def test_prepare_batch_matches_a_per_sample_reference() -> None:
    raw = demo.make_raw_batch(TINY, 0)
    batch = demo.prepare_batch(raw, TINY.table_sizes)
    num_sparse, size = raw.lengths.shape
    bag = torch.repeat_interleave(torch.arange(num_sparse * size), raw.lengths.flatten())
    rows = demo.hash_ids(raw.ids, bag // size, TINY.table_sizes).tolist()
    start = 0
    for feature in range(num_sparse):
        ids, offsets = batch.ids[feature].tolist(), batch.offsets[feature].tolist()
        assert len(offsets) == size and offsets[0] == 0
        for sample in range(size):
            length = int(raw.lengths[feature, sample])
            expected = sorted(set(rows[start:start + length]))
            end = offsets[sample + 1] if sample + 1 < size else len(ids)
            assert ids[offsets[sample]:end] == expected, (feature, sample)
            start += length
        assert all(0 <= row < TINY.table_sizes[feature] for row in ids)
    assert batch.dense.shape == (size, TINY.num_dense)
    assert torch.allclose(batch.dense.mean(0), torch.zeros(TINY.num_dense), atol=1e-4)
    assert batch.labels.shape == (size, 1)


def test_hash_ids_spreads_ids_over_the_table_and_salts_by_feature() -> None:
    ids = torch.arange(20_000, dtype=torch.int32)
    rows = demo.hash_ids(ids, torch.zeros_like(ids, dtype=torch.long), (1000,))
    assert rows.min() >= 0 and rows.max() < 1000
    assert torch.bincount(rows, minlength=1000).min() > 0  # every row is hit
    other = demo.hash_ids(ids, torch.ones_like(ids, dtype=torch.long), (1000, 1000))
    assert (rows != other).float().mean() > 0.9


def test_thread_split_shows_how_much_the_threads_slowed_each_other_down() -> None:
    plan = demo.TrainingJob(TINY, CPUDevice()).plan
    serial = demo.RunResult("serial", 3.0, torch.zeros(1), {"PrepareBatch": 1.0, "CopyToDevice": 0.001,
                                                            "Forward": 0.5, "Backward": 1.0, "OptimizerStep": 0.5})
    pipelined = demo.RunResult("pipelined", 2.5, torch.zeros(1),
                               {"PrepareBatch": 1.5, "CopyToDevice": 0.002, "Forward": 0.8, "Backward": 1.2,
                                "OptimizerStep": 0.4})
    assert demo.format_thread_split(plan, serial, pipelined) == (
        "serial run, host time in each thread's tasks: prep 1.00 s, copy 0.00 s, default 2.00 s\n"
        "ideal pipelined speedup (threads fully overlapped) = total / largest = 1.50x\n"
        "pipelined run, host time in each thread's tasks: prep 1.50 s (+50%), default 2.40 s (+20%): side by side, "
        "the threads slow each other down (shared cores and memory, and the GIL for the Python parts of their tasks)\n"
        "speedup if the pipelined run took only its busiest thread's time = serial / largest = 1.25x "
        "(measured: 1.20x)")


# The test stack and the optional integrations: none of them is in the demo's light install (torch and matplotlib).
NOT_IN_THE_LIGHT_INSTALL = ("pytest", "hypothesis", "mypy", "ruff", "mkdocs", "mkdocstrings", "torchgpipe",
                            "torchdata", "torchrec", "fbgemm_gpu", "tensordict", "torchmetrics", "pyre_extensions")

BLOCKED_RUN = '''import sys
for name in {blocked!r}:
    sys.modules[name] = None  # import name raises ImportError
from swpipeline.cli import main
code = main({args!r})
print("imported:", sorted(n for n in {blocked!r} if sys.modules.get(n) is not None))
sys.exit(code)
'''


def test_the_demo_runs_with_only_the_light_install(tmp_path: Path) -> None:
    # `pip install torch==... -e ".[plot]"` is all `swpipeline demo` needs: nothing of the test stack is imported.
    import subprocess
    import sys

    script = BLOCKED_RUN.format(blocked=NOT_IN_THE_LIGHT_INSTALL, args=[*TINY_ARGS, "--trace", "out/t.json"])
    src = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": src})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "losses equal: yes (all 5 iterations bitwise equal" in proc.stdout
    assert proc.stdout.rstrip().endswith("imported: []")
    assert (tmp_path / "out" / "t.json").stat().st_size > 0
