"""One pipeline object over several iterators (epochs), TorchRec's class and ours side by side.

Each case builds the same DLRM for TorchRec's class and for ours, runs epoch 1 on
one iterator and epoch 2 on a second one (with or without ``reset()`` in between),
and records which batches each epoch's steps ran (a batch is recognised by its
labels, which the model's output carries) and every step's logits. The tests
assert that ours equals TorchRec's class bitwise, or, where docs/torchrec.md
("Where we differ from TorchRec, and why") says we differ, exactly the documented
difference. One spawned rank runs everything (a 1-rank gloo group: nothing here
needs two ranks). TorchRec's Fused, SemiSync, Prefetch, EvalFused and Staged run
under the test-only CPU shim of test_torchrec_shimmed.py.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest

pytest.importorskip("torchrec.distributed")  # not "torchrec": without it, this folder imports as that name

import torch  # noqa: E402

from dist_harness import run_on_ranks  # noqa: E402

CPU = torch.device("cpu")
NUM_BATCHES = 12
Record = Tuple[List[List[Optional[int]]], List[Optional[torch.Tensor]]]  # batches run per epoch, logits per epoch


def _which(batches: Sequence[Any], output: Any) -> int:
    """The index of the batch whose step returned ``output`` (DLRMTrain's output carries the labels)."""
    hits = [k for k, batch in enumerate(batches) if torch.equal(batch.labels, output[2])]
    assert len(hits) == 1, f"output matches batches {hits}"
    return hits[0]


class Cases:
    """Runs a pipeline class over epochs; ``out[key]`` is its Record."""

    def __init__(self, batches: List[Any]) -> None:
        self.batches = batches
        self.out: Dict[str, Any] = {}

    def epochs(self, key: str, factory: Callable[..., Any], sizes: Sequence[int], reset: bool = False,
               torchrec_prefetch: bool = False, **kwargs: Any) -> None:
        from torchrec_model import build_dlrm
        from torchrec_scenarios import _HostStream

        model, optimizer = build_dlrm()
        pipeline = factory(model, optimizer, CPU, **kwargs)
        if torchrec_prefetch:  # TorchRec skips the prefetch without a data-dist stream (test_torchrec_shimmed.py)
            pipeline._data_dist_stream = _HostStream()
            pipeline._stream_context = lambda stream: contextlib.nullcontext()
        ran: List[List[Optional[int]]] = []
        logits: List[Optional[torch.Tensor]] = []
        start = 0
        for epoch, size in enumerate(sizes):
            if epoch and reset:
                pipeline.reset()
            it = iter(self.batches[start:start + size])
            start += size
            steps, outs = self._drain(pipeline, it)
            ran.append(steps)
            logits.append(torch.stack(outs) if outs else None)
        self.out[key] = (ran, logits)

    def _drain(self, pipeline: Any, it: Any) -> Tuple[List[Optional[int]], List[torch.Tensor]]:
        steps: List[Optional[int]] = []
        outs: List[torch.Tensor] = []
        while len(steps) <= NUM_BATCHES:
            try:
                output = pipeline.progress(it)
            except StopIteration:
                break
            steps.append(_which(self.batches, output))
            outs.append(output[1].detach().clone())
        return steps, outs


def _key(lib: str, name: str, sizes: Sequence[int], reset: bool = False, **kwargs: Any) -> str:
    return f"{lib}/{name}/{tuple(sizes)}/reset={reset}/{sorted(kwargs.items())}"


# (name, sizes of the two epochs, reset() between them, options): cases where ours equals TorchRec's class
MATCHED: List[Tuple[str, Tuple[int, int], bool, Dict[str, Any]]] = [
    # a new iterator: both run every batch of it
    ("TrainPipelineSparseDist", (7, 5), False, {}),
    ("TrainPipelineSparseDistLite", (7, 5), False, {}),
    ("TrainPipelineFusedSparseDist", (7, 5), False, {}),
    ("EvalPipelineFusedSparseDist", (7, 5), False, {}),
    ("PrefetchTrainPipelineSparseDist", (7, 5), False, {}),
    ("TrainPipelinePT2", (7, 5), False, {}),
    # SemiSync counts batches across iterators: start_batch is reached in epoch 2 (with stash_gradients, the
    # batch at start_batch skips its dense step), or counted from reset()
    ("TrainPipelineSemiSync", (7, 5), False, {"start_batch": 3}),
    ("TrainPipelineSemiSync", (2, 5), False, {"start_batch": 3}),
    ("TrainPipelineSemiSync", (2, 5), False, {"start_batch": 3, "stash_gradients": True}),
    ("TrainPipelineSemiSync", (2, 5), True, {"start_batch": 3}),
    ("TrainPipelineSemiSync", (12, 0), False, {"start_batch": 3}),
    # execute_all_batches=False: the batches in flight at the stop run first in epoch 2; reset() drops them
    ("TrainPipelineSparseDist", (7, 5), False, {"execute_all_batches": False}),
    ("TrainPipelineSparseDist", (2, 5), False, {"execute_all_batches": False}),
    ("TrainPipelineSparseDist", (0, 5), False, {"execute_all_batches": False}),
    ("TrainPipelineFusedSparseDist", (7, 5), False, {"execute_all_batches": False}),
    ("EvalPipelineFusedSparseDist", (7, 5), False, {"execute_all_batches": False}),
    ("TrainPipelineSparseDist", (7, 5), True, {"execute_all_batches": False}),
    ("TrainPipelineFusedSparseDist", (1, 5), True, {"execute_all_batches": False}),
    # with reset() between epochs, Base and EvalSparseDist too
    ("TrainPipelineBase", (7, 5), True, {}),
    ("EvalPipelineSparseDist", (7, 5), True, {}),
]

# where ours differs: run both, and ours with reset() where that is the reference
DIFFERENT: List[Tuple[str, Tuple[int, int], bool, Dict[str, Any]]] = [
    ("TrainPipelineBase", (7, 5), False, {}),
    ("TrainPipelineBase", (0, 5), False, {}),
    ("EvalPipelineSparseDist", (7, 5), False, {}),
    ("TrainPipelineSparseDist", (1, 5), False, {"execute_all_batches": False}),
    ("TrainPipelineFusedSparseDist", (1, 5), False, {"execute_all_batches": False}),
    ("EvalPipelineFusedSparseDist", (1, 5), False, {"execute_all_batches": False}),
    ("PrefetchTrainPipelineSparseDist", (7, 5), False, {"execute_all_batches": False}),
    ("PrefetchTrainPipelineSparseDist", (7, 5), True, {"execute_all_batches": False}),
    ("TrainPipelineSemiSync", (7, 5), False, {"start_batch": 3, "execute_all_batches": False}),
]


def epochs(rank: int, world_size: int) -> Dict[str, Any]:
    """Every case of this module, TorchRec's class and ours (spawned by run_on_ranks)."""
    from torchrec_model import make_batches
    from torchrec_scenarios import _install_cpu_shim

    _install_cpu_shim()
    import torchrec.distributed.train_pipeline.train_pipelines as trec

    import swpipeline.torchrec as ours

    batches = make_batches(rank, NUM_BATCHES)
    assert len({tuple(b.labels.tolist()) for b in batches}) == NUM_BATCHES  # each batch recognisable
    cases = Cases(batches)
    for name, sizes, reset, kwargs in MATCHED + DIFFERENT:
        options = dict(kwargs)
        if name == "TrainPipelinePT2":  # no compilation: the epoch logic is what is compared here
            options["compile_configs"] = trec.TorchCompileConfig(compile_on_iter=10**6)
        for lib, mod in (("torchrec", trec), ("ours", ours)):
            cases.epochs(_key(lib, name, sizes, reset, **kwargs), getattr(mod, name), sizes, reset,
                         torchrec_prefetch=lib == "torchrec" and name.startswith("Prefetch"), **options)
    for name, sizes, _, kwargs in DIFFERENT:  # with reset() between the epochs: the reference of the differences
        for lib, mod in (("torchrec", trec), ("ours", ours)):
            key = _key(lib, name, sizes, True, **kwargs)
            if key not in cases.out:
                cases.epochs(key, getattr(mod, name), sizes, True,
                             torchrec_prefetch=lib == "torchrec" and name.startswith("Prefetch"), **kwargs)
    _eval_switches_iterator(cases, trec, ours)
    _pt2_after_the_end(cases, trec, ours)
    _context_indices(cases, trec, ours)
    _custom_model_fwd(cases, trec, ours)
    _staged(cases, trec, ours)
    return cases.out


def _eval_switches_iterator(cases: Cases, trec: Any, ours: Any) -> None:
    """EvalSparseDist given a second iterator after 3 steps of the first (7 batches, then 5)."""
    from torchrec_model import build_dlrm

    for lib, mod in (("torchrec", trec), ("ours", ours)):
        model, optimizer = build_dlrm()
        pipeline = mod.EvalPipelineSparseDist(model, optimizer, CPU)
        first, second = iter(cases.batches[:7]), iter(cases.batches[7:])
        steps = [_which(cases.batches, pipeline.progress(first)) for _ in range(3)]
        more, _ = cases._drain(pipeline, second)
        cases.out[f"{lib}/Eval/switch"] = steps + more


def _pt2_after_the_end(cases: Cases, trec: Any, ours: Any) -> None:
    """TrainPipelinePT2 called 3 more times with its exhausted iterator: how often it calls next() on it."""
    from torchrec_model import build_dlrm

    class Counting:
        def __init__(self, batches: Sequence[Any]) -> None:
            self.batches, self.calls = iter(batches), 0

        def __iter__(self) -> "Counting":
            return self

        def __next__(self) -> Any:
            self.calls += 1
            return next(self.batches)

    for lib, mod in (("torchrec", trec), ("ours", ours)):
        model, optimizer = build_dlrm()
        config = trec.TorchCompileConfig(compile_on_iter=10**6)
        pipeline = mod.TrainPipelinePT2(model, optimizer, CPU, compile_configs=config)
        it = Counting(cases.batches[:3])
        steps, _ = cases._drain(pipeline, it)
        for _ in range(3):
            with contextlib.suppress(StopIteration):
                pipeline.progress(it)
        cases.out[f"{lib}/PT2/next_calls"] = (steps, it.calls)


def _context_indices(cases: Cases, trec: Any, ours: Any) -> None:
    """SparseDist on 7 and then 5 batches: the ``index`` of the context each forward runs with."""
    from torchrec_model import build_dlrm

    for lib, mod in (("torchrec", trec), ("ours", ours)):
        model, optimizer = build_dlrm()
        seen: List[int] = []

        def forward(batch: Any, model: Any = model, seen: List[int] = seen) -> Any:
            ebc = model.module.model.sparse_arch.embedding_bag_collection
            seen.append(ebc.forward.get_context().index)  # the pipelined forward's context
            return model(batch)

        pipeline = mod.TrainPipelineSparseDist(model, optimizer, CPU, custom_model_fwd=forward)
        for epoch in (cases.batches[:7], cases.batches[7:]):
            cases._drain(pipeline, iter(epoch))
        cases.out[f"{lib}/SparseDist/context_index"] = seen


def _custom_model_fwd(cases: Cases, trec: Any, ours: Any) -> None:
    """TrainPipelineBase with a custom forward that doubles the loss."""
    from torchrec_model import build_dlrm, train_reference

    for lib, mod in (("torchrec", trec), ("ours", ours)):
        model, optimizer = build_dlrm()
        doubled = (lambda m: lambda batch: (lambda loss, out: (2 * loss, out))(*m(batch)))(model)
        pipeline = mod.TrainPipelineBase(model, optimizer, CPU, custom_model_fwd=doubled)
        _, outs = cases._drain(pipeline, iter(cases.batches))
        cases.out[f"{lib}/Base/custom_model_fwd"] = torch.stack(outs)
    for scale in (1.0, 2.0):
        model, optimizer = build_dlrm()
        cases.out[f"ref/loss_scale={scale}"] = torch.stack(train_reference(model, optimizer, cases.batches, scale))


def _staged(cases: Cases, trec: Any, ours: Any) -> None:
    """StagedTrainPipeline (copy, halve) called 9 times per epoch on 7 and then 5 batches; None is recorded."""
    from torchrec.distributed.train_pipeline.pipeline_stage import PipelineStage

    from torchrec_model import build_dlrm
    from torchrec_scenarios import _halve, _HostStream

    for lib, mod in (("torchrec", trec), ("ours", ours)):
        stages = [PipelineStage(name="data_copy", runnable=lambda b: b.to(CPU), stream=_HostStream()),
                  PipelineStage(name="halve", runnable=_halve, stream=_HostStream())]
        pipeline = mod.StagedTrainPipeline(stages, compute_stream=_HostStream())
        model, optimizer = build_dlrm()
        ran: List[List[Optional[int]]] = []
        for epoch in (cases.batches[:7], cases.batches[7:]):
            it, calls = iter(epoch), []
            for _ in range(9):
                batch = pipeline.progress(it)
                if batch is None:
                    calls.append(None)
                    continue
                optimizer.zero_grad()
                loss, output = model(batch)
                loss.backward()
                optimizer.step()
                calls.append(_which(cases.batches, output))
            ran.append(calls)
        cases.out[f"{lib}/Staged"] = ran
    for lib, mod in (("torchrec", trec), ("ours", ours)):  # set_flush(True) after the 3rd call, one epoch
        flushed: List[Any] = []
        stages = [PipelineStage(name="data_copy", runnable=lambda b: b.to(CPU), stream=_HostStream()),
                  PipelineStage(name="halve", runnable=_halve, stream=_HostStream())]
        pipeline = mod.StagedTrainPipeline(stages, compute_stream=_HostStream(),
                                           on_flush_end=lambda: flushed.append("flush_end"))
        it = iter(cases.batches[:8])
        for call in range(10):
            if call == 3:
                pipeline.set_flush(True)
            batch = pipeline.progress(it)
            flushed.append(None if batch is None else _which(cases.batches, (None, None, batch.labels)))
        cases.out[f"{lib}/Staged/flush"] = flushed


@pytest.fixture(scope="module")
def res() -> Dict[str, Any]:
    return run_on_ranks(epochs, world_size=1, timeout=240)[0]


def assert_same(got: Record, want: Record, what: str) -> None:
    assert got[0] == want[0], f"{what}: batches run {got[0]} vs {want[0]}"
    for epoch, (a, b) in enumerate(zip(got[1], want[1])):
        assert (a is None) == (b is None), f"{what}: epoch {epoch + 1} ran in one run only"
        if a is not None and b is not None:
            assert torch.equal(a, b), f"{what}: epoch {epoch + 1} logits differ by {(a - b).abs().max().item():.3g}"


def logits(record: Record) -> torch.Tensor:
    """Every step's logits, all epochs in order."""
    return torch.cat([epoch for epoch in record[1] if epoch is not None])


def test_labels_pick_out_the_right_batch(res: Dict[str, Any]) -> None:
    assert res[_key("ours", "TrainPipelineSparseDist", (7, 5))][0] == [list(range(7)), list(range(7, 12))]


@pytest.mark.parametrize("name,sizes,reset,kwargs", MATCHED, ids=[f"{n}-{s}-reset={r}-{k}" for n, s, r, k in MATCHED])
def test_equals_torchrec_across_epochs(res: Dict[str, Any], name: str, sizes: Tuple[int, int], reset: bool,
                                       kwargs: Dict[str, Any]) -> None:
    assert_same(res[_key("ours", name, sizes, reset, **kwargs)], res[_key("torchrec", name, sizes, reset, **kwargs)],
                f"{name} {sizes} reset={reset} {kwargs}")


def test_semi_sync_counts_batches_across_epochs(res: Dict[str, Any]) -> None:
    # start_batch=3 with epochs of 2 and 5 batches: batch 3 of the stream (the 2nd of epoch 2) is the first
    # semi-sync one; counting from each epoch's start would make the run differ from the one with reset()
    kept = res[_key("ours", "TrainPipelineSemiSync", (2, 5), start_batch=3)]
    restarted = res[_key("ours", "TrainPipelineSemiSync", (2, 5), True, start_batch=3)]
    assert kept[0] == restarted[0] == [[0, 1], [2, 3, 4, 5, 6]]
    assert torch.equal(logits(kept)[:4], logits(restarted)[:4])  # batch 4 is the first to read stale embeddings
    assert not torch.equal(logits(kept)[4:], logits(restarted)[4:])


def test_carried_batches_run_first_in_the_next_epoch(res: Dict[str, Any]) -> None:
    # execute_all_batches=False stops 2 steps before the end of the data; the 2 batches in flight run next
    ran = res[_key("ours", "TrainPipelineSparseDist", (7, 5), execute_all_batches=False)][0]
    assert ran == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert res[_key("ours", "TrainPipelineSparseDist", (7, 5), True, execute_all_batches=False)][0] == [
        [0, 1, 2, 3, 4], [7, 8, 9]]


# -- the documented differences ------------------------------------------------------------------

@pytest.mark.parametrize("name,sizes", [("TrainPipelineBase", (7, 5)), ("TrainPipelineBase", (0, 5)),
                                        ("EvalPipelineSparseDist", (7, 5))])
def test_a_new_iterator_runs_without_reset(res: Dict[str, Any], name: str, sizes: Tuple[int, int]) -> None:
    first, second = list(range(sizes[0])), list(range(sizes[0], sum(sizes)))
    theirs = res[_key("torchrec", name, sizes)]
    assert theirs[0] == [first, []]  # TorchRec: no step until reset()
    ours = res[_key("ours", name, sizes)]
    assert ours[0] == [first, second]  # ours: the new iterator's batches, exactly as TorchRec after reset()
    assert_same(ours, res[_key("torchrec", name, sizes, True)], f"{name} vs TorchRec with reset()")


def test_eval_reads_the_latest_iterator(res: Dict[str, Any]) -> None:
    assert res["torchrec/Eval/switch"] == [0, 1, 2, 3, 4, 5, 6]  # TorchRec's loader thread keeps the first one
    assert res["ours/Eval/switch"] == [0, 1, 2, 3, 7, 8, 9, 10, 11]  # batch 3 was in flight when it changed


def test_context_indices_have_no_gaps(res: Dict[str, Any]) -> None:
    theirs = res["torchrec/SparseDist/context_index"]
    assert theirs[:7] == list(range(7)) and theirs[7] > 7  # failed draws at the end of epoch 1 used indices up
    assert theirs[7:] == list(range(theirs[7], theirs[7] + 5))
    assert res["ours/SparseDist/context_index"] == list(range(12))


def test_pt2_does_not_ask_an_exhausted_iterator_again(res: Dict[str, Any]) -> None:
    assert res["torchrec/PT2/next_calls"] == ([0, 1, 2], 7)  # 3 batches, the end, and once per later call
    assert res["ours/PT2/next_calls"] == ([0, 1, 2], 4)


def test_base_applies_custom_model_fwd(res: Dict[str, Any]) -> None:
    assert torch.equal(res["torchrec/Base/custom_model_fwd"], res["ref/loss_scale=1.0"])  # TorchRec ignores it
    assert torch.equal(res["ours/Base/custom_model_fwd"], res["ref/loss_scale=2.0"])


@pytest.mark.parametrize("name", ["TrainPipelineSparseDist", "TrainPipelineFusedSparseDist",
                                  "EvalPipelineFusedSparseDist"])
def test_a_carried_batch_from_a_pipeline_that_never_filled(res: Dict[str, Any], name: str) -> None:
    # execute_all_batches=False, epoch 1 with 1 batch (3 are needed to fill), epoch 2 with 5: TorchRec fills
    # again on top of the carried batch, holds 4 batches in flight and stops a step earlier than its rule
    theirs = res[_key("torchrec", name, (1, 5), execute_all_batches=False)]
    ours = res[_key("ours", name, (1, 5), execute_all_batches=False)]
    assert theirs[0] == [[], [0, 1, 2]]
    assert ours[0] == [[], [0, 1, 2, 3]]  # step k runs when batch k + 2 exists: batches 0..5, so steps 0..3
    assert torch.equal(logits(ours)[:3], logits(theirs))


def test_prefetch_execute_all_batches_false_stops_by_the_rule(res: Dict[str, Any]) -> None:
    # TorchRec's Prefetch refills on every step with execute_all_batches=False (two extra batches drawn per step)
    kwargs = {"execute_all_batches": False}
    assert res[_key("torchrec", "PrefetchTrainPipelineSparseDist", (7, 5), **kwargs)][0] == [
        [0, 1, 2], [3, 4, 5, 6, 7]]
    assert res[_key("torchrec", "PrefetchTrainPipelineSparseDist", (7, 5), True, **kwargs)][0] == [[0, 1, 2], [7]]
    ours = res[_key("ours", "PrefetchTrainPipelineSparseDist", (7, 5), **kwargs)]
    assert ours[0] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert res[_key("ours", "PrefetchTrainPipelineSparseDist", (7, 5), True, **kwargs)][0] == [
        [0, 1, 2, 3, 4], [7, 8, 9]]
    # the same training steps as running every batch
    assert torch.equal(logits(ours), logits(res[_key("ours", "PrefetchTrainPipelineSparseDist", (7, 5))])[:10])


def test_semi_sync_execute_all_batches_false_stops_by_the_rule(res: Dict[str, Any]) -> None:
    kwargs = {"start_batch": 3, "execute_all_batches": False}
    theirs = res[_key("torchrec", "TrainPipelineSemiSync", (7, 5), **kwargs)]
    all_batches = res[_key("torchrec", "TrainPipelineSemiSync", (7, 5), start_batch=3)]
    assert_same(theirs, all_batches, "TorchRec's SemiSync ignores execute_all_batches=False")
    ours = res[_key("ours", "TrainPipelineSemiSync", (7, 5), **kwargs)]
    assert ours[0] == [[0, 1, 2, 3], [4, 5, 6, 7, 8]]  # depth 4: step k runs when batch k + 3 exists
    # the steps of one uninterrupted run (a new epoch's first batch would look its embeddings up afresh)
    assert torch.equal(logits(ours), logits(res[_key("torchrec", "TrainPipelineSemiSync", (12, 0), start_batch=3)])[:9])
    assert res[_key("ours", "TrainPipelineSemiSync", (7, 5), True, **kwargs)][0] == [[0, 1, 2, 3], [7, 8]]


def test_staged_refills_for_a_new_iterator(res: Dict[str, Any]) -> None:
    nothing_left = [None, None]
    assert res["torchrec/Staged"] == [list(range(7)) + nothing_left,
                                      nothing_left + list(range(7, 12)) + nothing_left]  # None first: a loop ends
    assert res["ours/Staged"] == [list(range(7)) + nothing_left, list(range(7, 12)) + [None] * 4]


def test_staged_flush_equals_torchrec(res: Dict[str, Any]) -> None:
    # set_flush(True) before the 4th call: the batches in flight come out, on_flush_end, the pipeline refills
    assert res["ours/Staged/flush"] == res["torchrec/Staged/flush"] == [0, 1, 2, 3, 4, "flush_end", 5, 6, 7, None, None]


# -- the carry-over on toy plans (no TorchRec model): every thread arrangement ------------------------

def toy(depth: int, prep_thread: bool = False, **kwargs: Any) -> Any:
    """One task per stage, each after the previous stage's; the output is the batch. S0 optionally on a thread."""
    import swpipeline.torchrec as swtr
    from swpipeline import IterContext, PipelinePlan, PipelineTask, TaskSchedule

    def stage_task(ctx: IterContext) -> None:
        ctx.output = ctx.batch

    tasks = [PipelineTask(f"S{k}", stage_task) for k in range(depth)]
    schedule = {t: TaskSchedule(stage=k, thread_group="prep", stream="prep") if prep_thread and k == 0
                else TaskSchedule(stage=k) for k, t in enumerate(tasks)}
    plan = PipelinePlan(schedule=schedule, intra_iter_deps=[(tasks[k], tasks[k - 1]) for k in range(1, depth)])
    return swtr.PlannedTrainPipeline(plan, None, CPU, **kwargs)


def drain(pipe: Any, it: Any) -> List[Any]:
    outputs = []
    while True:
        try:
            outputs.append(pipe.progress(it))
        except StopIteration:
            return outputs


@pytest.mark.parametrize("lockstep,prep_thread", [(True, False), (False, False), (True, True), (False, True)])
def test_execute_all_batches_false_keeps_its_batches_for_the_next_iterator(lockstep: bool, prep_thread: bool) -> None:
    import threading

    pipe = toy(3, prep_thread, lockstep=lockstep, execute_all_batches=False)
    assert drain(pipe, iter(range(7))) == [0, 1, 2, 3, 4]  # step k needs batch k + 2
    assert drain(pipe, iter([])) == []  # an empty iterator: still held
    assert drain(pipe, iter(range(10, 15))) == [5, 6, 10, 11, 12]
    if prep_thread:  # held batches keep the pipeline's threads until reset()
        assert any(t.name == "swp-prep" for t in threading.enumerate())
    pipe.reset()  # drops 13 and 14
    assert drain(pipe, iter(range(20, 22))) == []  # too few to fill: drawn ahead and held, nothing runs
    assert drain(pipe, iter(range(30, 34))) == [20, 21, 30, 31]
    pipe.reset()
    assert not any(t.name.startswith("swp-") for t in threading.enumerate())


def test_a_held_pipeline_does_not_ask_an_exhausted_iterator_again() -> None:
    calls = []

    def source() -> Any:
        for k in range(4):
            calls.append(k)
            yield k
        calls.append("end")

    pipe = toy(3, execute_all_batches=False)
    it = source()
    assert drain(pipe, it) == [0, 1]
    for _ in range(2):
        with pytest.raises(StopIteration):
            pipe.progress(it)
    assert calls == [0, 1, 2, 3, "end"]
    pipe.reset()
