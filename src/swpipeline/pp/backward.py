"""A stage's backward, whole or split in two (the inputs' gradients, then the weights'), as autograd calls.

The schedules' ``B``, ``I`` and ``W`` actions run through ``inputs_grad`` and ``weights_grad``
(``compute.py``). The three functions under torch's names (its private ``_backward`` module has
them) do the same on their own, for code written against torch's::

    stage_backward(stage_output, output_grads, input_values)      -> the inputs' gradients (all in .grad)
    stage_backward_input(outputs_or_loss, output_grads, inputs, weights) -> (the inputs' gradients, groups)
    stage_backward_weight(weights, groups, retain_graph=False)    -> the weights' gradients (in .grad)

``I`` keeps the graph and computes only the inputs' gradients; ``W`` walks the graph again into
the weights only. Each gradient is computed by the same operations as one whole backward.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence, Tuple

import torch

__all__: List[str] = ["stage_backward", "stage_backward_input", "stage_backward_weight"]

Roots = Tuple[Tuple[torch.Tensor, ...], Tuple[Optional[torch.Tensor], ...]]  # outputs and their gradients


def roots_of(outputs: Any, output_grads: Any) -> Roots:
    """The tensors a backward starts from (the outputs that require grad, in order, nested ones too) and their
    gradients (None: a scalar loss's, one)."""
    flat_out = _flatten(outputs)
    flat_grads = _flatten(output_grads) if output_grads is not None else [None] * len(flat_out)
    if len(flat_grads) != len(flat_out):
        raise ValueError(f"the backward was given {len(flat_grads)} output gradients for {len(flat_out)} outputs: "
                         f"give one per output (None for an output that gets none)")
    pairs = [(o, g) for o, g in zip(flat_out, flat_grads) if isinstance(o, torch.Tensor) and o.requires_grad]
    return tuple(o for o, _ in pairs), tuple(g for _, g in pairs)


def _flatten(value: Any) -> List[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _flatten(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _flatten(item)]
    return [value]


def inputs_grad(roots: Roots, inputs: Sequence[torch.Tensor]) -> Tuple[Optional[torch.Tensor], ...]:
    """The gradients of ``inputs`` alone (None for an input the outputs do not depend on), the graph kept for the
    weights' pass."""
    outputs, grads = roots
    if not outputs or not inputs:
        return (None,) * len(inputs)
    return torch.autograd.grad(list(outputs), list(inputs), grad_outputs=list(grads), retain_graph=True,
                               allow_unused=True)


def weights_grad(roots: Roots, weights: Sequence[torch.Tensor], retain_graph: bool = False) -> None:
    """The weights' gradients, added into their ``.grad``."""
    outputs, grads = roots
    if outputs and weights:
        torch.autograd.backward(list(outputs), grad_tensors=list(grads), inputs=list(weights),
                                retain_graph=retain_graph)


# -- torch's names ---------------------------------------------------------------------------------------------

def stage_backward(stage_output: Any, output_grads: Any, input_values: Sequence[Any],
                   outputs_with_grads_idxs: Optional[Sequence[int]] = None) -> Tuple[Optional[torch.Tensor], ...]:
    """A whole backward from the stage's output (or loss) with its gradient (None for a loss): every gradient into
    ``.grad``; returns each input's (None for a value that is no tensor or gets none)."""
    if outputs_with_grads_idxs is not None:
        stage_output = [_flatten(stage_output)[k] for k in outputs_with_grads_idxs]
        output_grads = None if output_grads is None else [_flatten(output_grads)[k] for k in outputs_with_grads_idxs]
    outputs, grads = roots_of(stage_output, output_grads)
    if outputs:
        torch.autograd.backward(list(outputs), grad_tensors=list(grads))
    return tuple(v.grad if isinstance(v, torch.Tensor) else None for v in input_values)


def stage_backward_input(stage_outputs_or_loss: Any, output_grads: Any, input_values: Sequence[Any],
                         weights: Iterable[torch.Tensor]) -> Tuple[Tuple[Optional[torch.Tensor], ...], Roots]:
    """The inputs' gradients only, added into their ``.grad`` and returned, the weights' left for
    ``stage_backward_weight`` (given the returned groups; ``weights`` is accepted for torch's sake)."""
    roots = roots_of(stage_outputs_or_loss, output_grads)
    wanted = [v for v in input_values if isinstance(v, torch.Tensor) and v.requires_grad]
    found = {id(v): g for v, g in zip(wanted, inputs_grad(roots, wanted)) if g is not None}
    for v in wanted:
        g = found.get(id(v))
        if g is not None:
            v.grad = g if v.grad is None else v.grad + g
    return tuple(found.get(id(v)) for v in input_values), roots


def stage_backward_weight(weights: Iterable[torch.Tensor], param_groups: Roots,
                          retain_graph: bool = False) -> Tuple[Optional[torch.Tensor], ...]:
    """The weights' gradients, from the groups ``stage_backward_input`` returned, added into their ``.grad``."""
    params = [w for w in weights if w.requires_grad]
    weights_grad(param_groups, params, retain_graph)
    return tuple(w.grad for w in params)
