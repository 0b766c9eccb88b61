"""tools/check_torch_build.py: how it reads pip's dry runs, and that it checks the README's command.

The dry runs themselves need the network (PyPI, PyTorch's CPU index): the script runs them, and
docs/install.md records its output. Here its reading of pip's output is checked on pip's real output.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import check_torch_build  # noqa: E402

# `pip install --dry-run --ignore-installed --no-cache-dir --index-url https://pypi.org/simple torch==2.13.0` with
# no configuration file, on Linux x86_64, Python 3.11, pip 23.2.1 (2026-11-28), without its progress bars.
PYPI_LINUX = (ROOT / "tests" / "data" / "pip_dry_run_torch_pypi_linux.txt").read_text(encoding="utf-8")

# The same from a machine whose pip finds the CPU build on its disk: the line pip ends with.
CPU_BUILD = ("Would install Jinja2-3.1.6 MarkupSafe-3.0.4 filelock-4.3.1 fsspec-2026.9.0 mpmath-1.3.0 "
             "networkx-3.6.1 setuptools-84.2.1 sympy-1.14.0 torch-2.13.0+cpu typing_extensions-4.16.0\n")

# PyTorch's CPU index from a machine that cannot reach it (pip with --retries 0).
UNREACHABLE = """Looking in indexes: https://download.pytorch.org/whl/cpu
ERROR: Could not find a version that satisfies the requirement torch==2.13.0 (from versions: none)
ERROR: No matching distribution found for torch==2.13.0
"""


def test_pypis_torch_on_linux_is_read_as_the_cuda_build() -> None:
    run = check_torch_build.parse(PYPI_LINUX, 0)
    assert run.torch == "2.13.0" and len(run.packages) == 29
    assert "nvidia-cublas" in run.cuda_packages and "triton" in run.cuda_packages and len(run.cuda_packages) == 19
    assert 2600 < run.download_mb < 2800
    assert run.describe() == ("torch 2.13.0: the CUDA build (19 CUDA packages: cuda-bindings, cuda-pathfinder, "
                              "cuda-toolkit, nvidia-cublas, ...); 29 packages, 2.7 GB to download")


def test_the_cpu_build_is_read_as_such() -> None:
    run = check_torch_build.parse(CPU_BUILD, 0)
    assert run.torch == "2.13.0+cpu" and run.cuda_packages == []
    assert run.describe() == "torch 2.13.0+cpu: the CPU build (no CUDA package); 10 packages"


def test_no_answer_says_why() -> None:
    run = check_torch_build.parse(UNREACHABLE, 1)
    assert run.torch is None
    assert run.describe() == "no answer: ERROR: No matching distribution found for torch==2.13.0"


def test_it_checks_the_pin_and_the_command_the_readme_gives() -> None:
    pin = check_torch_build.torch_pin()
    command = check_torch_build.cpu_command(pin)
    assert command == f"pip install torch=={pin} --index-url https://download.pytorch.org/whl/cpu"
    for page in (ROOT / "README.md", ROOT / "docs" / "install.md"):
        assert command in page.read_text(encoding="utf-8"), page.name
    assert "python tools/check_torch_build.py" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("cpu_index, code", [(CPU_BUILD, 0), (PYPI_LINUX, 1), (None, 2)])
def test_its_exit_status_says_what_the_cpu_index_gave(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str],
                                                     cpu_index: Optional[str], code: int) -> None:
    def dry_run(pin: str, index: Optional[str]) -> check_torch_build.DryRun:
        if index == check_torch_build.CPU_INDEX:
            if cpu_index is None:
                return check_torch_build.DryRun({}, 0.0, "https://download.pytorch.org/whl/cpu cannot be reached")
            return check_torch_build.parse(cpu_index, 0)
        return check_torch_build.parse(PYPI_LINUX if index == check_torch_build.PYPI else CPU_BUILD, 0)

    monkeypatch.setattr(check_torch_build, "dry_run", dry_run)
    assert check_torch_build.main([]) == code
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("torch==2.13.0 (requirements-dev.txt's pin), pip install --dry-run")
    assert out[1].startswith("  PyPI (https://pypi.org/simple): torch 2.13.0: the CUDA build")
    assert out[2].startswith("  PyTorch's CPU index (https://download.pytorch.org/whl/cpu): ")
    assert out[3] == "  pip as configured here: torch 2.13.0+cpu: the CPU build (no CUDA package); 10 packages"
