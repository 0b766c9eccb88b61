"""ruff finds nothing: the rules are pyproject.toml's ``[tool.ruff]`` (pyflakes, pycodestyle errors and warnings)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_is_clean() -> None:
    pytest.importorskip("ruff", reason="ruff is not installed (pip install -r requirements-dev.txt)")
    paths = ["src", "tests", "benchmarks", "examples"]
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *paths],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        pytest.fail(f"ruff check {' '.join(paths)}\n{result.stdout}{result.stderr}", pytrace=False)
