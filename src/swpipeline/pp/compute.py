"""What one compute action does to one microbatch, and the step's values it reads and leaves.

A stage's forward takes the values of its *sources* (the previous stage's output; over a
skip connection, an earlier stage's too, after it) and leaves its output for each
*consumer*. A received value is a leaf that requires grad, so the stage's backward leaves
the gradient of each input in its ``.grad``, which goes back to the stage it came from::

    F(s, m):  inputs = value from s-1 (+ skip sources) -> submodule -> output  (kept for B)
    B(s, m):  autograd.backward(output, grad of output) -> grads of the inputs, to each source
    I(s, m):  the inputs' gradients only (autograd.grad, keeping the graph; backward.py)
    W(s, m):  the parameters' gradients (autograd.backward into the parameters only; backward.py)

With a stage's ``dw_builder``, ``I`` is a whole backward, then ``dw_builder()`` kept for ``W``
to call; ``B`` is a whole backward, then ``dw_builder()()``.

The last stage's output goes to ``loss_fn(output, target)`` and its backward starts from
that loss; ``step()`` divides the summed gradients by ``n_microbatches`` at the end when
``scale_grads``. So each parameter's gradient is computed by the same operations as in one
process, summed microbatch after microbatch in the same order: the same bits.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from .actions import BWD, FWD, BWD_I, BWD_W, Action
from .backward import inputs_grad, weights_grad
from .data_parallel import backward_sync, forward_sync, outermost_sharded
from .microbatch import as_tuple
from .stage import PipelineStage
from .ties import Shares, Ties

__all__: List[str] = []

Values = Tuple[Any, ...]
Edge = Tuple[int, int, int]  # (consumer stage, microbatch, source stage): one value between two stages
_NO_TIES = contextlib.nullcontext()  # a backward's context on a rank with no exact tie (shared: it holds nothing)


class Saved(NamedTuple):
    """What a forward keeps for its backward."""

    outputs: Values
    inputs: Values
    widths: Tuple[int, ...]  # how many of the inputs came from each source, in source order


@dataclass
class StepState:
    """One step's values: the engine's batch for the step's one iteration."""

    args: List[Tuple[Any, ...]]  # per microbatch: the first stage's positional inputs
    kwargs: List[Dict[str, Any]]  # per microbatch: keyword inputs of this rank's stages
    targets: Optional[List[Any]]  # per microbatch: the last stage's target
    acts: Dict[Edge, Values] = field(default_factory=dict)  # activations arrived for a stage, by source
    outputs: Dict[Tuple[int, int], Values] = field(default_factory=dict)  # forward outputs to send or hand over
    readers_left: Dict[Tuple[int, int], int] = field(default_factory=dict)  # consumers still to read an output
    saved: Dict[Tuple[int, int], "Saved"] = field(default_factory=dict)  # what a forward keeps for its backward
    grads: Dict[Edge, Values] = field(default_factory=dict)  # gradients of an output, by the stage they come from
    input_grads: Dict[Edge, Values] = field(default_factory=dict)  # gradients of an input, to send to its source
    weight_pending: Dict[Tuple[int, int], Tuple[Values, Values]] = field(default_factory=dict)  # after I, for W
    weight_runners: Dict[Tuple[int, int], Callable[[], Any]] = field(default_factory=dict)  # dw_builder()'s, for W
    losses: Dict[int, torch.Tensor] = field(default_factory=dict)
    tied: Shares = field(default_factory=dict)  # each use's share of a tied weight's gradient (ties.py)
    results: Dict[int, Any] = field(default_factory=dict)  # the last stage's raw outputs


class StageOps:
    """The compute actions of one rank's stages (see the module docstring)."""

    def __init__(self, stages: Sequence[PipelineStage], loss_fn: Optional[Callable[..., torch.Tensor]],
                 sources: Dict[int, List[int]], consumers: Dict[int, List[int]], backward: bool,
                 last_backward: Optional[Dict[int, Action]] = None, ties: Optional[Ties] = None) -> None:
        self.ties = ties  # weights tied across stages: each backward's share of their gradients kept
        self.stages = {stage.stage_index: stage for stage in stages}
        self.sharded = {s: outermost_sharded(stage.submod) for s, stage in self.stages.items()}  # FSDP2's roots
        self.last_backward = last_backward or {}  # stage -> its last B or W of the step (data_parallel.py)
        self.loss_fn = loss_fn
        self.sources = sources  # stage -> the stages whose outputs it takes, in argument order
        self.consumers = consumers  # stage -> the stages that take its output
        self.backward = backward

    def run(self, action: Action, state: StepState) -> None:
        if action.kind is FWD:
            self.forward(action.stage, action.microbatch, state)
        elif action.kind is BWD:
            self.full_backward(action.stage, action.microbatch, state)
        elif action.kind is BWD_I:
            self.input_backward(action.stage, action.microbatch, state)
        elif action.kind is BWD_W:
            self.weight_backward(action.stage, action.microbatch, state)

    # -- values between stages --------------------------------------------------------------------

    def take_output(self, stage: int, microbatch: int, state: StepState) -> Values:
        """The stage's forward output, for one of its consumers (dropped once the last one took it)."""
        key = (stage, microbatch)
        value = state.outputs[key]
        state.readers_left[key] -= 1
        if not state.readers_left[key]:
            del state.outputs[key], state.readers_left[key]
        return value

    def arrived(self, edge: Edge, values: Values, state: StepState) -> None:
        """Activations for ``edge``'s consumer stage (checked against the stage's ``input_args``, where given), kept
        as they came: its forward makes them leaves on its device (see ``grads_arrived``)."""
        stage = self.stages[edge[0]]
        if stage.expected_inputs is not None and self.sources[edge[0]] == [edge[2]]:  # (no skip into it)
            check_inputs(stage.expected_inputs, values, edge[0], edge[1], edge[2])
        state.acts[edge] = tuple(values)

    def grads_arrived(self, key: Tuple[int, int, int], grads: Values, state: StepState) -> None:
        """The gradients of stage ``key[0]``'s output for microbatch ``key[1]`` from consumer ``key[2]``, kept as
        they came. A message over gloo lands in host memory; the backward that takes it moves it onto the stage's
        device, on its own stream: memory the receive's stream allocated and the compute stream read could go back
        to the receive's stream, for its next message, while the compute still read it."""
        state.grads[key] = tuple(grads)

    def _leaf(self, value: Any, device: torch.device) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        value = value.detach().to(device)
        if self.backward and (value.is_floating_point() or value.is_complex()):
            value.requires_grad_(True)
        return value

    # -- the compute actions ----------------------------------------------------------------------

    def forward(self, s: int, m: int, state: StepState) -> None:
        stage = self.stages[s]
        if stage.is_first:
            inputs: Values = state.args[m]
            widths: Tuple[int, ...] = ()
        else:
            parts = [tuple(self._leaf(v, stage.device) for v in state.acts.pop((s, m, src))) for src in self.sources[s]]
            inputs, widths = tuple(v for part in parts for v in part), tuple(len(part) for part in parts)
        args, kwargs = (inputs, state.kwargs[m]) if stage.wired is None else stage.wired(inputs, state.kwargs[m])
        with forward_sync(stage.submod):
            output = stage.submod(*args, **kwargs)
        outputs = as_tuple(output)
        if stage.is_last:
            state.results[m] = output
            if self.loss_fn is not None and state.targets is not None:
                state.losses[m] = self.loss_fn(output, state.targets[m])
        else:
            state.outputs[(s, m)] = outputs
            state.readers_left[(s, m)] = len(self.consumers[s])
        if self.backward:
            state.saved[(s, m)] = Saved(outputs, inputs, widths)

    def _roots(self, s: int, m: int, outputs: Values, state: StepState) -> Tuple[List[torch.Tensor],
                                                                                List[Optional[torch.Tensor]]]:
        """What the stage's backward starts from: its loss, or its outputs with their gradients (summed over the
        stages that took them)."""
        if self.stages[s].is_last:
            return [state.losses[m]], [None]
        total: List[Optional[torch.Tensor]] = [None] * len(outputs)
        device = self.stages[s].device
        for consumer in reversed(self.consumers[s]):  # the later stage's first, as autograd meets them
            for k, g in enumerate(state.grads.pop((s, m, consumer))):
                if g is not None:
                    g = g.to(device)  # (where it came over gloo to a GPU's stage: see grads_arrived)
                    current = total[k]
                    total[k] = g if current is None else current + g
        roots = [(o, g) for o, g in zip(outputs, total)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        return [o for o, _ in roots], [g for _, g in roots]

    def _send_input_grads(self, s: int, m: int, saved: "Saved", grads: Sequence[Optional[torch.Tensor]],
                          state: StepState) -> None:
        """Each source's share of the inputs' gradients, to go back to it."""
        at = 0
        for src, width in zip(self.sources.get(s, []), saved.widths):
            state.input_grads[(s, m, src)] = tuple(grads[at:at + width])
            at += width

    def full_backward(self, s: int, m: int, state: StepState, last: Optional[Action] = None) -> None:
        saved = state.saved.pop((s, m))
        roots, grads = self._roots(s, m, saved.outputs, state)
        if roots:
            is_last = self.last_backward.get(s) == (last or Action(s, BWD, m))
            with self._sync(s, roots, is_last), self._capture(s, m, state):
                torch.autograd.backward(roots, grad_tensors=grads)
        if not self.stages[s].is_first:
            self._send_input_grads(s, m, saved, [self._take_grad(v) for v in saved.inputs], state)
        builder = self.stages[s].dw_builder
        if builder is not None and last is None:
            with self._capture(s, m, state):
                builder()()

    def input_backward(self, s: int, m: int, state: StepState) -> None:
        builder = self.stages[s].dw_builder
        if builder is not None:  # the submodule defers its weights' gradients: a whole backward, W runs the rest
            self.full_backward(s, m, state, last=Action(s, BWD_W, m))
            state.weight_runners[(s, m)] = builder()
            return
        saved = state.saved.pop((s, m))
        roots, grads = self._roots(s, m, saved.outputs, state)
        if not self.stages[s].is_first:
            wanted = [v for v in saved.inputs if isinstance(v, torch.Tensor) and v.requires_grad]
            found: Dict[int, torch.Tensor] = {}
            if roots and wanted:
                with self._sync(s, roots, False):  # no parameter's gradient: no reduction
                    got = inputs_grad((tuple(roots), tuple(grads)), wanted)
                found = {id(v): g for v, g in zip(wanted, got) if g is not None}
            self._send_input_grads(s, m, saved, [found.get(id(v)) for v in saved.inputs], state)
        state.weight_pending[(s, m)] = (tuple(roots), tuple(grads))

    def weight_backward(self, s: int, m: int, state: StepState) -> None:
        runner = state.weight_runners.pop((s, m), None)
        if runner is not None:
            with self._capture(s, m, state):
                runner()
            return
        roots, grads = state.weight_pending.pop((s, m))
        params = [p for p in self.stages[s].submod.parameters() if p.requires_grad]
        if roots and params:
            with self._sync(s, roots, self.last_backward.get(s) == Action(s, BWD_W, m)), self._capture(s, m, state):
                weights_grad((roots, grads), params)

    def _sync(self, s: int, roots: Sequence[Any], last: bool) -> Any:
        """The data-parallel context of a backward of stage ``s`` (``last``: its last in the step)."""
        return backward_sync(self.stages[s].submod, roots, last, self.sharded[s])

    def _capture(self, s: int, m: int, state: StepState) -> Any:
        """The context of a backward that writes stage ``s``'s parameters' gradients (tied weights: ties.py)."""
        return self.ties.capture(s, m, state.tied) if self.ties is not None else _NO_TIES

    @staticmethod
    def _take_grad(value: Any) -> Optional[torch.Tensor]:
        if not isinstance(value, torch.Tensor) or not value.requires_grad or not value.is_leaf:
            return None
        grad, value.grad = value.grad, None
        return grad


def check_inputs(expected: Values, values: Values, stage: int, microbatch: int, source: Optional[int]) -> None:
    """``values`` are what ``input_args`` says: as many, each of its dtype and of its shape beyond the first
    dimension (microbatches may differ in rows). ``source``: the stage that sent them; None: given to ``step()``."""

    def said(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}"
        return type(value).__name__

    sent, wanted = [said(v) for v in values], [said(v) for v in expected]
    same = len(values) == len(expected) and all(
        (a.dtype, a.shape[1:]) == (b.dtype, b.shape[1:]) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        else type(a) is type(b) for a, b in zip(values, expected))
    if not same:
        came = f"stage {source} sent" if source is not None else "step() was given"
        fix = "make the two stages agree" if source is not None else "pass inputs of those dtypes and shapes"
        raise ValueError(f"stage {stage} expects as its inputs {wanted} (its input_args; the first dimension may "
                         f"differ) but {came} {sent} for microbatch {microbatch}: {fix}, or leave input_args out")
