"""The package's public surface: exported names and the seed's import paths."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import swpipeline

EXPORTED = {
    "CPUDevice", "DataFlowPipeline", "DeclaredIO", "DependencyTimeoutError", "Device", "IterContext", "PipelinePlan", "PipelineTask",
    "PipelineTimeoutError", "ProfileResult", "ProgressTimeoutError", "SWPipeline", "SequencerTimeoutError", "SimulatedDevice",
    "TaskProfiler", "TaskSchedule", "TorchDevice",
    "DependencyWait", "RunStats", "TaskRecord", "TaskStats", "Timeline",
}


def test_exported_names() -> None:
    assert set(swpipeline.__all__) == EXPORTED
    for name in EXPORTED:
        assert getattr(swpipeline, name).__module__.startswith("swpipeline.")


def test_internal_modules_export_nothing() -> None:
    for mod in ("plan", "ordering", "device", "signals", "worker", "base", "clocked", "dataflow", "tables", "errors",
                "runtime", "progress_line", "shortcut", "profiler", "timeline", "trace_export", "charts", "stats",
                "annotations"):
        assert importlib.import_module(f"swpipeline.{mod}").__all__ == []


def test_seed_import_paths_are_aliases() -> None:
    import sw_pipeline

    assert sw_pipeline.SWPipeline is swpipeline.SWPipeline
    assert sw_pipeline.PipelinePlan is swpipeline.PipelinePlan
    assert set(sw_pipeline.__all__) == EXPORTED
    from dataflow_pipeline import DataFlowPipeline

    assert DataFlowPipeline is swpipeline.DataFlowPipeline


def test_mypy_strict_is_clean() -> None:
    api = pytest.importorskip("mypy.api")
    root = Path(__file__).resolve().parents[1]
    out, err, status = api.run(["--config-file", str(root / "pyproject.toml"), str(root / "src")])
    assert status == 0, out + err


def test_py_typed_is_shipped() -> None:
    assert (Path(swpipeline.__file__).parent / "py.typed").exists()
