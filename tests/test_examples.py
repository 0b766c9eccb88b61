"""The scripts in examples/ run and check what they claim; the README's example runs as printed.

Each script runs in a fresh interpreter (torchrec_two_ranks.py, pipeline_parallel.py and pp_gpt.py on 2 ranks
through torch.distributed.run), bounded in time; a script that does not finish is killed with
every process it started. Every examples/*.py must be listed here, so none goes unrun.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from dist_harness import checkout_env, descendants, free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# script -> what its output must contain
SINGLE_PROCESS = {
    "quickstart.py": "losses bitwise equal: yes (40 iterations)",
    "dataflow.py": "losses bitwise equal: yes (every engine, 40 iterations)",
    "step_by_step.py": "losses bitwise equal: yes (",
    "staleness_loss.py": "final weights bitwise equal to run_serial: yes (k = 0, 1, 2; 200 steps)",
}
WRITES_A_FIGURE = {"staleness_loss.py"}  # run with --out in a temporary folder, not over the docs' copy
TWO_RANKS = {"torchrec_two_ranks.py": "losses bitwise equal to TorchRec's: yes",
             "pipeline_parallel.py": "bitwise equal to torch.distributed.pipelining's: yes",
             "pp_gpt.py": "(tied copy included) bitwise equal to one process: yes"}
NEEDS = {"torchrec_two_ranks.py": "torchrec"}  # an optional package a script imports
TIMEOUT_S = 120.0
TWO_RANKS_TIMEOUT_S = 150.0  # two interpreters importing TorchRec on a 2-core machine


def _run(args: List[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``args`` with this checkout's src/ first on the path; on timeout kill it and what it started, and fail."""
    proc = subprocess.Popen(args, cwd=cwd, env=checkout_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        started = descendants(proc.pid)  # torchrun's ranks run in sessions of their own: found by parentage
        for pid in [proc.pid, *started]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"{' '.join(args)} did not finish in {timeout:g} s (killed)\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _check(result: subprocess.CompletedProcess[str], expected: str, count: int = 1) -> None:
    report = f"exit code {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-6000:]}"
    assert result.returncode == 0, report
    assert result.stdout.count(expected) == count, report


def test_every_example_is_known_and_run() -> None:
    found = {p.name for p in EXAMPLES.glob("*.py")}
    assert found == set(SINGLE_PROCESS) | set(TWO_RANKS), (
        "examples/*.py changed: add each new script to SINGLE_PROCESS or TWO_RANKS in tests/test_examples.py "
        "with the line it must print")


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_example_has_a_main_and_a_line_in_the_examples_readme(name: str) -> None:
    source = (EXAMPLES / name).read_text()
    assert "\ndef main(" in source and '\nif __name__ == "__main__":\n    main()' in source
    line = rf"\[{re.escape(name)}\]\({re.escape(name)}\).*`(python|torchrun .*) examples/{re.escape(name)}`"
    listing = (EXAMPLES / "README.md").read_text()
    assert re.search(line, listing), f"examples/README.md has no line for {name} with its command"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_example_runs(name: str, tmp_path: Path) -> None:
    if name in TWO_RANKS:
        if name in NEEDS:
            pytest.importorskip(NEEDS[name], reason=f"examples/{name} needs {NEEDS[name]}, which cannot be imported")
        args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(free_port()), str(EXAMPLES / name)]
        _check(_run(args, ROOT, TWO_RANKS_TIMEOUT_S), TWO_RANKS[name], count=2)  # one line per rank
    else:
        assert name in SINGLE_PROCESS, f"add examples/{name} to SINGLE_PROCESS in tests/test_examples.py"
        out = ["--out", str(tmp_path / "figure.png")] if name in WRITES_A_FIGURE else []
        _check(_run([sys.executable, str(EXAMPLES / name), *out], ROOT, TIMEOUT_S), SINGLE_PROCESS[name])


def readme_example() -> str:
    """The first python code block after the README's "## Example" heading."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Example\n"):]
    match = re.search(r"^```python\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
    assert match is not None, 'README.md has no python code block after "## Example"'
    return match.group(1)


# What the README's example prints, but for its times: the schedule (the last stage first, as each period runs
# them), the bitwise comparison, and a speedup line of this shape.
README_SCHEDULE = [
    "#  Task              Thread  Stream       | P0    P1    P2    P3",
    "-- ----------------- ------- ------------ + ----- ----- ----- -----",
    "0  forward           default default      | --    --    i0    i1",
    "1  backward          default default      | --    --    i0    i1",
    "2  step              default default      | --    --    i0    i1",
    "3  copy              default copy         | --    i0    i1    i2",
    "4  prepare           prep    prep         | i0    i1    i2    i3",
]
README_EQUAL = "pipelined == serial: True (40 losses, compared bitwise)"
README_SPEEDUP = re.compile(r"serial (\d+\.\d\d) s, pipelined (\d+\.\d\d) s: (\d+\.\d\d)x")


def readme_printed() -> List[str]:
    """The lines the README shows under its example ("It prints ...")."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Example\n"):]
    match = re.search(r"^It prints.*?\n\n```\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
    assert match is not None, 'README.md shows no output under its example ("It prints ...")'
    return match.group(1).splitlines()


def test_readme_example_runs_as_printed(tmp_path: Path) -> None:
    script = tmp_path / "readme_example.py"
    script.write_text(readme_example())
    result = _run([sys.executable, str(script)], tmp_path, TIMEOUT_S)
    _check(result, README_EQUAL)
    lines = result.stdout.splitlines()
    assert lines[:-1] == [*README_SCHEDULE, README_EQUAL], result.stdout
    match = README_SPEEDUP.fullmatch(lines[-1])
    assert match is not None, lines[-1]
    serial, pipelined, speedup = (float(g) for g in match.groups())
    assert speedup > 0 and serial > 0 and pipelined > 0  # the times themselves are the machine's, never asserted


def test_the_readme_shows_what_its_example_prints() -> None:
    shown = readme_printed()
    assert shown[:-1] == [*README_SCHEDULE, README_EQUAL]
    match = README_SPEEDUP.fullmatch(shown[-1])
    assert match is not None, shown[-1]
    serial, pipelined, speedup = (float(g) for g in match.groups())
    assert abs(serial / pipelined - speedup) < 0.1  # the shown figures are one run's, rounded to 0.01


def test_first_plan_page_shows_the_readme_example() -> None:
    page = (ROOT / "docs" / "first_plan.md").read_text()
    assert f"```python\n{readme_example()}```" in page
    assert "\n".join(readme_printed()) in page


# torch built for CUDA on a machine without a driver: torch names "cuda" as the accelerator, yet none is available.
CUDA_BUILD_WITHOUT_A_DEVICE = '''import torch
torch.accelerator.current_accelerator = lambda check_available=False: None if check_available else torch.device("cuda")
torch.accelerator.is_available = lambda: False
'''


def test_readme_example_runs_on_a_cuda_build_without_a_device(tmp_path: Path) -> None:
    script = tmp_path / "readme_example.py"
    script.write_text(CUDA_BUILD_WITHOUT_A_DEVICE + readme_example()
                      + 'print("devices:", device, type(pipe.device).__name__)\n')
    result = _run([sys.executable, str(script)], tmp_path, TIMEOUT_S)
    _check(result, "devices: cpu CPUDevice")  # the example's device is the one the engine picked
