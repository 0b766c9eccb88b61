"""The task functions of the TorchRec plans: each is one step of a TorchRec ``progress()``.

Every function takes the iteration's ``IterContext`` and keeps that iteration's
state on it, never on the pipeline::

    ctx.batch     the host batch from the iterator (read-only)
    ctx.data      the batch in its latest form: prepared, then on the device after H2D (``batch_of``)
    ctx.context   the iteration's TrainPipelineContext (input-dist requests, embeddings)
    ctx.losses    forward's losses, until Backward
    ctx.output    forward's output: what progress() returns

Model-wide state (model, optimizer, streams, the rewrite) is the shared
``ModelRuntime``. The engine runs each function with the task's stream current
and after its dependencies, so a function never waits on a stream itself: where
TorchRec calls ``wait_stream`` these only ``record_stream`` (memory safety on an
accelerator; nothing on the CPU).

The semi-synchronous steps (``start_batch``, ``stash_gradients``) follow
``TrainPipelineSemiSync``: from batch ``start_batch + 1`` on (batches counted
from the pipeline's construction or ``reset()``, across iterators: see
``ModelRuntime.index_of``), EmbLookup(i) runs in its own slot, before
EmbBackward(i-1), so batch i reads embeddings one update older than a
synchronous run; before that, EmbLookup(i) leaves the lookup to Forward(i),
which runs after EmbBackward(i-1).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

from . import blocks
from .compiled import CompiledAutograd, PT2Compile
from .model_state import ModelRuntime
from ..plan.context import IterContext

__all__: List[str] = []

logger = logging.getLogger("swpipeline.torchrec")


@dataclass
class SemiSync:
    """TorchRec's semi-sync settings and the stashed gradients."""

    start_batch: int = 900
    stash_gradients: bool = False
    strict: bool = False
    gradients: Dict[str, torch.Tensor] = field(default_factory=dict)

    def is_semi_sync(self, index: int) -> bool:
        """Whether batch ``index`` (counted from the pipeline's construction or reset(), across epochs) is semi-sync."""
        return index >= self.start_batch


@dataclass
class TaskOptions:
    """How the shared task functions behave in one variant."""

    data_dist_role: Optional[str] = "data_dist"
    pipelined: bool = True  # the model was rewritten: set the module context before forward
    non_blocking_copy: bool = True
    inplace_copy: bool = False
    prepare_batch: Optional[Callable[[Any], Any]] = None
    clear_data_dist_inputs: bool = False
    forward_no_grad: bool = False
    plain_model_forward: bool = False  # Eval: call the model itself, not custom_model_fwd
    pt2: Optional[PT2Compile] = None
    input_transformer: Optional[Callable[[Any], Any]] = None
    compiled_autograd: Optional[CompiledAutograd] = None
    semi_sync: Optional[SemiSync] = None


def batch_of(ctx: IterContext) -> Any:
    """The batch in its latest form: ``ctx.data`` once a task prepared or copied it, else ``ctx.batch``."""
    return vars(ctx).get("data", ctx.batch)


class TrainTasks:
    """Task functions bound to one ModelRuntime; ``fn(name)`` returns the function for a task name."""

    def __init__(self, runtime: ModelRuntime, options: TaskOptions) -> None:
        self.rt = runtime
        self.opt = options
        self._by_name: Dict[str, Callable[[IterContext], None]] = {
            "LoadBatch": self.load_batch, "H2D": self.h2d, "InputTransform": self.input_transform,
            "InputDistStart": self.input_dist_start, "InputDistWait": self.input_dist_wait,
            "EmbLookup": self.emb_lookup, "EmbPrefetch": self.emb_prefetch, "ZeroGrad": self.zero_grad,
            "WaitBatch": self.wait_batch, "Forward": self.forward, "Backward": self.backward,
            "EmbBackward": self.emb_backward, "OptimizerStep": self.optimizer_step,
        }

    def fn(self, name: str) -> Callable[[IterContext], None]:
        return self._by_name[name]

    # -- batch ------------------------------------------------------------------------------------

    def load_batch(self, ctx: IterContext) -> None:
        """The engine drew ``ctx.batch`` from the iterator; apply ``prepare_batch`` (PT2's first step)."""
        if self.opt.prepare_batch is not None:
            ctx.data = self.opt.prepare_batch(ctx.batch)

    def h2d(self, ctx: IterContext) -> None:
        """Copy the batch to the device (on the memcpy stream) and open the iteration's TrainPipelineContext."""
        batch = batch_of(ctx)
        if self.opt.prepare_batch is not None and self.opt.pt2 is None:
            batch = self.opt.prepare_batch(batch)
        ctx.context = self.rt.new_context(self.rt.index_of(ctx.iter_idx))
        if self.opt.inplace_copy:
            ctx.data = blocks.to_device(batch, self.rt.device, non_blocking=True,
                                         data_copy_stream=self.rt.current_stream())
        else:
            ctx.data = blocks.to_device(batch, self.rt.device, non_blocking=self.opt.non_blocking_copy)

    def input_transform(self, ctx: IterContext) -> None:
        """PT2: the input transformer (hints for the compiler), after the copy."""
        transform = self.opt.input_transformer or blocks.default_pipeline_input_transformer
        ctx.data = transform(batch_of(ctx))

    def wait_batch(self, ctx: IterContext) -> None:
        """The batch is used on the default stream from here on (the engine already ordered the streams)."""
        self.rt.record_on_current_stream(batch_of(ctx))
        if self.opt.clear_data_dist_inputs:
            with blocks.stream_context(self.rt.stream(self.opt.data_dist_role)):
                blocks.clear_input_dist_tensors(ctx.context)

    # -- input dist ---------------------------------------------------------------------------

    def input_dist_start(self, ctx: IterContext) -> None:
        """First half of the input dist (splits all-to-all); on the first batch, rewrite the model first."""
        self.rt.record_on_current_stream(batch_of(ctx))
        first = not self.rt.pipelined_modules
        self.rt.ensure_pipelined(batch_of(ctx), ctx.context, self.opt.data_dist_role)
        if first and self.opt.semi_sync is not None:
            self._check_optimizer_disjoint(self.opt.semi_sync.strict)

    def input_dist_wait(self, ctx: IterContext) -> None:
        """Second half: wait for the splits, start the tensors all-to-all."""
        self.rt.wait_data_dist(ctx.context)

    # -- embeddings (Fused, SemiSync, Prefetch) --------------------------------------------------

    def emb_lookup(self, ctx: IterContext) -> None:
        """compute_and_output_dist of every pipelined module, ahead of the dense forward."""
        semi = self.opt.semi_sync
        if semi is not None and not semi.is_semi_sync(self.rt.index_of(ctx.iter_idx) - 1):
            ctx.lookup_in_forward = True  # synchronous phase: Forward(i) looks up after EmbBackward(i-1)
            return
        self._start_lookup(ctx)

    def _start_lookup(self, ctx: IterContext) -> None:
        for module in self.rt.pipelined_modules:
            blocks.start_embedding_lookup(module, ctx.context, source_stream=self.rt.stream(self.opt.data_dist_role),
                                          target_stream=self.rt.default_stream(), stream_context=blocks.stream_context)

    def emb_prefetch(self, ctx: IterContext) -> None:
        """Wait the input dist and prefetch the embeddings into the cache (Prefetch's stage 1)."""
        if self.rt.on_accelerator:
            blocks.prefetch_embeddings(ctx.context, self.rt.pipelined_modules, self.rt.device, blocks.stream_context,
                                       self.rt.stream(self.opt.data_dist_role), self.rt.default_stream())
        else:
            blocks.prefetch_on_host(ctx.context, self.rt.pipelined_modules)

    def emb_backward(self, ctx: IterContext) -> None:
        """SemiSync: backward through the detached embeddings (the fused optimizer updates them)."""
        if not self.rt.training:
            return
        context = ctx.context
        for emb_tensors, detached in zip(context.embedding_tensors, context.detached_embedding_tensors):
            pairs = [(t, d.grad) for t, d in zip(emb_tensors, detached) if t.numel() == 1 or d.grad is not None]
            if pairs:
                autograd: Any = torch.autograd
                autograd.backward([t for t, _ in pairs], [g for _, g in pairs])

    # -- the training step -------------------------------------------------------------------------

    def zero_grad(self, ctx: IterContext) -> None:
        if self.rt.training:
            self.rt.optimizer.zero_grad()

    def forward(self, ctx: IterContext) -> None:
        """The model forward on the default stream; stores ``ctx.losses`` and ``ctx.output``."""
        if self.opt.pipelined:
            self.rt.set_module_context(ctx.context)
        if getattr(ctx, "lookup_in_forward", False):
            self._start_lookup(ctx)
        if self.opt.pt2 is not None:
            self.opt.pt2.before_forward(self.rt.model)
        with self._forward_context():
            if self.opt.plain_model_forward:
                losses, output = self.rt.model(batch_of(ctx))
            else:
                losses, output = self.rt.model_fwd(batch_of(ctx))
        ctx.losses, ctx.output = losses, output
        if self.opt.semi_sync is not None:
            ctx.context.postproc_fwd_results.clear()

    def _forward_context(self) -> Any:
        if self.opt.forward_no_grad:
            return torch.no_grad()
        if self.opt.compiled_autograd is not None:
            return self.opt.compiled_autograd.context()
        return contextlib.nullcontext()

    def backward(self, ctx: IterContext) -> None:
        if self.rt.training:
            losses = ctx.losses
            total: Any = torch.sum(losses) if self.opt.pt2 is not None else torch.sum(losses, dim=0)
            compiled = self.opt.compiled_autograd
            with compiled.context() if compiled is not None else contextlib.nullcontext():
                total.backward()
        del ctx.losses

    def optimizer_step(self, ctx: IterContext) -> None:
        if not self.rt.training:
            return
        semi = self.opt.semi_sync
        if semi is None:
            self.rt.optimizer.step()
            return
        index = self.rt.index_of(ctx.iter_idx)
        if semi.is_semi_sync(index) and semi.stash_gradients:
            self._swap_gradients(semi.gradients)
        if not (index == semi.start_batch and semi.stash_gradients):
            self.rt.optimizer.step()  # (no step on the batch whose gradients were just stashed)

    def _swap_gradients(self, stash: Dict[str, torch.Tensor]) -> None:
        """Step on the previous batch's gradients; keep this batch's for the next step (true semi-sync)."""
        for name, param in self.rt.model.named_parameters():
            previous = stash.get(name)
            if param.grad is not None:
                stash[name] = param.grad.clone()
            param.grad = previous

    def _check_optimizer_disjoint(self, strict: bool) -> None:
        params = [set(m.parameters()) for m in self.rt.pipelined_modules]
        groups = getattr(self.rt.optimizer, "param_groups", [])
        for module, module_params in zip(self.rt.pipelined_modules, params):
            if any(not module_params.isdisjoint(group["params"]) for group in groups):
                message = (f"SemiSync: the optimizer also updates the parameters of pipelined module "
                           f"{type(module).__name__}; this can hurt convergence (use a fused embedding optimizer)")
                if strict:
                    raise ValueError(message)
                logger.warning(message)
