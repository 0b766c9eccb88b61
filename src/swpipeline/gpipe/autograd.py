"""The gathered output's autograd node: its backward runs GPipe's backward pipeline.

``GPipe.forward`` returns ``gathered(...)``: the last partition's outputs,
concatenated, as the output of one autograd node whose inputs are the mini-batch's
input tensors and every parameter that receives a gradient. When autograd reaches
that node, its backward hands the output gradient to the backward pipeline
(``BackwardPass.run``) and returns

* for each input tensor that requires grad: the micro-batches' input gradients,
  concatenated;
* for each parameter: its gradient summed over the micro-batches, which autograd
  then accumulates into ``.grad`` as for any other use of the parameter.

So ``loss.backward()``, ``torch.autograd.grad(loss, params)``, gradient hooks and
``.grad`` accumulation across steps all behave as for an ordinary module. What an
ordinary module also supports and this node does not: a second backward through
the same output (``retain_graph=True``; the activations are freed as the first one
goes) and higher-order gradients (``create_graph=True``).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..engine.clocked import SWPipeline
from .cells import GradSum, MiniBatch
from .microbatch import gather, split_like

__all__: List[str] = []


class BackwardPass:
    """Runs the backward pipeline over one mini-batch; one per GPipe.

    Args:
        pipeline: the backward plan's engine.
        lock: held while a pass runs; the GPipe's forward holds it too (one pass at a time).
    """

    def __init__(self, pipeline: SWPipeline, lock: threading.Lock) -> None:
        self.pipeline = pipeline
        self._lock = lock

    def run(self, mini: MiniBatch, output_grads: Sequence[Tensor]) -> Tuple[Optional[Tensor], ...]:
        """Backpropagate the gathered output's gradients through every micro-batch.

        Args:
            mini: the forward pass.
            output_grads: one gradient per gathered output tensor.

        Returns:
            The gradient of each input tensor (None where it needs none), then the sum of
            each parameter's gradients (None where none reached it), in ``mini.params`` order.
        """
        micro_batches = mini.micro_batches
        pieces = split_like(output_grads, [mb.value for mb in micro_batches])
        for mb, piece in zip(micro_batches, pieces):
            mb.grad = tuple(piece)
        mini.grad_sums = [[GradSum() for _ in params] for params in mini.params]
        with self._lock:
            mini.streams.fence_in()
            self.pipeline.run(list(reversed(micro_batches)))
        param_grads = [total.total for sums in mini.grad_sums for total in sums]
        mini.streams.fence_out([*(g for mb in micro_batches for g in mb.grad), *param_grads])
        input_grads = [self._input_grad(mini, j) for j in range(len(mini.inputs))]  # on the caller's stream
        mini.micro_batches, mini.grad_sums = [], []
        return (*input_grads, *param_grads)

    @staticmethod
    def _input_grad(mini: MiniBatch, j: int) -> Optional[Tensor]:
        if not mini.inputs[j].requires_grad:
            return None
        pieces = [mb.grad[j] for mb in mini.micro_batches]
        return torch.cat([p for p in pieces if p is not None])


class _Gathered(torch.autograd.Function):
    """Forward: concatenate the micro-batches' outputs. Backward: ``BackwardPass.run``."""

    @staticmethod
    def forward(ctx: Any, backward: BackwardPass, mini: MiniBatch, *inputs_and_params: Tensor) -> Any:
        ctx.backward_pass, ctx.mini = backward, mini
        outputs = gather([mb.value for mb in mini.micro_batches])
        constant = [t for t in outputs if not (t.is_floating_point() or t.is_complex())]
        if constant:
            ctx.mark_non_differentiable(*constant)
        return outputs[0] if mini.output_atomic else outputs

    @staticmethod
    def backward(ctx: Any, *output_grads: Tensor) -> Tuple[Optional[Tensor], ...]:
        mini: Optional[MiniBatch] = ctx.mini
        if mini is None:
            raise RuntimeError("backward through a GPipe output a second time: the first backward freed the "
                               "micro-batches' activations as it went (retain_graph=True is not supported); run "
                               "the forward again")
        ctx.mini = None
        if torch.is_grad_enabled():
            raise RuntimeError("backward through a GPipe output with create_graph=True: the partitions' backward "
                               "runs as a pipeline of its own and records no graph of the gradients, so higher-order "
                               "gradients are not supported; call backward() without create_graph")
        grads = ctx.backward_pass.run(mini, output_grads)
        return (None, None, *grads)


_apply: Callable[..., Any] = _Gathered.apply  # typed handle on the untyped autograd entry point


def gathered(backward: BackwardPass, mini: MiniBatch) -> Any:
    """The gathered output (a tensor, or a tuple as the last partition returns), wired to ``backward``."""
    params = [p for params in mini.params for p in params]
    return _apply(backward, mini, *mini.inputs, *params)
