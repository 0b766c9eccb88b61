"""swpipeline.pp's public surface: the names it exports, under torch.distributed.pipelining's names."""

from __future__ import annotations

import inspect

import pytest
from torch import nn

import swpipeline.pp as pp

EXPORTED = {
    "Action", "Kind", "Pipe", "SplitPoint", "build_stage", "pipe_split", "pipeline",
    "PipelineRankError", "PipelineSchedule", "PipelineScheduleMulti", "PipelineScheduleSingle",
    "PipelineStage", "RankTimeoutError", "Schedule1F1B", "ScheduleFromActions", "ScheduleGPipe", "ScheduleHangError",
    "ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble", "ScheduleLoopedBFS", "ScheduleMismatchError",
    "ScheduleZBVZeroBubble",
    "ScheduleDualPipeV", "StageCosts", "autoplan",
    "simulate", "clip_grad_norm_", "TiedWeight",
}


def test_exported_names() -> None:
    assert set(pp.__all__) == EXPORTED
    for name in EXPORTED - {"SplitPoint", "pipe_split"}:  # torch's own markers: torch's tracer reads them
        assert getattr(pp, name).__module__.startswith("swpipeline.pp."), name
    import torch.distributed.pipelining as torch_pp

    assert (pp.SplitPoint, pp.pipe_split) == (torch_pp.SplitPoint, torch_pp.pipe_split)
    assert set(torch_pp.__all__) <= set(pp.__all__)  # every public name of torch's


def test_same_names_and_arguments_as_torch_s() -> None:
    import torch.distributed.pipelining as torch_pp

    for name in ("pipeline", "build_stage", "PipelineStage", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
                 "ScheduleInterleavedZeroBubble", "ScheduleLoopedBFS", "ScheduleZBVZeroBubble", "ScheduleDualPipeV"):
        ours = inspect.signature(getattr(pp, name)).parameters
        theirs = inspect.signature(getattr(torch_pp, name)).parameters
        positional = [p for p in theirs.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
        # every argument of torch's, in the same place, with the same default (ours may add keyword-only ones)
        assert list(ours)[:len(positional)] == [p.name for p in positional], name
        for p in positional:
            assert ours[p.name].default == p.default, (name, p.name)
    step = inspect.signature(pp.PipelineSchedule.step).parameters
    assert list(step)[1:4] == ["args", "target", "losses"]


def test_a_stage_needs_an_initialized_process_group() -> None:
    with pytest.raises(RuntimeError, match=r"torch.distributed is not initialized; call "
                                           r"torch.distributed.init_process_group\(\) first"):
        pp.PipelineStage(nn.Linear(2, 2), 0, 2, "cpu")
    with pytest.raises(ValueError, match="stage_index 2 is out of range for num_stages=2"):
        pp.PipelineStage(nn.Linear(2, 2), 2, 2, "cpu")
    with pytest.raises(TypeError, match="submodule must be an nn.Module"):
        pp.PipelineStage(lambda x: x, 0, 2, "cpu")  # type: ignore[arg-type]
