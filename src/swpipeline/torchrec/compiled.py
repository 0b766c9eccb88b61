"""The two compiled variants' extra steps: PT2's ``torch.compile`` and compiled autograd.

Both mirror TorchRec's classes: ``TrainPipelinePT2`` compiles the model in the
forward of iteration ``compile_on_iter`` (counted over the pipeline's lifetime)
with TorchRec's mandatory dynamo settings; ``TrainPipelineSparseDistCompAutograd``
runs forward and backward inside ``compiled_autograd._enable(torch.compile(...))``
and TorchRec's sync collectives, except the very first forward.

On the CPU, compiled autograd over a ``DistributedModelParallel`` needs two
settings TorchRec's defaults do not have (see docs/torchrec.md): DDP's Python
reducer (``torch._dynamo.config.optimize_ddp = "python_reducer"``, set before
the model is wrapped) and ``fullgraph=False`` (fbgemm's CPU embedding backward
has no fake-tensor kernel, so the backward graph must break around it).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch

from . import blocks

__all__: List[str] = []

logger = logging.getLogger("swpipeline.torchrec")

DEFAULT_COMPILED_AUTOGRAD_OPTIONS: Dict[str, Any] = {"backend": "inductor", "dynamic": True, "fullgraph": True}


@dataclass
class PT2Compile:
    """When and how PT2 compiles the model (TorchRec's ``TorchCompileConfig`` plus the compile hooks)."""

    fullgraph: bool = False
    dynamic: Optional[bool] = None
    backend: str = "inductor"
    compile_on_iter: int = 3
    pre_compile_fn: Optional[Callable[[torch.nn.Module], None]] = None
    post_compile_fn: Optional[Callable[[torch.nn.Module], None]] = None
    forwards_run: int = 0

    def before_forward(self, model: torch.nn.Module) -> None:
        """Compile the model if this is forward number ``compile_on_iter``; count the forward."""
        if self.forwards_run == self.compile_on_iter:
            logger.info("compiling the model (forward %d)", self.forwards_run)
            if self.pre_compile_fn is not None:
                self.pre_compile_fn(model)
            dynamo_config: Any = torch._dynamo.config
            dynamo_config.capture_scalar_outputs = True
            dynamo_config.capture_dynamic_output_shape_ops = True
            dynamo_config.force_unspec_int_unbacked_size_like_on_torchrec_kjt = True
            dynamo_config.skip_torchrec = False
            ops: Any = torch.ops
            ops.import_module("fbgemm_gpu.sparse_ops")
            model.compile(fullgraph=self.fullgraph, dynamic=self.dynamic, backend=self.backend)
            if self.post_compile_fn is not None:
                self.post_compile_fn(model)
        self.forwards_run += 1


class CompiledAutograd:
    """The context forward and backward run in; the first one it hands out is a no-op (as TorchRec's)."""

    def __init__(self, options: Optional[Dict[str, Any]]) -> None:
        self.options = dict(options if options is not None else DEFAULT_COMPILED_AUTOGRAD_OPTIONS)
        self.initialized = False
        self._configure()

    @staticmethod
    def _configure() -> None:
        """The compiler settings TorchRec's compiled-autograd pipeline sets (global, as there)."""
        dynamo: Any = torch._dynamo.config
        with warnings.catch_warnings():  # deprecated (always on) in recent torch; TorchRec still sets it
            warnings.simplefilter("ignore", FutureWarning)
            dynamo.inline_inbuilt_nn_modules = True
        if hasattr(dynamo, "skip_fsdp_hooks"):
            dynamo.skip_fsdp_hooks = False
        functorch: Any = importlib.import_module("torch._functorch.config")
        functorch.recompute_views = True
        functorch.cse = False
        inductor: Any = importlib.import_module("torch._inductor.config")
        inductor.reorder_for_compute_comm_overlap = True
        inductor.reorder_for_compute_comm_overlap_passes = ["sink_waits", "raise_comms", "reorder_compute_for_overlap"]

    def context(self) -> Any:
        """A context manager: compiled autograd (not the first time) inside TorchRec's sync collectives."""
        stack = contextlib.ExitStack()
        if self.initialized:
            compiled_autograd: Any = importlib.import_module("torch._dynamo.compiled_autograd")
            stack.enter_context(compiled_autograd._enable(torch.compile(**self.options)))
        self.initialized = True
        stack.enter_context(blocks.torchrec_use_sync_collectives())
        return stack
