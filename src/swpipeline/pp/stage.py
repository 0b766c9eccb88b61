"""``PipelineStage``: one stage of the model, on the rank that runs it."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn


__all__: List[str] = []


class PipelineStage:
    """One stage of a pipeline: a submodule, its place in the pipeline, and where it runs.

    The same constructor as ``torch.distributed.pipelining.PipelineStage``. Shapes need not
    be given: each message carries its tensors' shapes, so ``input_args``, ``output_args``,
    ``output_grads`` and ``input_grads`` are not needed. Where ``input_args`` is given (a
    tensor or a tuple: one microbatch's inputs, as for torch), what the previous stage sends is
    checked against it as it arrives: a dtype or a shape (beyond the first dimension, the
    microbatch's rows) that differs fails the step on every rank, naming both stages.

    Args:
        submodule: the layers of this stage; its forward takes what the previous stage's
            forward returned (a tensor or a tuple of tensors) and returns the same kind of value.
        stage_index: this stage's place, from 0.
        num_stages: how many stages the pipeline has (on all ranks together).
        device: where the submodule and its inputs live.
        group: the process group of the pipeline's ranks (None: the default group). Stage
            ``s`` runs on the rank ``s % group size`` of the group, or, for the schedules that
            place stages in a V (``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``), on rank ``s``,
            then ``2 * group size - 1 - s``, or, for a schedule written as data, on the rank whose
            actions name it; the schedule checks each rank's stages against its placement.
        dw_builder: for a split backward (``I`` then ``W``, the zero-bubble schedules): a function
            that returns a function computing this stage's weight gradients. With it, ``I`` runs
            autograd's whole backward (the submodule defers its weights' gradients itself), then
            calls ``dw_builder()`` and keeps what it returns; the microbatch's ``W`` calls that. A
            whole backward (``B``) runs autograd, then ``dw_builder()()`` at once. As torch's.
            ``get_mesh`` (DTensor metadata) is accepted and not used.

    Raises:
        TypeError: ``submodule`` is not an ``nn.Module``.
        ValueError: ``stage_index`` out of range, or more ranks than stages.
        RuntimeError: ``torch.distributed`` is not initialized.
    """

    def __init__(self, submodule: nn.Module, stage_index: int, num_stages: int, device: Any,
                 input_args: Any = None, output_args: Any = None, output_grads: Any = None, input_grads: Any = None,
                 group: Optional[Any] = None, dw_builder: Optional[Callable[[], Callable[..., None]]] = None,
                 get_mesh: Any = None) -> None:
        if not isinstance(submodule, nn.Module):
            raise TypeError(f"PipelineStage: submodule must be an nn.Module, got {type(submodule).__name__}")
        for name, value in (("stage_index", stage_index), ("num_stages", num_stages)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"PipelineStage: {name} must be an int, got {value!r}")
        if not 0 <= stage_index < num_stages:
            raise ValueError(f"PipelineStage: stage_index {stage_index} is out of range for num_stages={num_stages} "
                             f"(stages count from 0)")
        if dw_builder is not None and not callable(dw_builder):
            raise TypeError(f"PipelineStage: dw_builder must be None or a function returning the function that "
                            f"computes the weight gradients, got {type(dw_builder).__name__}")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("PipelineStage: torch.distributed is not initialized; call "
                               "torch.distributed.init_process_group() first (torchrun sets up what it needs)")
        self.submod = submodule
        self.dw_builder = dw_builder
        self.expected_inputs: Optional[Tuple[Any, ...]] = None if input_args is None else (
            tuple(input_args) if isinstance(input_args, (tuple, list)) else (input_args,))
        self.skips: Tuple[Tuple[int, int], ...] = ()  # skip connections a traced model has (tracer.py)
        self.wired: Optional[Callable[..., Tuple[Tuple[Any, ...], Dict[str, Any]]]] = None  # a traced piece's
        # arguments from what the stage receives and the keyword inputs (tracer.py); None: as they come
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.device = torch.device(device)
        self.group = group
        self.group_rank = dist.get_rank(group)
        self.group_size = dist.get_world_size(group)
        if self.group_size > num_stages:
            raise ValueError(f"PipelineStage: the process group has {self.group_size} ranks but the pipeline only "
                             f"{num_stages} stages; every rank needs at least one stage")

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def __repr__(self) -> str:
        return (f"PipelineStage(stage {self.stage_index} of {self.num_stages}, rank {self.group_rank} of "
                f"{self.group_size}, device {self.device})")
