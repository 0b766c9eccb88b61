"""Ours against TorchRec's own Fused, SemiSync, Prefetch, EvalFused and Staged pipelines, step for step.

These TorchRec classes do not run on the CPU as shipped (docs/torchrec.md says
where they fail). Two stream calls that have no meaning on the CPU are the whole
problem: ``Tensor.record_stream`` with a CPU stream, and ``torch.cuda.current_stream()``
in a CPU build. In a separate pair of rank processes the test turns both into
no-ops (``torchrec_scenarios._install_cpu_shim``; Prefetch also gets a stand-in
data-dist stream, without which TorchRec skips the prefetch; Staged gets stand-in
stage streams), runs TorchRec's classes, and compares every step's logits with
ours: bitwise equal, including SemiSync's stale-embedding steps with and without
``stash_gradients``.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

pytest.importorskip("torchrec.distributed")  # not "torchrec": without it, this folder imports as that name

import torch  # noqa: E402

import torchrec_scenarios  # noqa: E402
from dist_harness import run_on_ranks  # noqa: E402


@pytest.fixture(scope="module")
def ranks() -> List[Dict[str, Any]]:
    return run_on_ranks(torchrec_scenarios.torchrec_with_cpu_shim, world_size=2, timeout=180)


RUNS = ["TrainPipelineFusedSparseDist{}", "TrainPipelineFusedSparseDist{'execute_all_batches': False}",
        "TrainPipelineSemiSync{'start_batch': 3}", "TrainPipelineSemiSync{'start_batch': 3, 'stash_gradients': True}",
        "PrefetchTrainPipelineSparseDist{}", "EvalPipelineFusedSparseDist{}"]


@pytest.mark.parametrize("run", RUNS)
def test_equals_torchrecs_class_step_for_step(ranks: List[Dict[str, Any]], run: str) -> None:
    for rank, res in enumerate(ranks):
        ours, theirs = res[f"ours/{run}"], res[f"torchrec/{run}"]
        assert ours.shape == theirs.shape, f"rank {rank} {run}: {ours.shape[0]} steps vs TorchRec's {theirs.shape[0]}"
        assert torch.equal(ours, theirs), f"rank {rank} {run}: {(ours - theirs).abs().max().item():.3g}"


def test_staged_equals_torchrecs_staged_pipeline(ranks: List[Dict[str, Any]]) -> None:
    for rank, res in enumerate(ranks):
        assert torch.equal(res["ours/StagedTrainPipeline"], res["torchrec/StagedTrainPipeline"]), f"rank {rank}"
        # TorchRec calls data_exhausted_callback at every step after the end; ours once
        ours, theirs = res["ours/StagedTrainPipeline/callbacks"], res["torchrec/StagedTrainPipeline/callbacks"]
        assert ours["fill"] == theirs["fill"]
