"""ruff finds nothing: the rules are pyproject.toml's ``[tool.ruff]`` (pyflakes, pycodestyle errors and warnings).

ruff is pinned in requirements-dev.txt, so a test environment without it is a broken one:
the check fails there, naming the install command, instead of skipping.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["src", "tests", "benchmarks", "examples", "tools"]


def ruff(*args: str, cwd: Path = ROOT) -> "subprocess.CompletedProcess[str]":
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed, and it is pinned in requirements-dev.txt: run "
                    "`pip install -r requirements-dev.txt` (the lint check fails rather than skips)", pytrace=False)
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_ruff_check_is_clean() -> None:
    result = ruff(*PATHS)
    if result.returncode != 0:
        pytest.fail(f"ruff check {' '.join(PATHS)}\n{result.stdout}{result.stderr}", pytrace=False)


def test_ruff_sees_what_it_should_with_the_projects_rules(tmp_path: Path) -> None:
    # The check above must be able to fail: with the project's configuration, an unused import and a line over
    # 120 columns are found.
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "probe.py").write_text("import os\n" + "x = " + repr("a" * 120) + "\n")
    result = ruff("probe.py", cwd=tmp_path)
    codes: List[str] = sorted(line.split(": ")[1].split(" ")[0] for line in result.stdout.splitlines()
                              if line.startswith("probe.py:"))
    assert (result.returncode, codes) == (1, ["E501", "F401"])
