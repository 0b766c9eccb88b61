"""What each rank runs in the TorchRec tests (spawned by dist_harness.run_on_ranks).

Each function builds the same DLRM afresh for every run (identical weights), runs
TorchRec's pipeline, ours and a plain loop on the same batches, and returns the
logits of every step, stacked per run (``None`` for a run with no steps), plus
anything else a test checks. The tests compare them in the parent process.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from torchrec_model import (build_dlrm, drive, eval_reference, logits, make_batches, semi_sync_reference,
                            train_reference)

NUM_BATCHES = 10
CPU = torch.device("cpu")


def _stack(outputs: List[torch.Tensor]) -> Optional[torch.Tensor]:
    return torch.stack(outputs) if outputs else None


def _run(factory: Callable[..., Any], batches: List[Any], between: Optional[Callable[[Any, Any, int], None]] = None,
         **kwargs: Any) -> Optional[torch.Tensor]:
    """A fresh model through ``factory(model, optimizer, cpu, **kwargs)``; the logits of every step."""
    model, optimizer = build_dlrm()
    pipeline = factory(model, optimizer, CPU, **kwargs)
    hook = None if between is None else (lambda step: between(pipeline, optimizer, step))
    return _stack(drive(pipeline, batches, hook))


def _reference(batches: List[Any]) -> Optional[torch.Tensor]:
    model, optimizer = build_dlrm()
    return _stack(train_reference(model, optimizer, batches))


def _lower_lr_after_step_4(pipeline: Any, optimizer: Any, step: int) -> None:
    if step == 4:  # what an LR scheduler does between steps
        for group in optimizer.param_groups:
            group["lr"] = 0.03


class DetachEvalAttach:
    """Between steps 4 and 5: detach the model, evaluate it on a batch (non-pipelined forward), attach it again."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch
        self.probe: List[torch.Tensor] = []

    def __call__(self, pipeline: Any, optimizer: Any, step: int) -> None:
        if step == 4:
            model = pipeline.detach()
            with torch.no_grad():
                self.probe.append(logits(model(self.batch)[1]))
            pipeline.attach()


def parity(rank: int, world_size: int) -> Dict[str, Any]:
    """Every variant on CPU: TorchRec (where it runs) vs ours vs the plain loop, plus the options."""
    import torchrec.distributed.train_pipeline.train_pipelines as trec

    import swpipeline.torchrec as ours

    batches = make_batches(rank, NUM_BATCHES)
    out: Dict[str, Any] = {"ref": _reference(batches)}
    model, _ = build_dlrm()
    out["ref_eval"] = _stack(eval_reference(model, batches))
    for name in ("TrainPipelineBase", "TrainPipelineSparseDist", "TrainPipelineSparseDistLite",
                 "EvalPipelineSparseDist"):
        out[f"torchrec/{name}"] = _run(getattr(trec, name), batches)
        out[f"ours/{name}"] = _run(getattr(ours, name), batches)
    for name in ("TrainPipelineFusedSparseDist", "PrefetchTrainPipelineSparseDist", "EvalPipelineFusedSparseDist",
                 "TrainPipelineSemiSync"):
        out[f"ours/{name}"] = _run(getattr(ours, name), batches)
    for stream in ("data_dist", "current"):
        out[f"ours/Fused/{stream}"] = _run(ours.TrainPipelineFusedSparseDist, batches, emb_lookup_stream=stream)
    out["ours/EvalFused/prefetch"] = _run(ours.EvalPipelineFusedSparseDist, batches,
                                          enable_embedding_lookup_prefetch=True)
    _semi_sync(out, ours, batches)
    _options(out, trec, ours, batches)
    _short_data(out, trec, ours, rank)
    _staged(out, ours, batches)
    return out


def _semi_sync(out: Dict[str, Any], ours: Any, batches: List[Any]) -> None:
    for stash in (False, True):
        out[f"ours/SemiSync/stash={stash}"] = _run(ours.TrainPipelineSemiSync, batches, start_batch=3,
                                                   stash_gradients=stash)
        model, optimizer = build_dlrm()
        out[f"ref/SemiSync/stash={stash}"] = _stack(semi_sync_reference(model, optimizer, batches, 3, stash))


def _options(out: Dict[str, Any], trec: Any, ours: Any, batches: List[Any]) -> None:
    def doubled_loss_fwd(model: Any) -> Callable[[Any], Any]:
        return lambda batch: (lambda loss, output: (2 * loss, output))(*model(batch))

    for lib, mod in (("torchrec", trec), ("ours", ours)):
        out[f"{lib}/execute_all_batches=False"] = _run(mod.TrainPipelineSparseDist, batches, execute_all_batches=False)
        out[f"{lib}/enqueue_batch_after_forward"] = _run(mod.TrainPipelineSparseDist, batches,
                                                         enqueue_batch_after_forward=True)
        out[f"{lib}/lr_between_steps"] = _run(mod.TrainPipelineSparseDist, batches, _lower_lr_after_step_4)
        model, optimizer = build_dlrm()
        pipeline = mod.TrainPipelineSparseDist(model, optimizer, CPU, custom_model_fwd=doubled_loss_fwd(model))
        out[f"{lib}/custom_model_fwd"] = _stack(drive(pipeline, batches))
        probe = DetachEvalAttach(batches[0])
        out[f"{lib}/detach_attach"] = _run(mod.TrainPipelineSparseDist, batches, probe)
        out[f"{lib}/detach_attach/probe"] = probe.probe[0]
    model, optimizer = build_dlrm()
    out["ref/custom_model_fwd"] = _stack(train_reference(model, optimizer, batches, loss_scale=2.0))
    out["ours/lockstep=False"] = _run(ours.TrainPipelineSparseDist, batches, lockstep=False)
    out["ours/caller_thread=False"] = _run(ours.TrainPipelineSparseDist, batches, caller_thread=False)
    out["ours/prep_thread"] = _run(ours.TrainPipelineSparseDist, [b for b in batches],
                                   thread_groups={"H2D": "prep"}, prepare_batch=lambda b: b)
    for name in ("TrainPipelineFusedSparseDist", "PrefetchTrainPipelineSparseDist", "TrainPipelineSemiSync"):
        out[f"ours/{name}/execute_all_batches=False"] = _run(getattr(ours, name), batches, execute_all_batches=False)


def _short_data(out: Dict[str, Any], trec: Any, ours: Any, rank: int) -> None:
    """0-3 batches: the step at which StopIteration comes, with and without execute_all_batches."""
    for count in (0, 1, 2, 3):
        few = make_batches(rank, count)
        for execute_all in (True, False):
            for lib, mod in (("torchrec", trec), ("ours", ours)):
                result = _run(mod.TrainPipelineSparseDist, few, execute_all_batches=execute_all)
                out[f"{lib}/short/{count}/{execute_all}"] = result


def _halve(batch: Any) -> Any:
    from torchrec.datasets.utils import Batch

    return Batch(dense_features=batch.dense_features * 0.5, sparse_features=batch.sparse_features,
                 labels=batch.labels)


def _train_staged(staged: Callable[..., Any], batches: List[Any], stream: Any = None,
                  **kwargs: Any) -> Tuple[Optional[torch.Tensor], Dict[str, int]]:
    """Train on what a 2-stage StagedTrainPipeline (copy, halve the dense features) returns; logits and callbacks."""
    from torchrec.distributed.train_pipeline.pipeline_stage import PipelineStage

    calls: Dict[str, int] = {"fill": 0, "exhausted": 0}

    def count(key: str) -> Callable[[], None]:
        return lambda: calls.__setitem__(key, calls[key] + 1)

    stages = [PipelineStage(name="data_copy", runnable=lambda b: b.to(CPU), stream=stream, fill_callback=count("fill")),
              PipelineStage(name="halve", runnable=_halve, stream=stream, data_exhausted_callback=count("exhausted"))]
    pipeline = staged(stages, **kwargs)
    model, optimizer = build_dlrm()
    outputs = []
    it = iter(batches)
    while (batch := pipeline.progress(it)) is not None:
        optimizer.zero_grad()
        loss, output = model(batch)
        loss.backward()
        optimizer.step()
        outputs.append(logits(output))
    return _stack(outputs), dict(calls)


def _staged(out: Dict[str, Any], ours: Any, batches: List[Any]) -> None:
    out["ours/Staged"], out["ours/Staged/callbacks"] = _train_staged(ours.StagedTrainPipeline, batches)
    model, optimizer = build_dlrm()
    out["ref/Staged"] = _stack(train_reference(model, optimizer, [_halve(b) for b in batches]))
    staged = ours.StagedTrainPipeline([_stage_named("data_copy"), _stage_named("halve")])
    out["ours/Staged/table"] = staged.format_schedule(4)


def _stage_named(name: str) -> Any:
    from torchrec.distributed.train_pipeline.pipeline_stage import PipelineStage

    return PipelineStage(name=name, runnable=lambda b: b, stream=None)


def compiled(rank: int, world_size: int) -> Dict[str, Any]:
    """PT2 and compiled autograd: TorchRec vs ours vs the plain loop.

    The compiler backend is ``eager`` (dynamo capture, no code generation: fast and
    exact); set SWP_TEST_COMPILE_BACKEND=aot_eager or inductor for the full compilers.
    """
    import torchrec.distributed.train_pipeline.train_pipelines as trec

    import swpipeline.torchrec as ours

    backend = os.environ.get("SWP_TEST_COMPILE_BACKEND", "eager")
    batches = make_batches(rank, 5, ids_per_feature=2)  # one shape: one compilation
    out: Dict[str, Any] = {"ref": _reference(batches)}
    config = trec.TorchCompileConfig(backend=backend, compile_on_iter=2)
    for lib, mod in (("torchrec", trec), ("ours", ours)):
        out[f"{lib}/TrainPipelinePT2"] = _run(mod.TrainPipelinePT2, batches, compile_configs=config)
        torch._dynamo.reset()
    for lib, mod in (("torchrec", trec), ("ours", ours)):
        model, optimizer = build_dlrm(python_reducer=True)
        model._compiled_autograd_options = {"backend": backend, "dynamic": True, "fullgraph": False}
        pipeline = mod.TrainPipelineSparseDistCompAutograd(model, optimizer, CPU)
        torch._logging.set_logs()  # TorchRec's constructor turns on verbose compiled-autograd logs
        out[f"{lib}/TrainPipelineSparseDistCompAutograd"] = _stack(drive(pipeline, batches))
        torch._dynamo.reset()
    return out


def uneven(rank: int, world_size: int) -> Dict[str, Any]:
    """Ranks with different batch counts: with stop_together every rank stops at the shortest rank's count."""
    import swpipeline.torchrec as ours

    counts = [7, 10]
    mine = make_batches(rank, counts[rank])
    shortest = make_batches(rank, min(counts))
    out: Dict[str, Any] = {"ref": _reference(shortest)}
    for name in ("TrainPipelineSparseDist", "TrainPipelineBase", "TrainPipelineSemiSync"):
        out[name] = _run(getattr(ours, name), mine, stop_together=True)
    out["prep_thread"] = _run(ours.TrainPipelineSparseDist, mine, stop_together=True, thread_groups={"H2D": "prep"})
    out["execute_all_batches=False"] = _run(ours.TrainPipelineSparseDist, mine, stop_together=True,
                                            execute_all_batches=False)
    return out


class _HostStream:
    """A stand-in "stream" for TorchRec code that wants one on the CPU (has a device, waits on nothing)."""

    device = torch.device("cpu")

    def wait_stream(self, other: Any) -> None:
        return None


def _install_cpu_shim() -> None:
    """Let TorchRec's accelerator-only pipelines run on the CPU in this process (test only).

    Two stream calls are meaningless on the CPU and fail there: ``Tensor.record_stream``
    with a CPU stream, and ``torch.cuda.current_stream()`` in a CPU build. Both become
    no-ops; nothing else about TorchRec's pipelines changes.
    """
    setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    setattr(torch.cuda, "current_stream", torch.cpu.current_stream)


def torchrec_with_cpu_shim(rank: int, world_size: int) -> Dict[str, Any]:
    """TorchRec's Fused, SemiSync, Prefetch and EvalFused, made to run on the CPU by a two-line shim, vs ours."""
    _install_cpu_shim()
    import torchrec.distributed.train_pipeline.train_pipelines as trec

    import swpipeline.torchrec as ours

    batches = make_batches(rank, NUM_BATCHES)
    out: Dict[str, Any] = {}
    runs = [("TrainPipelineFusedSparseDist", {}), ("TrainPipelineFusedSparseDist", {"execute_all_batches": False}),
            ("TrainPipelineSemiSync", {"start_batch": 3}),
            ("TrainPipelineSemiSync", {"start_batch": 3, "stash_gradients": True}),
            ("PrefetchTrainPipelineSparseDist", {}), ("EvalPipelineFusedSparseDist", {})]
    for name, kwargs in runs:
        key = f"{name}{kwargs}"
        model, optimizer = build_dlrm()
        theirs = getattr(trec, name)(model, optimizer, CPU, **kwargs)
        if name == "PrefetchTrainPipelineSparseDist":  # TorchRec skips the prefetch without a data-dist stream
            theirs._data_dist_stream = _HostStream()
            theirs._stream_context = lambda stream: contextlib.nullcontext()
        out[f"torchrec/{key}"] = _stack(drive(theirs, batches))
        out[f"ours/{key}"] = _run(getattr(ours, name), batches, **kwargs)
    for lib, staged in (("torchrec", trec.StagedTrainPipeline), ("ours", ours.StagedTrainPipeline)):
        out[f"{lib}/StagedTrainPipeline"], out[f"{lib}/StagedTrainPipeline/callbacks"] = _train_staged(
            staged, batches, stream=_HostStream(), compute_stream=_HostStream())
    return out
