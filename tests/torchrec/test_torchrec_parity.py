"""Our TorchRec pipelines against TorchRec's own and a plain loop, on 2 real gloo ranks (CPU).

One spawn (``torchrec_scenarios.parity``) runs every variant on both ranks with the
same DLRM (identical initialisation) and the same batches; the tests below compare
the logits of every step, exactly:

* where TorchRec's class runs on the CPU (Base, SparseDist, SparseDistLite,
  EvalSparseDist), ours equals TorchRec's step for step and StopIteration comes
  at the same step, options included;
* every variant equals the plain non-pipelined loop (SemiSync: a loop with
  TorchRec's stale-embedding behaviour), as TorchRec's test_equal_to_non_pipelined.

PT2 and compiled autograd are in test_torchrec_compiled.py.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest

pytest.importorskip("torchrec.distributed")  # not "torchrec": without it, this folder imports as that name

import torch  # noqa: E402

import torchrec_scenarios  # noqa: E402
from dist_harness import run_on_ranks  # noqa: E402


@pytest.fixture(scope="module")
def ranks() -> List[Dict[str, Any]]:
    return run_on_ranks(torchrec_scenarios.parity, world_size=2, timeout=240)


def assert_equal_steps(got: Optional[torch.Tensor], want: Optional[torch.Tensor], what: str) -> None:
    if want is None or got is None:
        assert got is None and want is None, (f"{what}: one run had steps, the other none "
                                              f"({got is None}, {want is None})")
        return
    assert got.shape == want.shape, f"{what}: {got.shape[0]} steps vs {want.shape[0]}"
    assert torch.equal(got, want), f"{what}: max difference {(got - want).abs().max().item():.3g}"


TORCHREC_ON_CPU = ["TrainPipelineBase", "TrainPipelineSparseDist", "TrainPipelineSparseDistLite",
                   "EvalPipelineSparseDist"]


@pytest.mark.parametrize("name", TORCHREC_ON_CPU)
def test_equals_torchrec_step_for_step(ranks: List[Dict[str, Any]], name: str) -> None:
    for rank, res in enumerate(ranks):
        assert_equal_steps(res[f"ours/{name}"], res[f"torchrec/{name}"], f"rank {rank} {name}")


TRAINING = ["TrainPipelineBase", "TrainPipelineSparseDist", "TrainPipelineSparseDistLite",
            "TrainPipelineFusedSparseDist", "PrefetchTrainPipelineSparseDist", "TrainPipelineSemiSync",
            "Fused/data_dist", "Fused/current", "lockstep=False", "caller_thread=False", "prep_thread",
            "enqueue_batch_after_forward"]


@pytest.mark.parametrize("name", TRAINING)
def test_training_equals_non_pipelined(ranks: List[Dict[str, Any]], name: str) -> None:
    for rank, res in enumerate(ranks):
        assert_equal_steps(res[f"ours/{name}"], res["ref"], f"rank {rank} {name}")


@pytest.mark.parametrize("name", ["EvalPipelineSparseDist", "EvalPipelineFusedSparseDist", "EvalFused/prefetch"])
def test_eval_equals_plain_forward(ranks: List[Dict[str, Any]], name: str) -> None:
    for rank, res in enumerate(ranks):
        assert_equal_steps(res[f"ours/{name}"], res["ref_eval"], f"rank {rank} {name}")


@pytest.mark.parametrize("stash", [False, True])
def test_semi_sync_equals_its_stale_weight_reference(ranks: List[Dict[str, Any]], stash: bool) -> None:
    for rank, res in enumerate(ranks):
        ours = res[f"ours/SemiSync/stash={stash}"]
        assert_equal_steps(ours, res[f"ref/SemiSync/stash={stash}"], f"rank {rank} SemiSync stash={stash}")
        # ... and the staleness is real: from step start_batch + 1 = 4 on it differs from synchronous training
        assert torch.equal(ours[:4], res["ref"][:4])
        assert not torch.equal(ours[4:], res["ref"][4:])


@pytest.mark.parametrize("option", ["execute_all_batches=False", "enqueue_batch_after_forward", "lr_between_steps",
                                    "custom_model_fwd", "detach_attach", "detach_attach/probe"])
def test_options_equal_torchrec(ranks: List[Dict[str, Any]], option: str) -> None:
    for rank, res in enumerate(ranks):
        assert_equal_steps(res[f"ours/{option}"], res[f"torchrec/{option}"], f"rank {rank} {option}")


def test_custom_model_fwd_is_used(ranks: List[Dict[str, Any]]) -> None:
    for res in ranks:
        assert_equal_steps(res["ours/custom_model_fwd"], res["ref/custom_model_fwd"], "custom_model_fwd (2x loss)")
        assert not torch.equal(res["ours/custom_model_fwd"], res["ref"])


def test_lr_changed_between_steps_applies_from_the_next_step(ranks: List[Dict[str, Any]]) -> None:
    for res in ranks:  # lockstep: step 5 is the first to see the new LR, exactly as in TorchRec
        assert torch.equal(res["ours/lr_between_steps"][:5], res["ref"][:5])
        assert not torch.equal(res["ours/lr_between_steps"][5:], res["ref"][5:])


@pytest.mark.parametrize("count", [0, 1, 2, 3])
@pytest.mark.parametrize("execute_all", [True, False])
def test_stop_iteration_at_torchrecs_step(ranks: List[Dict[str, Any]], count: int, execute_all: bool) -> None:
    for rank, res in enumerate(ranks):
        key = f"short/{count}/{execute_all}"
        assert_equal_steps(res[f"ours/{key}"], res[f"torchrec/{key}"], f"rank {rank} {count} batches")


@pytest.mark.parametrize("name,steps", [("TrainPipelineFusedSparseDist", 8), ("PrefetchTrainPipelineSparseDist", 8),
                                        ("TrainPipelineSemiSync", 7)])
def test_execute_all_batches_false_drops_the_batches_in_flight(ranks: List[Dict[str, Any]], name: str,
                                                               steps: int) -> None:
    for res in ranks:  # TorchRec stops when step k's new batch (k + depth - 1) is missing
        got = res[f"ours/{name}/execute_all_batches=False"]
        assert_equal_steps(got, res["ref"][:steps], name)


def test_staged_equals_stages_applied_in_order(ranks: List[Dict[str, Any]]) -> None:
    for res in ranks:
        assert_equal_steps(res["ours/Staged"], res["ref/Staged"], "Staged")
        assert res["ours/Staged/callbacks"] == {"fill": 2, "exhausted": 1}
        assert res["ours/Staged/table"].split() == (
            "# Task Thread Stream | P0 P1 P2 P3 -- ----------------- ------- ------------ + ----- ----- ----- -----"
            " 0 halve default halve | -- i0 i1 i2 1 data_copy default data_copy | i0 i1 i2 i3").split()
