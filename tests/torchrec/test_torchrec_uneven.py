"""Uneven data across ranks (TorchRec issues #1014, #4158): with ``stop_together`` nobody hangs.

Rank 0 has 7 batches, rank 1 has 10. Without agreement rank 0 would stop after its
7th step while rank 1 waits forever in the next all-to-all. With
``stop_together=True`` every rank ends at step 7, and the 7 steps equal a plain loop
over the first 7 batches of each rank, for several variants and options.
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
    return run_on_ranks(torchrec_scenarios.uneven, world_size=2, timeout=120)


@pytest.mark.parametrize("run", ["TrainPipelineSparseDist", "TrainPipelineBase", "TrainPipelineSemiSync",
                                 "prep_thread"])
def test_every_rank_stops_at_the_shortest_ranks_step(ranks: List[Dict[str, Any]], run: str) -> None:
    for rank, res in enumerate(ranks):
        assert res[run].shape[0] == 7, f"rank {rank} {run}: {res[run].shape[0]} steps"
        assert torch.equal(res[run], res["ref"]), f"rank {rank} {run}"


def test_with_execute_all_batches_false_the_ranks_stop_together_earlier(ranks: List[Dict[str, Any]]) -> None:
    for res in ranks:
        assert torch.equal(res["execute_all_batches=False"], res["ref"][:5])
