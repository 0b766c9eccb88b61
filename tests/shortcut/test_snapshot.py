"""Snapshots a task shortcut replays: every tensor comes back as it was cached, requires_grad included."""

from __future__ import annotations

from typing import List

import pytest
import torch

from swpipeline import IterContext, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
from swpipeline.shortcut.snapshot import cache_val, restore_val

GRAD_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]


@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
def test_every_dtype_that_can_require_grad_is_restored_requiring_it(dtype: torch.dtype) -> None:
    made = torch.ones(3, dtype=dtype, requires_grad=True) * 2
    cached = cache_val({"t": made, "plain": made.detach()})
    for _ in range(2):
        restored = restore_val(cached)
        assert restored["t"].dtype == dtype and restored["t"].requires_grad and restored["t"].is_leaf
        assert not restored["plain"].requires_grad
        assert torch.equal(restored["t"].detach(), made.detach())


def test_integer_tensors_never_require_grad() -> None:
    assert not restore_val(cache_val(torch.arange(3))).requires_grad


def test_a_replayed_complex_tensor_still_trains() -> None:
    weight = torch.tensor([1.0 + 2.0j, -0.5j], dtype=torch.complex64, requires_grad=True)
    seen: List[bool] = []

    def make(ctx: IterContext) -> None:
        ctx.z = weight * ctx.batch

    def use(ctx: IterContext) -> None:
        seen.append(ctx.z.requires_grad)
        ctx.z.abs().sum().backward()

    m, u = PipelineTask("Make", make), PipelineTask("Use", use)
    pipe = SWPipeline(PipelinePlan({m: TaskSchedule(stage=0), u: TaskSchedule(stage=1)}, intra_iter_deps=[(u, m)]),
                      device="cpu")
    pipe.enable_shortcut("Make")
    pipe.run([1.0, 2.0, 3.0])  # the first caches, the others replay
    assert seen == [True, True, True]
