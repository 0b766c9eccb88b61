"""The one place that imports TorchRec's train-pipeline building blocks.

Everything the task functions need from TorchRec comes through here: the model
rewrite (``_rewrite_model``), the input-dist split (``_start_data_dist``, the
fused splits awaitables), the embedding lookup (``_start_embedding_lookup``),
the contexts, the pipelined forwards, and the detach helper. TorchRec ships no
type information, so these are ``Any`` at this boundary.

Two of TorchRec's blocks assume an accelerator stream where a CPU run has none;
this module adds the smallest fixes, used only when there is no stream:

* ``EmbeddingPipelinedForward`` (semi-sync) calls ``record_stream`` on the
  looked-up embeddings with the current stream; on the CPU that stream is a
  ``torch.cpu.Stream``, which ``Tensor.record_stream`` rejects
  ("unknown parameter type"). ``HostSafeEmbeddingPipelinedForward`` skips that
  one call when the forward has no stream.
* ``prefetch_embeddings`` returns at once when there is no data-dist stream, so
  ``PrefetchPipelinedForward`` later finds nothing to consume.
  ``prefetch_on_host`` is its body without the streams.

The pipelined forwards also pick their device from their stream and default to
CUDA without one; ``ModelRuntime`` sets it to the model's device after the
rewrite (``fix_forward_devices``).
"""

from __future__ import annotations

import contextlib
from typing import Any, List, Optional

import torch
from torchrec.distributed.comm_ops import torchrec_use_sync_collectives as torchrec_use_sync_collectives
from torchrec.distributed.train_pipeline.pipeline_context import (
    EmbeddingTrainPipelineContext as EmbeddingTrainPipelineContext,
    PrefetchTrainPipelineContext as PrefetchTrainPipelineContext,
    TrainPipelineContext as TrainPipelineContext,
)
from torchrec.distributed.train_pipeline.runtime_forwards import EmbeddingPipelinedForward
from torchrec.distributed.train_pipeline.runtime_forwards import (
    InSyncEmbeddingPipelinedForward as InSyncEmbeddingPipelinedForward,
    PipelinedForward as PipelinedForward,
    PrefetchPipelinedForward as PrefetchPipelinedForward,
)
from torchrec.distributed.train_pipeline.utils import (
    _clear_input_dist_tensors,
    _override_input_dist_forwards,
    _pipeline_detach_model,
    _rewrite_model,
    _start_data_dist,
    _start_embedding_lookup,
    _to_device,
)
from torchrec.distributed.train_pipeline.utils import (
    prefetch_embeddings as prefetch_embeddings,
    use_context_for_postprocs as use_context_for_postprocs,
)
from torchrec.pt2.utils import default_pipeline_input_transformer as default_pipeline_input_transformer

__all__: List[str] = []

# TorchRec's underscore helpers under plain names (they are TorchRec's, unchanged).
clear_input_dist_tensors = _clear_input_dist_tensors
override_input_dist_forwards = _override_input_dist_forwards
pipeline_detach_model = _pipeline_detach_model
rewrite_model = _rewrite_model
start_data_dist = _start_data_dist
start_embedding_lookup = _start_embedding_lookup
to_device = _to_device


class HostSafeEmbeddingPipelinedForward(EmbeddingPipelinedForward):
    """TorchRec's semi-sync forward; without a stream it skips the ``record_stream`` a CPU stream cannot take."""

    def detach_embeddings(self, embeddings: Any, cur_stream: Any) -> None:
        if self._stream is not None or not hasattr(embeddings, "record_stream"):
            super().detach_embeddings(embeddings, cur_stream)
            return
        embeddings.record_stream = _no_stream  # shadows the method for this one call
        try:
            super().detach_embeddings(embeddings, cur_stream)
        finally:
            del embeddings.record_stream


def _no_stream(stream: Any) -> None:
    """Nothing to record: CPU memory is not stream-ordered."""


def prefetch_on_host(context: Any, pipelined_modules: List[Any]) -> None:
    """``prefetch_embeddings`` for a run without streams: wait each input dist, prefetch, hand it to the forward."""
    context.module_input_post_prefetch.clear()
    context.module_contexts_post_prefetch.clear()
    for module in pipelined_modules:
        name = module.forward.name
        dist_input = context.input_dist_tensors_requests.pop(name).wait()
        module_context = context.module_contexts[name]
        module.prefetch(ctx=module_context, dist_input=dist_input, forward_stream=None)
        context.module_input_post_prefetch[name] = dist_input
        context.module_contexts_post_prefetch[name] = context.module_contexts.pop(name)


def stream_context(stream: Optional[Any]) -> Any:
    """``with stream_context(s):`` makes ``s`` current; a no-op for ``None`` (no accelerator, or the current stream)."""
    if stream is None:
        return contextlib.nullcontext()
    return torch.get_device_module(stream.device).stream(stream)
