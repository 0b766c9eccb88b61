"""ModelRuntime: the model-side state that every task of a TorchRec plan shares.

It owns what TorchRec's pipeline classes keep in ``self``: the model and its
optimizer, the device and its streams, and the input-dist rewrite of the model
(which sharded modules run their forward through a pipelined forward, and the
original forwards to restore on ``detach()``). It owns no batches and no
per-iteration state: each iteration's ``TrainPipelineContext`` lives on its
``IterContext`` (``ctx.context``), so iterations in flight never share a slot.

Streams: on an accelerator each role (``memcpy``, ``data_dist``, ``emb_lookup``,
``prefetch``) gets its own stream object, named by the role for the schedule
table; the engine makes it current while the role's tasks run and orders the
streams with events. On the CPU there are no streams: the roles are the engine's
execution lanes and TorchRec's blocks receive ``None``.

Guarantees: ``ensure_pipelined`` rewrites the model at most once per attach
(on the first batch, inside the task that starts its input dist);
``set_module_context`` is called by the task about to run the model forward.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import blocks

__all__: List[str] = []

logger = logging.getLogger("swpipeline.torchrec")

STREAM_ROLES = ("memcpy", "data_dist", "emb_lookup", "prefetch")


class ModelRuntime:
    """Model, optimizer, device, streams and the pipelined-forward rewrite of one pipeline."""

    def __init__(self, model: torch.nn.Module, optimizer: Any, device: torch.device, *,
                 pipelined_forward: Any = None, context_type: Any = None, apply_jit: bool = False,
                 pipeline_postproc: bool = False, custom_model_fwd: Optional[Callable[[Any], Any]] = None,
                 free_features_storage_early: bool = False, roles: Sequence[str] = STREAM_ROLES) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module (e.g. a DistributedModelParallel), "
                            f"got {type(model).__name__}")
        if not isinstance(device, torch.device):
            raise TypeError(f"device must be a torch.device, got {device!r}")
        self.model = model
        self.optimizer = optimizer
        self.device = device
        self.custom_model_fwd = custom_model_fwd
        self.pipelined_forward = pipelined_forward or blocks.PipelinedForward
        self.context_type = context_type or blocks.TrainPipelineContext
        self.apply_jit = apply_jit
        self.pipeline_postproc = pipeline_postproc
        self.free_features_storage_early = free_features_storage_early
        self.on_accelerator = device.type in ("cuda", "mtia")
        self.streams: Dict[str, Optional[Any]] = {role: self._new_stream(role) for role in roles}
        self.pipelined_modules: List[Any] = []
        self.pipelined_postprocs: List[Any] = []
        self.original_forwards: List[Any] = []
        self.original_kjt_dist_forwards: List[Any] = []
        self.attached = True
        self.data_dist_role: Optional[str] = None
        self.index_base = 0  # batches drawn before the engine's current run: batch index = index_base + iter_idx

    # -- streams -----------------------------------------------------------------------------

    def _new_stream(self, role: str) -> Optional[Any]:
        if not self.on_accelerator:
            return None
        priority = -1 if role in ("memcpy", "data_dist") else 0  # as TorchRec's pipelines
        stream = torch.get_device_module(self.device).Stream(priority=priority)
        stream.swp_name = role  # the name the schedule table shows
        return stream

    def plan_stream(self, role: Optional[str]) -> Any:
        """The ``TaskSchedule.stream`` for a role: its name on the CPU (a lane), its stream on an accelerator."""
        if role is None or role == "default":
            return None
        return self.streams[role] if self.on_accelerator else role

    def stream(self, role: Optional[str]) -> Optional[Any]:
        """The stream TorchRec's blocks expect for a role: ``None`` on the CPU and for the default stream."""
        if role is None or role == "default":
            return self.default_stream()
        return self.streams.get(role)

    def default_stream(self) -> Optional[Any]:
        return torch.get_device_module(self.device).default_stream(self.device) if self.on_accelerator else None

    def current_stream(self) -> Optional[Any]:
        return torch.get_device_module(self.device).current_stream() if self.on_accelerator else None

    def record_on_current_stream(self, obj: Any) -> None:
        """Tell the caching allocator that the current stream uses ``obj`` (ordering is the engine's events)."""
        stream = self.current_stream()
        if stream is not None and obj is not None:
            obj.record_stream(stream)

    # -- the model ---------------------------------------------------------------------------

    @property
    def training(self) -> bool:
        return bool(self.model.training)

    def model_fwd(self, batch: Any) -> Tuple[Any, Any]:
        """``(losses, output)`` of the custom forward if one was given, else of the model."""
        fwd = self.custom_model_fwd if self.custom_model_fwd is not None else self.model
        losses, output = fwd(batch)
        return losses, output

    def index_of(self, iter_idx: int) -> int:
        """The batch's index since the pipeline was built (or reset()), as TorchRec numbers its contexts."""
        return self.index_base + iter_idx

    def new_context(self, index: int) -> Any:
        return self.context_type(index=index, version=1)

    def ensure_pipelined(self, batch: Any, context: Any, data_dist_role: Optional[str]) -> None:
        """Rewrite the model for this pipeline on its first batch, then start ``batch``'s input dist."""
        if self.pipelined_modules:
            self.start_data_dist(batch, context)
            return
        self._rewrite(batch, context, data_dist_role)
        self.start_data_dist(batch, context)  # initializes the input dists ...
        self.original_kjt_dist_forwards = blocks.override_input_dist_forwards(self.pipelined_modules)  # ... then fuses

    def _rewrite(self, batch: Any, context: Any, data_dist_role: Optional[str]) -> None:
        rewritten = blocks.rewrite_model(
            model=self.model, context=context, dist_stream=self.stream(data_dist_role),
            default_stream=self.default_stream(), batch=batch, apply_jit=self.apply_jit,
            pipelined_forward=self.pipelined_forward, pipeline_postproc=self.pipeline_postproc,
        )
        (self.pipelined_modules, self.model, self.original_forwards, self.pipelined_postprocs, _) = rewritten
        for module in self.pipelined_modules:
            if not self.on_accelerator:
                module.forward._device = self.device  # they default to CUDA when they have no stream
            if self.free_features_storage_early and hasattr(module, "_free_features_storage_early"):
                module._free_features_storage_early = True
        self.data_dist_role = data_dist_role

    def start_data_dist(self, batch: Any, context: Any) -> None:
        """The first half of the input dist: the splits all-to-all of every pipelined module."""
        with blocks.use_context_for_postprocs(self.pipelined_postprocs, context):
            blocks.start_data_dist(self.pipelined_modules, batch, context)

    @staticmethod
    def wait_data_dist(context: Any) -> None:
        """The second half: wait for the splits and start the tensors all-to-all (TorchRec's wait_sparse_data_dist)."""
        for names, awaitable in context.fused_splits_awaitables:
            for name, request in zip(names, awaitable.wait()):
                context.input_dist_tensors_requests[name] = request
        context.input_dist_splits_requests.clear()
        context.fused_splits_awaitables.clear()

    def set_module_context(self, context: Any) -> None:
        """Point every pipelined forward (and postproc) at the iteration whose forward runs next."""
        for module in self.pipelined_modules:
            module.forward.set_context(context)
        for postproc in self.pipelined_postprocs:
            postproc.set_context(context)

    # -- detach / attach ---------------------------------------------------------------------

    def detach(self) -> torch.nn.Module:
        """Restore the original sharded-module forwards; returns the model."""
        if self.pipelined_modules:
            blocks.pipeline_detach_model(
                model=self.model, pipelined_modules=self.pipelined_modules, original_forwards=self.original_forwards,
                original_kjt_dist_forwards=self.original_kjt_dist_forwards,
                pipelined_postprocs=self.pipelined_postprocs,
            )
        self.attached = False
        return self.model

    def attach(self, model: Optional[torch.nn.Module], context: Any, batch: Any) -> None:
        """Rewrite the model again (optionally a new one); ``context`` is the oldest in-flight iteration's, or None.

        In-flight iterations keep the input dists they already started; without any,
        the next input-dist task rewrites the model on its batch.
        """
        if model is not None:
            self.model = model
        self.attached = True
        if context is None or not self.pipelined_modules:
            self.pipelined_modules, self.pipelined_postprocs = [], []
            return
        self._rewrite(batch, context, self.data_dist_role)
        self.original_kjt_dist_forwards = blocks.override_input_dist_forwards(self.pipelined_modules)
