"""The package's public surface: exported names and the seed's import paths."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import swpipeline

EXPORTED = {
    "CPUDevice", "DataFlowPipeline", "DeclaredIO", "DependencyTimeoutError", "Device", "FreedAttributeError",
    "IterContext", "PipelinePlan", "PipelineTask", "PipelineTimeoutError", "ProfileResult", "ProgressTimeoutError",
    "SWPipeline", "SequencerTimeoutError", "SharedStreamWarning", "SimulatedDevice", "TaskProfiler", "TaskSchedule",
    "TorchDevice",
    "DependencyWait", "RunStats", "TaskRecord", "TaskStats", "Timeline",
    "PlanAnalysis", "RaceChecker", "RaceError", "analyze", "infer_deps", "task_generator",
    "VersionStats", "WeightVersions",
    "EngineOverheads", "PathStep", "PlanSearch", "SimResult", "SimUnit", "TaskCost", "TaskCosts", "autoplan",
    "calibrate", "search_plan", "simulate",
}


def test_exported_names() -> None:
    assert set(swpipeline.__all__) == EXPORTED
    for name in EXPORTED:
        assert getattr(swpipeline, name).__module__.startswith("swpipeline.")


SUBPACKAGES_WITH_AN_API = {"swpipeline.torchrec", "swpipeline.gpipe", "swpipeline.embcache", "swpipeline.pp"}
# modules of swpipeline.pp named and shaped as torch.distributed.pipelining's (code written against torch's imports
# them by module), and what each exports
MIRRORS_OF_TORCH = {
    "swpipeline.pp.microbatch": ["TensorChunkSpec", "merge_chunks", "split_args_kwargs_into_chunks"],
    "swpipeline.pp.backward": ["stage_backward", "stage_backward_input", "stage_backward_weight"],
}


def test_internal_modules_export_nothing() -> None:
    # Every module but the package itself and the subpackages that are systems of their own (whose
    # __init__ exports their names) says __all__ = [].
    found = [m.name for m in pkgutil.walk_packages(swpipeline.__path__, "swpipeline.")]
    try:  # an optional dependency; "torchrec" alone could be the tests' folder of that name
        with_torchrec = importlib.util.find_spec("torchrec.distributed") is not None
    except ModuleNotFoundError:
        with_torchrec = False
    expected = {"swpipeline.engine.pipeline", "swpipeline.analysis.checker"}
    assert expected | ({"swpipeline.torchrec.plans"} if with_torchrec else set()) <= set(found)
    for name in found:
        if name.endswith(".__main__"):  # `python -m swpipeline.cli`: importing it runs the command
            continue
        if name in MIRRORS_OF_TORCH:
            assert importlib.import_module(name).__all__ == MIRRORS_OF_TORCH[name], name
        elif name not in SUBPACKAGES_WITH_AN_API:
            assert importlib.import_module(name).__all__ == [], name


PIPELINE_API = {
    "abandon", "advance", "contexts_in_flight", "disable_shortcut", "drain", "enable_shortcut", "fill_pipeline",
    "last_context", "peak_live_contexts", "progress", "run", "run_one_serial_iter", "run_serial", "serial_order",
    "shortcuts", "stats", "timeline", "tracing", "without_shortcuts",
}
CLOCKED_ONLY = {"enqueue_order", "format_schedule", "format_stage_analysis", "print_schedule",
                "print_stage_analysis", "save_schedule_chart"}


def test_pipeline_public_methods() -> None:
    assert {name for name in dir(swpipeline.DataFlowPipeline) if not name.startswith("_")} == PIPELINE_API
    assert {name for name in dir(swpipeline.SWPipeline) if not name.startswith("_")} == PIPELINE_API | CLOCKED_ONLY


def test_iter_context_has_only_its_engine_fields() -> None:
    assert {name for name in dir(swpipeline.IterContext) if not name.startswith("_")} == {"batch", "iter_idx"}


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
