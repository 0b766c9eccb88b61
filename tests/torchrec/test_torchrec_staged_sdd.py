"""StagedTrainPipeline with TorchRec's own input-dist stage (``SparseDataDistUtil``), on 2 gloo ranks.

TorchRec's documented usage: a copy stage, then ``start_sparse_data_dist`` as the
final stage with ``wait_sdd_fill_callback`` as its fill callback; the util's
forward hook on the model waits for the next batch's input dist and advances its
contexts. The input dist issues collectives, and so do the caller's forward and
backward: every rank must issue them in the same order, and the util's contexts
must advance in step with the forward. Ours runs the stages on the caller's thread,
one step ahead as TorchRec does, so both hold.

Each rank runs TorchRec's StagedTrainPipeline (under the test-only CPU shim of
test_torchrec_shimmed.py) and ours in the same configuration and records every
step's logits, the final parameters and the order of the input-dist calls and
forwards; the tests compare them bitwise, with each other and with the plain loop.
A hang fails the test: ``run_on_ranks`` kills ranks that do not finish in time.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest

pytest.importorskip("torchrec.distributed")  # not "torchrec": without it, this folder imports as that name

import torch  # noqa: E402

from dist_harness import run_on_ranks  # noqa: E402

CPU = torch.device("cpu")
NUM_BATCHES = 10


def _state(model: Any) -> List[torch.Tensor]:
    """Every parameter this rank holds: the dense ones and its embedding shards."""
    from torchrec_model import embedding_weights

    dense = [p.detach().clone() for name, p in model.named_parameters() if "embedding_bags" not in name]
    return dense + [w.detach().clone() for w in embedding_weights(model)]


class Trace:
    """The order of input-dist calls and forwards on this rank, batches named by their position in ``batches``."""

    def __init__(self, batches: Sequence[Any]) -> None:
        self.batches = batches
        self.events: List[Tuple[str, int]] = []

    def which(self, batch: Any) -> int:
        return next(k for k, b in enumerate(self.batches) if torch.equal(b.labels, batch.labels))

    def install(self) -> Callable[[], None]:
        """Record SparseDataDistUtil's start/wait calls (class-wide, so bound methods and the hook see it)."""
        from torchrec.distributed.train_pipeline.pipeline_stage import SparseDataDistUtil

        start, wait = SparseDataDistUtil.start_sparse_data_dist, SparseDataDistUtil.wait_sparse_data_dist

        def traced_start(util: Any, batch: Any) -> Any:
            self.events.append(("start", self.which(batch)))
            return start(util, batch)

        def traced_wait(util: Any) -> None:
            self.events.append(("wait", -1))
            wait(util)

        setattr(SparseDataDistUtil, "start_sparse_data_dist", traced_start)
        setattr(SparseDataDistUtil, "wait_sparse_data_dist", traced_wait)

        def uninstall() -> None:
            setattr(SparseDataDistUtil, "start_sparse_data_dist", start)
            setattr(SparseDataDistUtil, "wait_sparse_data_dist", wait)
        return uninstall


def train(staged: Callable[..., Any], epochs: Sequence[Sequence[Any]], trace: Trace, helper: bool = False,
          **kwargs: Any) -> Dict[str, Any]:
    """A fresh model trained on what a (copy, input dist) StagedTrainPipeline returns, one loop per epoch."""
    from torchrec.distributed.train_pipeline.pipeline_stage import PipelineStage, SparseDataDistUtil

    from torchrec_model import build_dlrm, logits
    from torchrec_scenarios import _HostStream

    model, optimizer = build_dlrm()
    sdd = SparseDataDistUtil(model=model, data_dist_stream=_HostStream())
    dist_stage = sdd.start_sparse_data_dist_stage() if helper else PipelineStage(
        name="start_sparse_data_dist", runnable=sdd.start_sparse_data_dist, stream=sdd.data_dist_stream,
        fill_callback=sdd.wait_sdd_fill_callback)
    stages = [PipelineStage(name="data_copy", runnable=lambda b: b.to(CPU), stream=_HostStream()), dist_stage]
    pipeline = staged(stages, compute_stream=_HostStream(), **kwargs)
    trace.events.clear()
    outputs: List[torch.Tensor] = []
    per_epoch: List[int] = []
    for epoch in epochs:
        it = iter(epoch)
        before = len(outputs)
        while (batch := pipeline.progress(it)) is not None:
            trace.events.append(("forward", trace.which(batch)))
            optimizer.zero_grad()
            loss, output = model(batch)
            loss.backward()
            optimizer.step()
            outputs.append(logits(output))
        per_epoch.append(len(outputs) - before)
    return {"logits": torch.stack(outputs) if outputs else None, "state": _state(model),
            "events": list(trace.events), "steps": per_epoch}


def staged_sdd(rank: int, world_size: int) -> Dict[str, Any]:
    """TorchRec's StagedTrainPipeline and ours with a SparseDataDistUtil stage, and the plain loop."""
    from torchrec_model import build_dlrm, logits, make_batches
    from torchrec_scenarios import _install_cpu_shim

    _install_cpu_shim()
    import torchrec.distributed.train_pipeline.train_pipelines as trec

    import swpipeline.torchrec as ours

    batches = make_batches(rank, NUM_BATCHES + 2)
    trace = Trace(batches)
    uninstall = trace.install()
    try:
        out: Dict[str, Any] = {}
        for lib, staged in (("torchrec", trec.StagedTrainPipeline), ("ours", ours.StagedTrainPipeline)):
            out[lib] = train(staged, [batches[:NUM_BATCHES]], trace)
        out["ours/helper"] = train(ours.StagedTrainPipeline, [batches[:NUM_BATCHES]], trace, helper=True)
        for lib, staged in (("torchrec", trec.StagedTrainPipeline), ("ours", ours.StagedTrainPipeline)):
            out[f"{lib}/epochs"] = train(staged, [batches[:7], batches[7:]], trace)  # 7 batches, then 5
    finally:
        uninstall()
    for key, data in (("ref", batches[:NUM_BATCHES]), ("ref/epochs", batches)):
        model, optimizer = build_dlrm()
        steps = []
        for batch in data:
            optimizer.zero_grad()
            loss, output = model(batch)
            loss.backward()
            optimizer.step()
            steps.append(logits(output))
        out[key] = {"logits": torch.stack(steps), "state": _state(model)}
    out["torchrec/epoch2"] = _torchrec_second_epoch(trec, batches)  # last: it leaves TorchRec's pipeline broken
    return out


def _torchrec_second_epoch(trec: Any, batches: Sequence[Any]) -> List[str]:
    """TorchRec's StagedTrainPipeline given a second iterator and called on after its first ``None``."""
    from torchrec.distributed.train_pipeline.pipeline_stage import PipelineStage, SparseDataDistUtil

    from torchrec_model import build_dlrm
    from torchrec_scenarios import _HostStream

    model, _ = build_dlrm()
    sdd = SparseDataDistUtil(model=model, data_dist_stream=_HostStream())
    stages = [PipelineStage(name="data_copy", runnable=lambda b: b.to(CPU), stream=_HostStream()),
              sdd.start_sparse_data_dist_stage()]
    pipeline = trec.StagedTrainPipeline(stages, compute_stream=_HostStream())
    seen: List[str] = []
    for epoch in (batches[:7], batches[7:]):
        it = iter(epoch)
        for _ in range(len(epoch) + 2):
            batch = pipeline.progress(it)
            if batch is None:
                seen.append("None")
                continue
            try:
                with torch.no_grad():
                    model(batch)
            except AssertionError as exc:
                seen.append(str(exc).split(",")[0])
                return seen
            seen.append("step")
    return seen


@pytest.fixture(scope="module")
def ranks() -> List[Dict[str, Any]]:
    return run_on_ranks(staged_sdd, world_size=2, timeout=150)


def assert_same_run(got: Dict[str, Any], want: Dict[str, Any], what: str) -> None:
    assert got["logits"] is not None and got["logits"].shape == want["logits"].shape, (
        f"{what}: {None if got['logits'] is None else got['logits'].shape[0]} steps vs {want['logits'].shape[0]}")
    assert torch.equal(got["logits"], want["logits"]), f"{what}: logits differ"
    assert len(got["state"]) == len(want["state"]) and all(
        torch.equal(a, b) for a, b in zip(got["state"], want["state"])), f"{what}: parameters differ"


@pytest.mark.parametrize("run", ["ours", "ours/helper"])
def test_ours_runs_every_step_and_equals_torchrecs_staged_pipeline(ranks: List[Dict[str, Any]], run: str) -> None:
    for rank, res in enumerate(ranks):
        assert_same_run(res[run], res["torchrec"], f"rank {rank} {run} vs TorchRec")
        assert_same_run(res[run], res["ref"], f"rank {rank} {run} vs the plain loop")


def test_input_dist_and_forwards_in_torchrecs_order_on_every_rank(ranks: List[Dict[str, Any]]) -> None:
    # fill: start(0), its wait (fill callback); then each step: start(k + 1) before forward(k), whose hook waits
    expected: List[Tuple[str, int]] = [("start", 0), ("wait", -1)]
    for k in range(NUM_BATCHES):
        expected += ([("start", k + 1)] if k + 1 < NUM_BATCHES else []) + [("forward", k), ("wait", -1)]
    for rank, res in enumerate(ranks):
        assert res["torchrec"]["events"] == expected, f"rank {rank}: TorchRec's order"
        assert res["ours"]["events"] == expected, f"rank {rank}: our order"


def test_a_second_epoch_on_the_same_pipeline(ranks: List[Dict[str, Any]]) -> None:
    for rank, res in enumerate(ranks):
        ours = res["ours/epochs"]
        assert ours["steps"] == [7, 5]
        assert_same_run(ours, res["ref/epochs"], f"rank {rank}: two epochs vs the plain loop over both")
        # TorchRec's returns None at once for the new iterator: its stages drain through None first, and the
        # first batch it returns after that finds no input dist (docs/torchrec.md)
        assert res["torchrec/epochs"]["steps"] == [7, 0], f"rank {rank}"
        assert res["torchrec/epoch2"] == ["step"] * 7 + ["None"] * 2 + ["None"] * 2 + [
            "Invalid PipelinedForward usage"], f"rank {rank}"


def test_lockstep_false_refuses_a_sparse_data_dist_stage() -> None:
    from torchrec.distributed.train_pipeline.pipeline_stage import PipelineStage, SparseDataDistUtil

    import swpipeline.torchrec as ours
    from torchrec_scenarios import _HostStream

    sdd = SparseDataDistUtil(model=torch.nn.Linear(1, 1), data_dist_stream=_HostStream())
    stages: List[Any] = [PipelineStage(name="data_copy", runnable=lambda b: b, stream=None),
                         sdd.start_sparse_data_dist_stage()]
    with pytest.raises(ValueError, match="SparseDataDistUtil, whose input dist issues collectives"):
        ours.StagedTrainPipeline(stages, lockstep=False)
    plain: Optional[Any] = ours.StagedTrainPipeline(stages[:1], lockstep=False)  # other stages may overlap the step
    assert plain is not None
