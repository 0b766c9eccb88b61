"""Importing swpipeline.torchrec says in one sentence what to install when TorchRec cannot load."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _compat() -> object:
    """swpipeline/torchrec/compat.py alone (importing the package would import TorchRec itself)."""
    spec = importlib.util.spec_from_file_location("swpipeline_torchrec_compat", SRC / "swpipeline/torchrec/compat.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mismatch_message = getattr(_compat(), "mismatch_message")


def test_the_message_names_both_releases_and_the_fix() -> None:
    assert mismatch_message("2.14.1+cpu", "1.8.0", "undefined symbol: _ZN3c104impl") == (
        "swpipeline.torchrec: fbgemm-gpu-cpu 1.8.0 is built for torch 2.13, but torch 2.14.1+cpu is installed, so "
        "TorchRec cannot load its kernels (undefined symbol: _ZN3c104impl); install torch 2.13 (pip install "
        "'torch==2.13.*'), or: pip install \"swpipeline[torchrec]\" && pip install --no-deps torchrec==1.8.0")
    assert mismatch_message("2.15.0", "1.9.0", "undefined symbol: x") == (
        "swpipeline.torchrec: fbgemm-gpu-cpu 1.9.0 is built for another torch release, but torch 2.15.0 is "
        "installed, so TorchRec cannot load its kernels (undefined symbol: x); install the fbgemm-gpu-cpu release "
        "built for it, or: pip install \"swpipeline[torchrec]\" && pip install --no-deps torchrec==1.8.0")
    assert mismatch_message("2.13.0", None, "undefined symbol: x").startswith(
        "swpipeline.torchrec: TorchRec failed to load its native kernels with torch 2.13.0 (undefined symbol: x); "
        "TorchRec 1.8.0 needs fbgemm-gpu-cpu 1.8.0 and torch 2.13")


def _import_with_fake_torchrec(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "torchrec"
    fake.mkdir()
    (fake / "__init__.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SRC)])}
    return subprocess.run([sys.executable, "-c", "import swpipeline.torchrec"], env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_torchrec_whose_kernels_do_not_load_gives_one_import_error(tmp_path: Path) -> None:
    result = _import_with_fake_torchrec(
        tmp_path, 'raise OSError("/site/fbgemm_gpu/fbgemm_gpu_py.so: undefined symbol: _ZN3c1017RegisterOperators")\n')
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: swpipeline.torchrec: ")
    assert "undefined symbol: _ZN3c1017RegisterOperators" in last
    assert "pip install --no-deps torchrec==1.8.0" in last


def test_a_missing_dependency_inside_torchrec_is_not_reported_as_torchrec_missing(tmp_path: Path) -> None:
    result = _import_with_fake_torchrec(tmp_path, "import a_module_nobody_has\n")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ImportError: swpipeline.torchrec: TorchRec needs 'a_module_nobody_has', which is not installed: pip install "
        "\"swpipeline[torchrec]\" && pip install --no-deps torchrec==1.8.0")
