"""swpipeline.pp with its stages on a CUDA GPU: exact, bit for bit, against the one-process model on that GPU.

NCCL refuses two ranks on one GPU, so on a machine with one GPU these tests take the two
ways that remain:

* two gloo ranks share the GPU: every stage computes on the GPU, and the messages between
  the ranks go through host memory (the transport packs them on the CPU when the group is
  gloo's, and a stage moves what it receives onto its device);
* one rank holds every stage, as an interleaved schedule places them: no message leaves the
  process.

Each rank compares its stages' gradients with the one-process model's, computed on the same
GPU from the same weights and microbatches. cuBLAS is asked for its deterministic workspace,
so that a stream of another library thread does not pick another reduction order. Skipped
without a GPU.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import pytest
import torch

from dist_harness import run_on_ranks
from test_pp_support import exact_on_rank

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(autouse=True)
def deterministic_cublas(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuBLAS's deterministic workspace for the ranks, which inherit this process's environment (restored after)."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def _on_gpu(world: int, configs: Sequence[Tuple[str, int, int]], compare_torch: bool) -> List[Dict[str, Any]]:
    results = run_on_ranks(exact_on_rank, world, 240, configs=list(configs), compare_torch=compare_torch,
                           device="cuda")
    return [r for per_rank in results for r in per_rank]


def test_two_ranks_sharing_one_gpu_are_exact_on_every_kind_of_schedule() -> None:
    configs = [("ScheduleGPipe", 4, 1), ("Schedule1F1B", 4, 1), ("Schedule1F1B", 8, 1),
               ("ScheduleInterleaved1F1B", 4, 2), ("ScheduleInterleavedZeroBubble", 4, 2),
               ("ScheduleZBVZeroBubble", 4, 2), ("ScheduleDualPipeV", 4, 2)]
    # torch's schedules are not run here: gloo sends only CPU tensors, and torch's stages post theirs from the GPU
    results = _on_gpu(2, configs, compare_torch=False)
    assert len(results) == 2 * len(configs)
    wrong = [r for r in results if r["ours"] is not True or r.get("losses") is False]
    assert not wrong, wrong


def test_one_rank_holding_every_stage_is_exact() -> None:
    configs = [("ScheduleGPipe", 4, 1), ("ScheduleInterleaved1F1B", 4, 2), ("ScheduleInterleaved1F1B", 8, 4),
               ("ScheduleInterleavedZeroBubble", 4, 2), ("ScheduleZBVZeroBubble", 4, 2)]
    results = _on_gpu(1, configs, compare_torch=False)
    assert len(results) == len(configs)
    assert [r["ours"] for r in results] == [True] * len(configs), results
    assert all(r["losses"] is True for r in results), results
