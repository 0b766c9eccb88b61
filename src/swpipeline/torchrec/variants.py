"""TorchRec's pipeline classes, by name and signature, as plans: swap one import to switch.

    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist   # before
    from swpipeline.torchrec import TrainPipelineSparseDist                   # after

Each function takes the TorchRec class's arguments (same names, same defaults,
except where docs/torchrec.md says otherwise) and returns a
``PlannedTrainPipeline`` running that variant's plan. Every function also takes
swpipeline's own keyword options:

* ``lockstep`` (True): TorchRec's step boundary; False lets the next step run
  while the caller is between calls.
* ``caller_thread`` (True): with lockstep, the ``default`` thread group runs on
  the thread calling progress(), as TorchRec's step (no thread hand-offs).
* ``stop_together`` (False) / ``stop_together_group``: all ranks end their data
  at the same batch (uneven data; see ``feed.py``).
* ``prepare_batch``: a function applied to each item the iterator yields inside
  H2D, i.e. on H2D's thread group.
* ``thread_groups``: e.g. ``{"H2D": "prep"}`` runs the copy (and prepare_batch) on
  a thread of its own. Only H2D and PT2's LoadBatch may move: the other tasks
  share the model and issue collectives, so they stay on ``default``.
* ``signal_timeout``, ``progress_timeout``: the engine's timeouts.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional

import torch

from . import blocks
from .compiled import CompiledAutograd, PT2Compile
from .model_state import ModelRuntime
from .pipeline import PlannedTrainPipeline
from .plans import SPECS, PlanSpec
from .tasks import SemiSync, TaskOptions, TrainTasks

__all__: List[str] = []

_MOVABLE = {"H2D", "LoadBatch"}
_SWP_OPTIONS = {"lockstep", "caller_thread", "stop_together", "stop_together_group", "prepare_batch",
                "thread_groups", "signal_timeout", "progress_timeout"}


def _make(spec: PlanSpec, runtime: ModelRuntime, options: TaskOptions, *, execute_all_batches: bool = True,
          swp: Dict[str, Any]) -> PlannedTrainPipeline:
    """Bind a plan spec to its task functions and wrap it as a TorchRec pipeline."""
    unknown = set(swp) - _SWP_OPTIONS
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {sorted(unknown)}; swpipeline's options are "
                        f"{sorted(_SWP_OPTIONS)}")
    groups: Mapping[str, str] = swp.pop("thread_groups", None) or {}
    misplaced = sorted(t for t, g in groups.items() if g != "default" and t not in _MOVABLE)
    if misplaced:
        raise ValueError(f"thread_groups: {misplaced} must stay on the 'default' thread group (they share the model "
                         f"and issue collectives); only {sorted(_MOVABLE)} may move")
    unknown_tasks = sorted(set(groups) - set(spec.task_names))
    if unknown_tasks:
        raise ValueError(f"thread_groups: unknown task(s) {unknown_tasks}; this plan's tasks are {spec.task_names}")
    options.prepare_batch = swp.pop("prepare_batch", None)
    tasks = TrainTasks(runtime, options)
    plan = spec.with_thread_groups(groups).build(tasks.fn, runtime.plan_stream)
    return PlannedTrainPipeline(plan, runtime, runtime.device, execute_all_batches=execute_all_batches, **swp)


def _check_2d_sharding(model: torch.nn.Module, interval: Optional[int]) -> None:
    from torchrec.distributed.model_parallel import DMPCollection

    if interval is not None and isinstance(model, DMPCollection):
        raise NotImplementedError("2D sharding (DMPCollection) is not supported yet: its embeddings would not be "
                                  "synced; pass dmp_collection_sync_interval_batches=None to sync them yourself")


def _runtime(model: torch.nn.Module, optimizer: Any, device: torch.device, forward: Any, context_type: Any,
             apply_jit: bool, pipeline_postproc: bool, custom_model_fwd: Optional[Callable[[Any], Any]],
             free_features_storage_early: bool) -> ModelRuntime:
    return ModelRuntime(model, optimizer, device, pipelined_forward=forward, context_type=context_type,
                        apply_jit=apply_jit, pipeline_postproc=pipeline_postproc, custom_model_fwd=custom_model_fwd,
                        free_features_storage_early=free_features_storage_early)


def TrainPipelineBase(model: torch.nn.Module, optimizer: Any, device: torch.device,
                      custom_model_fwd: Optional[Callable[[Any], Any]] = None,
                      enable_inplace_copy_batch: bool = False, **swp: Any) -> PlannedTrainPipeline:
    """TorchRec's TrainPipelineBase: H2D(i+1) on the memcpy stream while step i runs (depth 2)."""
    rt = _runtime(model, optimizer, device, None, None, False, False, custom_model_fwd, False)
    return _make(SPECS["Base"], rt, TaskOptions(pipelined=False, inplace_copy=enable_inplace_copy_batch), swp=swp)


def TrainPipelinePT2(model: torch.nn.Module, optimizer: Any, device: torch.device, compile_configs: Any = None,
                     pre_compile_fn: Optional[Callable[[torch.nn.Module], None]] = None,
                     post_compile_fn: Optional[Callable[[torch.nn.Module], None]] = None,
                     input_transformer: Optional[Callable[[Any], Any]] = None, **swp: Any) -> PlannedTrainPipeline:
    """TorchRec's TrainPipelinePT2: one serial stage, the model compiled on forward ``compile_on_iter``."""
    cc = compile_configs
    pt2 = PT2Compile(pre_compile_fn=pre_compile_fn, post_compile_fn=post_compile_fn)
    if cc is not None:
        pt2.fullgraph, pt2.dynamic, pt2.backend, pt2.compile_on_iter = (cc.fullgraph, cc.dynamic, cc.backend,
                                                                         cc.compile_on_iter)
    rt = _runtime(model, optimizer, device, None, None, False, False, None, False)
    options = TaskOptions(pipelined=False, non_blocking_copy=False, pt2=pt2, input_transformer=input_transformer,
                          plain_model_forward=True)
    return _make(SPECS["PT2"], rt, options, swp=swp)


def TrainPipelineSparseDist(model: torch.nn.Module, optimizer: Any, device: torch.device,
                            execute_all_batches: bool = True, apply_jit: bool = False, context_type: Any = None,
                            pipeline_postproc: bool = False, custom_model_fwd: Optional[Callable[[Any], Any]] = None,
                            dmp_collection_sync_interval_batches: Optional[int] = 1,
                            enqueue_batch_after_forward: bool = False, enable_inplace_copy_batch: bool = False,
                            free_features_storage_early: bool = False, clear_data_dist_inputs: bool = False,
                            **swp: Any) -> PlannedTrainPipeline:
    """TorchRec's TrainPipelineSparseDist: H2D(i+2) ‖ input dist(i+1) ‖ step i (depth 3)."""
    _check_2d_sharding(model, dmp_collection_sync_interval_batches)
    _use_main_stream_for_dist_init(clear_data_dist_inputs)
    rt = _runtime(model, optimizer, device, blocks.PipelinedForward, context_type, apply_jit, pipeline_postproc,
                  custom_model_fwd, free_features_storage_early)
    spec = SPECS["SparseDist"].h2d_after_forward() if enqueue_batch_after_forward else SPECS["SparseDist"]
    options = TaskOptions(inplace_copy=enable_inplace_copy_batch, clear_data_dist_inputs=clear_data_dist_inputs)
    return _make(spec, rt, options, execute_all_batches=execute_all_batches, swp=swp)


def TrainPipelineSparseDistLite(model: torch.nn.Module, optimizer: Any, device: torch.device, apply_jit: bool = False,
                                context_type: Any = None, pipeline_postproc: bool = False,
                                custom_model_fwd: Optional[Callable[[Any], Any]] = None,
                                enable_inplace_copy_batch: bool = False, free_features_storage_early: bool = False,
                                clear_data_dist_inputs: bool = False, **swp: Any) -> PlannedTrainPipeline:
    """TorchRec's TrainPipelineSparseDistLite: the input dist on the default stream, in the step (depth 2)."""
    _use_main_stream_for_dist_init(clear_data_dist_inputs)
    rt = _runtime(model, optimizer, device, blocks.PipelinedForward, context_type, apply_jit, pipeline_postproc,
                  custom_model_fwd, free_features_storage_early)
    options = TaskOptions(data_dist_role=None, inplace_copy=enable_inplace_copy_batch,
                          clear_data_dist_inputs=clear_data_dist_inputs)
    return _make(SPECS["SparseDistLite"], rt, options, swp=swp)


def TrainPipelineFusedSparseDist(model: torch.nn.Module, optimizer: Any, device: torch.device,
                                 execute_all_batches: bool = True, apply_jit: bool = False,
                                 pipeline_postproc: bool = True,
                                 custom_model_fwd: Optional[Callable[[Any], Any]] = None, strict: bool = False,
                                 emb_lookup_stream: str = "new", embedding_lookup_after_data_dist: bool = False,
                                 enable_inplace_copy_batch: bool = False, enqueue_batch_after_forward: bool = False,
                                 free_features_storage_early: bool = False, clear_data_dist_inputs: bool = False,
                                 **swp: Any) -> PlannedTrainPipeline:
    """TorchRec's TrainPipelineFusedSparseDist: the embedding lookup on its own stream, first in the step."""
    spec = _fused_spec(emb_lookup_stream, embedding_lookup_after_data_dist, enqueue_batch_after_forward)
    _use_main_stream_for_dist_init(clear_data_dist_inputs)
    rt = _runtime(model, optimizer, device, blocks.InSyncEmbeddingPipelinedForward,
                  blocks.EmbeddingTrainPipelineContext, apply_jit, pipeline_postproc, custom_model_fwd,
                  free_features_storage_early)
    options = TaskOptions(inplace_copy=enable_inplace_copy_batch, clear_data_dist_inputs=clear_data_dist_inputs)
    return _make(spec, rt, options, execute_all_batches=execute_all_batches, swp=swp)


def _fused_spec(emb_lookup_stream: str, lookup_after_data_dist: bool, h2d_after_forward: bool) -> PlanSpec:
    roles = {"new": "emb_lookup", "data_dist": "data_dist", "current": None}
    if emb_lookup_stream not in roles:
        raise ValueError(f"emb_lookup_stream must be one of {sorted(roles)}, got {emb_lookup_stream!r}")
    if lookup_after_data_dist:
        raise NotImplementedError("embedding_lookup_after_data_dist=True needs EmbLookup(i) to wait for "
                                  "InputDistStart(i+1), a dependency on a later iteration, which a plan cannot express")
    spec = SPECS["FusedSparseDist"].with_role("EmbLookup", roles[emb_lookup_stream])
    return spec.h2d_after_forward() if h2d_after_forward else spec


def TrainPipelineSemiSync(model: torch.nn.Module, optimizer: Any, device: torch.device,
                          execute_all_batches: bool = True, apply_jit: bool = False, start_batch: int = 900,
                          stash_gradients: bool = False, pipeline_postproc: bool = True,
                          custom_model_fwd: Optional[Callable[[Any], Any]] = None, strict: bool = False,
                          dmp_collection_sync_interval_batches: Optional[int] = 1,
                          enable_inplace_copy_batch: bool = False, free_features_storage_early: bool = False,
                          clear_data_dist_inputs: bool = False, **swp: Any) -> PlannedTrainPipeline:
    """TorchRec's TrainPipelineSemiSync: from ``start_batch`` on, batch i reads embeddings one update older
    (depth 4)."""
    _check_2d_sharding(model, dmp_collection_sync_interval_batches)
    _use_main_stream_for_dist_init(clear_data_dist_inputs)
    rt = _runtime(model, optimizer, device, blocks.HostSafeEmbeddingPipelinedForward,
                  blocks.EmbeddingTrainPipelineContext, apply_jit, pipeline_postproc, custom_model_fwd,
                  free_features_storage_early)
    options = TaskOptions(inplace_copy=enable_inplace_copy_batch, clear_data_dist_inputs=clear_data_dist_inputs,
                          semi_sync=SemiSync(start_batch=start_batch, stash_gradients=stash_gradients, strict=strict))
    return _make(SPECS["SemiSync"], rt, options, execute_all_batches=execute_all_batches, swp=swp)


def PrefetchTrainPipelineSparseDist(model: torch.nn.Module, optimizer: Any, device: torch.device,
                                    execute_all_batches: bool = True, apply_jit: bool = False,
                                    pipeline_postproc: bool = True,
                                    custom_model_fwd: Optional[Callable[[Any], Any]] = None,
                                    enable_inplace_copy_batch: bool = False, free_features_storage_early: bool = False,
                                    clear_data_dist_inputs: bool = False, **swp: Any) -> PlannedTrainPipeline:
    """TorchRec's PrefetchTrainPipelineSparseDist: embedding-cache prefetch of batch i+1 on its own stream."""
    _use_main_stream_for_dist_init(clear_data_dist_inputs)
    rt = _runtime(model, optimizer, device, blocks.PrefetchPipelinedForward, blocks.PrefetchTrainPipelineContext,
                  apply_jit, pipeline_postproc, custom_model_fwd, free_features_storage_early)
    options = TaskOptions(inplace_copy=enable_inplace_copy_batch, clear_data_dist_inputs=clear_data_dist_inputs)
    return _make(SPECS["Prefetch"], rt, options, execute_all_batches=execute_all_batches, swp=swp)


def EvalPipelineSparseDist(model: torch.nn.Module, optimizer: Any, device: torch.device, apply_jit: bool = False,
                           pipeline_postproc: bool = False, enable_inplace_copy_batch: bool = False,
                           free_features_storage_early: bool = False, clear_data_dist_inputs: bool = False,
                           **swp: Any) -> PlannedTrainPipeline:
    """TorchRec's EvalPipelineSparseDist: forward only, the copy on a loader thread."""
    _use_main_stream_for_dist_init(clear_data_dist_inputs)
    rt = _runtime(model, optimizer, device, blocks.PipelinedForward, None, apply_jit, pipeline_postproc, None,
                  free_features_storage_early)
    options = TaskOptions(inplace_copy=enable_inplace_copy_batch, clear_data_dist_inputs=clear_data_dist_inputs,
                          plain_model_forward=True)
    return _make(SPECS["EvalSparseDist"], rt, options, swp=swp)


def EvalPipelineFusedSparseDist(model: torch.nn.Module, optimizer: Any, device: torch.device,
                                execute_all_batches: bool = True, apply_jit: bool = False,
                                pipeline_postproc: bool = True,
                                custom_model_fwd: Optional[Callable[[Any], Any]] = None, strict: bool = False,
                                emb_lookup_stream: str = "new", embedding_lookup_after_data_dist: bool = False,
                                enable_inplace_copy_batch: bool = False, free_features_storage_early: bool = False,
                                clear_data_dist_inputs: bool = False, enable_embedding_lookup_prefetch: bool = False,
                                **swp: Any) -> PlannedTrainPipeline:
    """TorchRec's EvalPipelineFusedSparseDist: Fused's lookup, forward under no_grad, no backward."""
    spec = _eval_fused_spec(emb_lookup_stream, embedding_lookup_after_data_dist, enable_embedding_lookup_prefetch)
    _use_main_stream_for_dist_init(clear_data_dist_inputs)
    rt = _runtime(model, optimizer, device, blocks.InSyncEmbeddingPipelinedForward,
                  blocks.EmbeddingTrainPipelineContext, apply_jit, pipeline_postproc, custom_model_fwd,
                  free_features_storage_early)
    options = TaskOptions(inplace_copy=enable_inplace_copy_batch, clear_data_dist_inputs=clear_data_dist_inputs,
                          forward_no_grad=True)
    return _make(spec, rt, options, execute_all_batches=execute_all_batches, swp=swp)


def _eval_fused_spec(emb_lookup_stream: str, lookup_after_data_dist: bool, lookup_prefetch: bool) -> PlanSpec:
    roles = {"new": "emb_lookup", "data_dist": "data_dist", "current": None}
    if emb_lookup_stream not in roles or lookup_after_data_dist:
        _fused_spec(emb_lookup_stream, lookup_after_data_dist, False)  # raises the same errors as Fused
    spec = SPECS["EvalFusedSparseDist"].with_role("EmbLookup", roles[emb_lookup_stream])
    if lookup_prefetch:  # lookup(i+1) right after forward(i): one stage earlier, after Forward(i-1)
        rows = tuple((n, 1 if n == "EmbLookup" else s, r, o) for n, s, r, o in spec.tasks)
        spec = PlanSpec(rows, spec.intra, spec.inter + (("EmbLookup", "Forward"),), spec.thread_groups)
    return spec


def TrainPipelineSparseDistCompAutograd(model: torch.nn.Module, optimizer: Any, device: torch.device,
                                        execute_all_batches: bool = True, apply_jit: bool = False,
                                        context_type: Any = None, pipeline_postproc: bool = False,
                                        custom_model_fwd: Optional[Callable[[Any], Any]] = None,
                                        free_features_storage_early: bool = False,
                                        clear_data_dist_inputs: bool = False,
                                        **swp: Any) -> PlannedTrainPipeline:
    """TorchRec's TrainPipelineSparseDistCompAutograd: SparseDist's plan, forward/backward under compiled autograd.

    Compiler options come from ``model._compiled_autograd_options`` as in TorchRec.
    """
    _use_main_stream_for_dist_init(clear_data_dist_inputs)
    rt = _runtime(model, optimizer, device, blocks.PipelinedForward, context_type, apply_jit, pipeline_postproc,
                  custom_model_fwd, free_features_storage_early)
    compiled = CompiledAutograd(getattr(model, "_compiled_autograd_options", None))
    options = TaskOptions(clear_data_dist_inputs=clear_data_dist_inputs, compiled_autograd=compiled)
    return _make(SPECS["CompAutograd"], rt, options, execute_all_batches=execute_all_batches, swp=swp)


def _use_main_stream_for_dist_init(clear_data_dist_inputs: bool) -> None:
    if clear_data_dist_inputs:  # TorchRec sets this class-wide too
        blocks.PipelinedForward._use_main_stream_for_dist_init = True
