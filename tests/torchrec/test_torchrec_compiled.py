"""The compiled variants (PT2, compiled autograd): ours vs TorchRec's vs a plain loop, on 2 gloo ranks.

TorchRec's TrainPipelineSparseDistCompAutograd runs on the CPU given two settings
(docs/torchrec.md): DDP's Python reducer, chosen before the model is wrapped, and
``fullgraph=False``. The default backend here is ``eager`` (dynamo capture without
code generation, exact and fast); SWP_TEST_COMPILE_BACKEND=inductor runs the real
compiler (then the outputs agree within 1e-6, not bitwise).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

import pytest

pytest.importorskip("torchrec.distributed")  # not "torchrec": without it, this folder imports as that name

import torch  # noqa: E402

import torchrec_scenarios  # noqa: E402
from dist_harness import run_on_ranks  # noqa: E402

EXACT = os.environ.get("SWP_TEST_COMPILE_BACKEND", "eager") in ("eager", "aot_eager")


@pytest.fixture(scope="module")
def ranks() -> List[Dict[str, Any]]:
    return run_on_ranks(torchrec_scenarios.compiled, world_size=2, timeout=400)


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.equal(got, want) if EXACT else torch.allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["TrainPipelinePT2", "TrainPipelineSparseDistCompAutograd"])
def test_compiled_variant_equals_torchrec_and_the_plain_loop(ranks: List[Dict[str, Any]], name: str) -> None:
    for rank, res in enumerate(ranks):
        ours, theirs = res[f"ours/{name}"], res[f"torchrec/{name}"]
        assert ours.shape == theirs.shape == res["ref"].shape, f"rank {rank} {name}: step counts differ"
        assert close(ours, theirs), f"rank {rank} {name}: {(ours - theirs).abs().max().item():.3g} from TorchRec"
        assert close(ours, res["ref"]), (f"rank {rank} {name}: {(ours - res['ref']).abs().max().item():.3g} from the "
                                         f"loop")
