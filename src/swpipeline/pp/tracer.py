"""The tracer frontend: torch's tracer cuts the model, and the pieces become this library's stages.

::

    pipe = pipeline(model, mb_args=(x_microbatch,))       # torch traces and splits at pipe_split() / split_spec
    stage = pipe.build_stage(rank, device)                 # a swpipeline.pp.PipelineStage
    Schedule1F1B(stage, n_microbatches, loss_fn=loss).step(x)

Splitting a model's graph is torch's job (``torch.distributed.pipelining.pipeline``, which
reads torch's own markers: ``pipe_split()`` and ``SplitPoint`` are torch's objects, re-exported).
This module only wires the pieces to this library's stages. Torch's split hands a piece the
values it uses, in the order its graph lists them: an output of the previous piece, or of an
earlier one (a skip connection), or one element of a piece's tuple output. This library's
stage takes the previous stage's whole output, then each skip source's, in stage order; so
the stage keeps, beside the piece itself (its ``submod``, with the model's names), how the
piece picks its arguments out of those (``Wired``), and the skips
(``PipelineStage.skips``), where every schedule finds them.

What is refused, with the piece named: a piece other than the first that uses the model's
inputs, and a model output that is not the last piece's.
"""

from __future__ import annotations

import operator
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import fx, nn
from torch.distributed import pipelining as torch_pipelining
from torch.distributed.pipelining import SplitPoint as SplitPoint  # torch's markers: its tracer reads them
from torch.distributed.pipelining import pipe_split as pipe_split
from torch.distributed.pipelining._IR import Pipe as TorchPipe

from .stage import PipelineStage

__all__: List[str] = []


class Wiring(NamedTuple):
    """Where each argument of one piece comes from, and what the pieces send each other."""

    arguments: Tuple[Tuple[int, Optional[int]], ...]  # per argument: (source piece, element of its tuple or None)
    widths: Dict[int, int]  # per piece: how many values its output has (1: a single value)
    skips: Tuple[Tuple[int, int], ...]  # (earlier piece, later piece) at least two apart, over the whole model


def wiring(graph: fx.Graph, stage_index: int) -> Wiring:
    """Read torch's split graph: what piece ``stage_index`` takes, and every skip of the model."""
    pieces: Dict[fx.Node, int] = {}
    uses: Dict[int, List[Tuple[int, Optional[int]]]] = {}
    widths: Dict[int, int] = {}
    for node in graph.nodes:
        if node.op == "call_module" and str(node.target).startswith("submod_"):
            k = len(pieces)
            pieces[node] = k
            uses[k] = [_source(arg, pieces, k) for arg in node.args]
    for node in graph.nodes:
        found = _element_of(node, pieces)
        if found is not None and found[1] is not None:
            widths[found[0]] = max(widths.get(found[0], 1), found[1] + 1)
        if node.op == "output":
            _check_output(node.args[0], pieces, len(pieces) - 1)
    for k in pieces.values():
        widths.setdefault(k, 1)
    skips = tuple(sorted({(src, k) for k, args in uses.items() for src, _ in args if 0 <= src < k - 1}))
    return Wiring(tuple(uses[stage_index]), widths, skips)


def _element_of(value: Any, pieces: Dict[fx.Node, int]) -> Optional[Tuple[int, Optional[int]]]:
    """(piece, element) when ``value`` is a piece's output (element None) or one element of it; else None."""
    if not isinstance(value, fx.Node):
        return None
    if value in pieces:
        return pieces[value], None
    if value.op == "call_function" and value.target is operator.getitem:
        base, index = value.args[0], value.args[1]
        if isinstance(base, fx.Node) and base in pieces and isinstance(index, int):
            return pieces[base], index
    return None


def _source(arg: Any, pieces: Dict[fx.Node, int], k: int) -> Tuple[int, Optional[int]]:
    found = _element_of(arg, pieces)
    if found is not None:
        return found
    if k == 0:
        return -1, None  # the model's input
    raise ValueError(f"pipeline: piece {k} of the split model takes {arg!r}, which no earlier piece computes (the "
                     f"model's inputs go to the first piece only): compute it in an earlier piece")


def _check_output(value: Any, pieces: Dict[fx.Node, int], last: int) -> None:
    for node in value if isinstance(value, (tuple, list)) else [value]:
        found = _element_of(node, pieces)
        if found is None or found[0] != last:
            raise ValueError(f"pipeline: the model's output {getattr(node, 'name', node)!r} comes from piece "
                             f"{None if found is None else found[0]} of {last + 1}, not from the last one: return "
                             f"only what the last piece computes")


class Wired:
    """How one piece of torch's split takes this library's stage inputs: the previous stage's output, then each skip
    source's (their values side by side), and the model's keyword inputs (the first piece's only)."""

    def __init__(self, stage_index: int, wires: Wiring) -> None:
        self.stage_index = stage_index
        sources = [stage_index - 1] + [a for a, b in wires.skips if b == stage_index] if stage_index else []
        offsets, at = {}, 0
        for src in sources:
            offsets[src] = at
            at += wires.widths[src]
        # per argument: (first value, how many): one element, or a piece's whole output (a tuple when it has several)
        self.picks = [(offsets[src] + element, 0) if element is not None else (offsets[src], wires.widths[src])
                      for src, element in wires.arguments] if stage_index else []

    def __call__(self, values: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        """The piece's positional and keyword arguments."""
        if not self.stage_index:
            return values, kwargs
        return tuple(values[at] if width <= 1 else tuple(values[at:at + width]) for at, width in self.picks), {}


class Pipe:
    """The traced, split model (torch's ``Pipe``, kept as ``torch_pipe``) whose ``build_stage`` builds this
    library's stages; the rest of torch's ``Pipe`` (``split_gm``, ``info()``, ``get_stage_module(i)``, calling it)
    is torch's."""

    def __init__(self, torch_pipe: TorchPipe) -> None:
        self.torch_pipe = torch_pipe
        self.num_stages: int = torch_pipe.num_stages

    def build_stage(self, stage_index: int, device: torch.device, group: Optional[Any] = None) -> PipelineStage:
        """This rank's stage ``stage_index`` of the split model (a ``swpipeline.pp.PipelineStage``)."""
        return build_stage(self.torch_pipe.get_stage_module(stage_index), stage_index, self.torch_pipe.info(), device,
                           group)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.torch_pipe(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "torch_pipe":  # not set yet
            raise AttributeError(name)
        return getattr(self.torch_pipe, name)


def pipeline(module: nn.Module, mb_args: Tuple[Any, ...], mb_kwargs: Optional[Dict[str, Any]] = None,
             split_spec: Optional[Dict[str, SplitPoint]] = None, split_policy: Optional[Any] = None) -> Pipe:
    """Trace ``module`` on one microbatch's inputs and split it (torch's tracer and splitter, torch's arguments).

    Returns:
        A ``Pipe`` whose ``build_stage(stage_index, device, group=None)`` builds this library's stages.
    """
    return Pipe(torch_pipelining.pipeline(module, mb_args, mb_kwargs, split_spec, split_policy))


def build_stage(stage_module: nn.Module, stage_index: int, pipe_info: Any, device: torch.device,
                group: Optional[Any] = None) -> PipelineStage:
    """A ``PipelineStage`` of one piece of a split model (``pipe.get_stage_module(i)``, ``pipe.info()``)."""
    wires = wiring(pipe_info.graph, stage_index)
    stage = PipelineStage(stage_module, stage_index, pipe_info.num_stages, device, group=group)
    stage.skips, stage.wired = wires.skips, Wired(stage_index, wires)
    return stage

