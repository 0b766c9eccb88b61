"""The command line's own behaviour: version, help, errors in command-line words before any work, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest
import torch

import swpipeline
from swpipeline.cli import main

TINY = ["demo", "--iters", "3", "--batch-size", "16", "--warmup-iters", "0", "--device", "cpu"]


def test_version_names_the_package_torch_and_python(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    v = sys.version_info
    assert capsys.readouterr().out == (f"swpipeline {swpipeline.__version__} (torch {torch.__version__}, Python "
                                       f"{v.major}.{v.minor}.{v.micro})\n")


@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"], ["plan", "--help"]])
def test_help_has_no_markup(argv: List[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    text = capsys.readouterr().out
    assert text.startswith("usage: swpipeline")
    assert "``" not in text and "::" not in text


@pytest.mark.parametrize("option", ["--iters", "--batch-size", "--warmup-iters"])
def test_a_non_number_is_refused_in_plain_words(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", option, "abc"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: must be an integer >= " in err and "got 'abc'" in err
    assert "invalid" not in err


@pytest.mark.parametrize("device,message", [
    ("meta", "--device meta: meta tensors hold no data, so nothing can be trained on them; use cpu, or an "
             "accelerator such as cuda"),
    ("bogus", "--device bogus: not a device name; use cpu, or an accelerator such as cuda or cuda:1"),
])
def test_unusable_devices_are_refused_before_any_work(device: str, message: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--device", device]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"swpipeline demo: error: {message}\n"
    assert captured.out == ""  # nothing printed, nothing trained


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_missing_accelerator_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--device", "cuda:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("swpipeline demo: error: --device cuda:1: this machine has no cuda device (")
    assert "use --device cpu, or leave --device out to use what the machine has" in err
    assert "device=None" not in err and "absent" not in err


@pytest.mark.parametrize("option", ["--trace", "--chart", "--schedule-chart"])
def test_an_output_path_that_cannot_be_written_fails_before_training(
        option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    name = "out.json" if option == "--trace" else "out.png"
    assert main([*TINY, option, str(blocker / "sub" / name)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"swpipeline demo: error: {option} {blocker / 'sub' / name}: {blocker} is a "
                            f"file, so no directory can be made there; choose another path (or '' to skip this "
                            f"output)\n")
    assert captured.out == ""
    assert main([*TINY, option, str(tmp_path)]) == 2
    assert f"{option} {tmp_path}: is a directory" in capsys.readouterr().err


def refused_before_training(argv: List[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the demo with a bad option: exit 2, nothing printed on stdout (nothing trained); the one error line."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("swpipeline demo: error: ")
    return captured.err.rstrip("\n")


@pytest.mark.parametrize("option", ["--chart", "--schedule-chart"])
def test_a_picture_path_that_names_a_folder_or_another_format_is_refused(
        option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = f"{tmp_path}/somedir/"
    assert refused_before_training([*TINY, option, folder], capsys) == (
        f"swpipeline demo: error: {option} {folder}: ends with '/', so it names a folder; give a file name in it, "
        f"such as {folder}timeline.png (or '' to skip this output)")
    assert not (tmp_path / "somedir.png").exists()
    assert refused_before_training([*TINY, option, str(tmp_path / "chart.jpg")], capsys) == (
        f"swpipeline demo: error: {option} {tmp_path / 'chart.jpg'}: the picture is a PNG; give a file name ending "
        f"in .png (or '' to skip this output)")


def test_a_trace_path_that_names_a_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = f"{tmp_path}/traces/"
    assert refused_before_training([*TINY, "--trace", folder], capsys) == (
        f"swpipeline demo: error: --trace {folder}: ends with '/', so it names a folder; give a file name in it, "
        f"such as {folder}trace.json (or '' to skip this output)")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc file system here")
@pytest.mark.parametrize("path", ["/proc/swpipeline_trace.json", "/proc/self/swpipeline/trace.json"])
def test_a_path_where_no_file_can_be_made_is_refused_before_training(path: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    err = refused_before_training([*TINY, "--trace", path], capsys)
    assert err.startswith(f"swpipeline demo: error: --trace {path}: ")
    assert err.endswith("; choose another path (or '' to skip this output)")


def test_a_file_name_too_long_is_refused_before_training(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in (tmp_path / ("a" * 300 + ".png"), tmp_path / ("b" * 300) / "chart.png"):
        err = refused_before_training([*TINY, "--chart", str(path)], capsys)
        assert err == (f"swpipeline demo: error: --chart {str(path)[:40]}...: a name in it is 300 bytes long, "
                       f"and this file system allows at most 255; choose a shorter name (or '' to skip this "
                       f"output)").replace("300 bytes", f"{len(max(path.parts, key=len))} bytes")


def test_an_output_that_fails_after_training_is_one_line_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from swpipeline.observe.timeline import Timeline

    def disk_full(self: Timeline, path: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Timeline, "save_chrome_trace", disk_full)
    trace = tmp_path / "t.json"
    assert main([*TINY, "--trace", str(trace), "--chart", "", "--schedule-chart", ""]) == 2
    captured = capsys.readouterr()
    assert "losses equal: yes" in captured.out  # the results were printed first
    assert captured.err == (f"swpipeline demo: error: --trace {trace}: could not be written (No space left on "
                            f"device); the results above stand\n")


def test_ctrl_c_exits_130_with_one_line(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "import sys; from swpipeline.cli import main; sys.exit(main(sys.argv[1:]))",
               "demo", "--iters", "5000", "--batch-size", "64", "--warmup-iters", "0", "--device", "cpu",
               "--trace", "", "--chart", "", "--schedule-chart", ""]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until training has started
            if line.startswith("training "):
                break
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert err == "swpipeline: interrupted\n"
