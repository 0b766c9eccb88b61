"""PipelineStage(dw_builder=...): a stage that computes its weights' gradients itself, as torch's protocol has it.

The stage's layers defer their weight gradients: their backward computes the input's
gradient and keeps what the weight's needs. ``dw_builder()`` returns the function that
computes them for the microbatch just backpropagated. Under a zero-bubble schedule ``I`` runs
the whole backward and keeps that function, ``W`` calls it; under 1F1B the whole backward is
followed by ``dw_builder()()`` at once. Both against the same layers in one process, bit for
bit, and each microbatch's weight gradients computed once, in microbatch order.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import nn

from dist_harness import run_on_ranks
from test_pp_support import loss_fn, make_batch

WIDTH, STAGES = 8, 4


class _Deferred(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, owner: "DeferredLinear"
                ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.owner = owner
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        ctx.owner.pending.append((x.detach(), grad.detach()))
        return grad @ weight, None, None, None


class DeferredLinear(nn.Module):
    """A linear layer whose backward leaves its weight's gradient for later (``flush``)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        layer = nn.Linear(WIDTH, WIDTH)
        self.weight, self.bias = layer.weight, layer.bias
        self.pending: List[Tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(_Deferred.apply(x, self.weight, self.bias, self))

    def take(self) -> Callable[[], None]:
        """The function computing the weight gradients of the oldest microbatch backpropagated."""
        x, grad = self.pending.pop(0)

        def compute() -> None:
            for param, value in ((self.weight, grad.t() @ x), (self.bias, grad.sum(0))):
                param.grad = value if param.grad is None else param.grad + value

        return compute


def stage_layer(stage: int) -> DeferredLinear:
    return DeferredLinear(seed=stage)


def builder(layer: DeferredLinear, calls: List[Any], stage: int) -> Callable[[], Callable[[], None]]:
    def build() -> Callable[[], None]:
        compute = layer.take()

        def run() -> None:
            calls.append(stage)
            compute()

        return run

    return build


def dw_on_rank(rank: int, world: int, schedule: str, n: int) -> Dict[str, Any]:
    import swpipeline.pp as pp

    local = STAGES // world if schedule != "Schedule1F1B" else 1
    num_stages = world * local
    calls: List[int] = []
    layers = {s: stage_layer(s) for s in range(rank, num_stages, world)}
    stages = [pp.PipelineStage(layer, s, num_stages, torch.device("cpu"), dw_builder=builder(layer, calls, s))
              for s, layer in layers.items()]
    cls = getattr(pp, schedule)
    sched = cls(stages[0] if schedule == "Schedule1F1B" else stages, n, loss_fn=loss_fn)
    x, y = make_batch(1, width=WIDTH)
    sched.step(*((x,) if 0 in layers else ()), **({"target": y} if num_stages - 1 in layers else {}))
    return {"grads": {s: [p.grad.clone() for p in layer.parameters()] for s, layer in layers.items()},
            "calls": calls, "pending": sum(len(layer.pending) for layer in layers.values())}


def reference(num_stages: int, n: int) -> Dict[int, List[torch.Tensor]]:
    """The same layers in one process: each microbatch's backward, then its weight gradients, then scaled."""
    layers = [stage_layer(s) for s in range(num_stages)]
    model = nn.Sequential(*layers)
    x, y = make_batch(1, width=WIDTH)
    for xm, ym in zip(torch.tensor_split(x, n), torch.tensor_split(y, n)):
        loss_fn(model(xm), ym).backward()
        for layer in reversed(layers):
            layer.take()()
    return {s: [p.grad / n for p in layer.parameters()] for s, layer in enumerate(layers)}


def _check(schedule: str, n: int, num_stages: int) -> None:
    results = run_on_ranks(dw_on_rank, 2, 120, schedule=schedule, n=n)
    want = reference(num_stages, n)
    for rank, got in enumerate(results):
        assert got["pending"] == 0
        for s, grads in got["grads"].items():
            assert all(torch.equal(g, w) for g, w in zip(grads, want[s])), (schedule, rank, s)
            assert got["calls"].count(s) == n  # once per microbatch


def test_dw_builder_under_a_zero_bubble_schedule_is_exact() -> None:
    _check("ScheduleInterleavedZeroBubble", 4, STAGES)


def test_dw_builder_under_a_whole_backward_runs_at_once_and_is_exact() -> None:
    _check("Schedule1F1B", 3, 2)


def test_dw_builder_must_be_a_function() -> None:
    import swpipeline.pp as pp

    results = run_on_ranks(_refused_on_rank, 2, 60)
    assert results == ["PipelineStage: dw_builder must be None or a function returning the function that computes "
                       "the weight gradients, got int"] * 2
    assert pp.PipelineStage is not None


def _refused_on_rank(rank: int, world: int) -> str:
    import swpipeline.pp as pp

    try:
        pp.PipelineStage(nn.Linear(2, 2), rank, world, torch.device("cpu"), dw_builder=3)  # type: ignore[arg-type]
    except TypeError as exc:
        return str(exc)
    return "accepted"
