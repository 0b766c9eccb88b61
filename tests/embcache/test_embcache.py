"""swpipeline.embcache: training through a device cache equals training the whole table, bit for bit.

The reference is the same model with an ordinary ``nn.EmbeddingBag`` (same initial
rows) stepped by ``torch.optim.SGD`` / ``torch.optim.Adagrad`` on the whole table,
trained one batch at a time. Every comparison is exact (``torch.equal``).
"""

from __future__ import annotations

import threading
from copy import deepcopy
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F

from swpipeline import SimulatedDevice, SWPipeline
from swpipeline.embcache import EmbCacheTrainPipeline, HostEmbeddingBag, SwapPlan, format_trace
from swpipeline.embcache.directory import CacheDirectory
from swpipeline.embcache.optim import RowOptimizer, torch_defaults_to_foreach

N, D, LR_EMB, LR_DENSE = 600, 8, 0.05, 0.1
Batch = Dict[str, torch.Tensor]


def make_batches(num: int, dist: str, *, bags: int = 12, max_len: int = 6, seed: int = 0,
                 num_embeddings: int = N) -> List[Batch]:
    """Bags of 1..max_len ids, Zipf-like (``dist="zipf"``, most ids near 0) or uniform over the table."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        lengths = torch.randint(1, max_len + 1, (bags,), generator=gen)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
        count = int(lengths.sum())
        if dist == "zipf":
            ids = (torch.rand(count, generator=gen) ** 4 * num_embeddings).long()
        else:
            ids = torch.randint(0, num_embeddings, (count,), generator=gen)
        out.append({"ids": ids, "offsets": offsets, "label": torch.randint(0, 2, (bags,), generator=gen).float()})
    return out


def ids_of(batch: Batch) -> Dict[str, Tuple[torch.Tensor, torch.Tensor]]:
    return {"emb": (batch["ids"], batch["offsets"])}


def pair_working_set(batches: List[Batch]) -> int:
    """The smallest cache that holds every two consecutive batches' distinct ids."""
    sets = [set(b["ids"].tolist()) for b in batches]
    return max(len(a | b) for a, b in zip([set()] + sets, sets))


class Model(torch.nn.Module):
    def __init__(self, emb: torch.nn.Module) -> None:
        super().__init__()
        self.emb = emb
        self.top = torch.nn.Linear(D, 1)

    def forward(self, batch: Batch) -> Tuple[torch.Tensor, torch.Tensor]:
        logits = self.top(self.emb(batch["ids"], batch["offsets"])).squeeze(1)
        return F.binary_cross_entropy_with_logits(logits, batch["label"]), logits


class Reference:
    """The same model with the whole table as an nn.EmbeddingBag, trained one batch at a time."""

    def __init__(self, optimizer: str, mode: str = "sum", num_embeddings: int = N) -> None:
        torch.manual_seed(1)
        self.model = Model(torch.nn.EmbeddingBag(num_embeddings, D, mode=mode))
        table_opt = torch.optim.SGD if optimizer == "sgd" else torch.optim.Adagrad
        self.sparse = table_opt(self.model.emb.parameters(), lr=LR_EMB)
        self.dense = torch.optim.SGD(self.model.top.parameters(), lr=LR_DENSE)

    def step(self, batch: Batch) -> torch.Tensor:
        self.sparse.zero_grad()
        self.dense.zero_grad()
        loss, logits = self.model(batch)
        loss.backward()
        self.dense.step()
        self.sparse.step()
        return logits.detach()

    @property
    def weight(self) -> torch.Tensor:
        return self.model.emb.weight.detach()

    def adagrad_sum(self) -> torch.Tensor:
        return self.sparse.state[self.model.emb.weight]["sum"]


def cached_model(cache_rows: int, optimizer: str, mode: str = "sum", num_embeddings: int = N) -> Model:
    """The model with a HostEmbeddingBag; same seed, hence the same rows and dense weights as Reference."""
    torch.manual_seed(1)
    return Model(HostEmbeddingBag(num_embeddings, D, cache_rows=cache_rows, mode=mode, optimizer=optimizer,
                                  lr=LR_EMB))


def pipeline(model: Model, **options: Any) -> EmbCacheTrainPipeline:
    return EmbCacheTrainPipeline(model, torch.optim.SGD(model.top.parameters(), lr=LR_DENSE), "cpu", ids_of=ids_of,
                                 **options)


def emb(model: Model) -> HostEmbeddingBag:
    table = model.emb
    assert isinstance(table, HostEmbeddingBag)
    return table


# -- the update rule --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
@pytest.mark.parametrize("foreach", [None, False, True])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("dim", [7, 16, 33])
def test_row_update_equals_torch_optim_on_the_whole_table(optimizer: str, dim: int, foreach: Optional[bool],
                                                          device: str) -> None:
    # foreach=None: torch's default path on the device (single-tensor on the CPU, multi-tensor on a GPU,
    # where Adagrad's two paths round differently); True / False: that path explicitly.
    gen = torch.Generator().manual_seed(dim)
    table = torch.nn.Parameter(torch.randn(300, dim, generator=gen).to(device))
    reference = (torch.optim.SGD if optimizer == "sgd" else torch.optim.Adagrad)([table], lr=0.3, foreach=foreach)
    rows, state = table.detach().clone(), torch.zeros(300, dim, device=device)
    rule = RowOptimizer(optimizer, 0.3, foreach=foreach)
    for _ in range(5):
        used = torch.unique(torch.randint(0, 300, (40,), generator=gen)).to(device)
        grad = torch.zeros(300, dim, device=device)
        grad[used] = torch.randn(used.numel(), dim, generator=gen).to(device)
        table.grad = grad
        reference.step()
        part, part_state = rows[used], state[used]
        rule.update(part, grad[used], part_state if rule.has_state else None)
        rows[used], state[used] = part, part_state
        assert torch.equal(rows, table.detach())
    if optimizer == "adagrad":
        assert torch.equal(state, reference.state[table]["sum"])


def test_each_device_takes_torchs_default_path() -> None:
    # On the CPU both of Adagrad's roundings agree (its addcdiv multiplies first); on a GPU they differ,
    # and the rows must follow the multi-tensor path torch.optim takes there by default.
    assert [torch_defaults_to_foreach(torch.device(d)) for d in ("cpu", "cuda", "meta")] == [False, True, False]


def test_initial_rows_are_those_of_nn_embeddingbag() -> None:
    torch.manual_seed(3)
    expected = torch.nn.EmbeddingBag(50, 4).weight.detach()
    torch.manual_seed(3)
    assert torch.equal(HostEmbeddingBag(50, 4, cache_rows=10, lr=0.1).full_weight(), expected)


# -- training equals the whole table ------------------------------------------------------------------


@pytest.mark.parametrize("dist", ["zipf", "uniform"])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("cache", ["all", "half", "tight"])
def test_training_equals_the_whole_table_step_for_step(cache: str, optimizer: str, dist: str) -> None:
    batches = make_batches(12, dist)
    tight = pair_working_set(batches)
    cache_rows = {"all": N, "half": max(tight, N // 2), "tight": tight}[cache]
    ref, model = Reference(optimizer), cached_model(cache_rows, optimizer)
    pipe = pipeline(model)
    it = iter(batches)
    for batch in batches:
        expected = ref.step(batch)
        assert torch.equal(pipe.progress(it), expected)
        assert torch.equal(emb(model).full_weight(), ref.weight)
        assert torch.equal(model.top.weight, ref.model.top.weight)
        if optimizer == "adagrad":
            assert torch.equal(emb(model).full_optimizer_state(), ref.adagrad_sum())
    with pytest.raises(StopIteration):
        pipe.progress(it)
    table = pipe.stats().table("emb")
    distinct = [len(set(b["ids"].tolist())) for b in batches]
    assert table.batches == 12 and table.unique == sum(distinct)
    if cache == "all":
        assert sum(table.swapped_out) == 0
    if cache == "tight" and dist == "uniform":  # every batch swaps most of its ids in
        assert all(loaded > 0.7 * n for loaded, n in zip(table.swapped_in, distinct))


@pytest.mark.parametrize("mode", ["mean", "max"])
def test_other_pooling_modes_equal_the_whole_table(mode: str) -> None:
    batches = make_batches(6, "zipf", seed=5)
    ref, model = Reference("adagrad", mode), cached_model(pair_working_set(batches), "adagrad", mode)
    outputs = pipeline(model).run(batches)
    for batch, output in zip(batches, outputs):
        assert torch.equal(output, ref.step(batch))
    assert torch.equal(emb(model).full_weight(), ref.weight)


def trains_like_the_whole_table(pipe: EmbCacheTrainPipeline, batches: List[Batch], model: Any,
                                ref: Any, ref_opt: torch.optim.Optimizer) -> None:
    """Every output of the pipelined run, and the final table, equal the whole-table model's, step by step."""
    for batch, output in zip(batches, pipe.run(batches)):
        ref_opt.zero_grad()
        loss, logits = ref(batch)
        loss.backward()
        ref_opt.step()
        assert torch.equal(output, logits.detach())
    assert torch.equal(emb(model).full_weight(), ref.emb.weight.detach())


def test_fixed_size_bags_as_a_2d_input() -> None:
    class Fixed(Model):
        def forward(self, batch: Batch) -> Tuple[torch.Tensor, torch.Tensor]:
            logits = self.top(self.emb(batch["ids"].view(-1, 3))).squeeze(1)
            return F.binary_cross_entropy_with_logits(logits, batch["label"]), logits

    gen = torch.Generator().manual_seed(12)
    batches = [{"ids": torch.randint(0, N, (30,), generator=gen), "label": torch.rand(10, generator=gen).round()}
               for _ in range(5)]
    torch.manual_seed(1)
    ref = Fixed(torch.nn.EmbeddingBag(N, D, mode="sum"))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR_EMB)
    torch.manual_seed(1)
    model = Fixed(HostEmbeddingBag(N, D, cache_rows=70, lr=LR_EMB))
    pipe = EmbCacheTrainPipeline(model, torch.optim.SGD(model.top.parameters(), lr=LR_EMB), "cpu",
                                 ids_of=lambda b: {"emb": (b["ids"].view(-1, 3), None)})
    trains_like_the_whole_table(pipe, batches, model, ref, ref_opt)


def test_per_sample_weights_equal_the_whole_table() -> None:
    class Weighted(Model):
        def forward(self, batch: Batch) -> Tuple[torch.Tensor, torch.Tensor]:
            pooled = self.emb(batch["ids"], batch["offsets"], per_sample_weights=batch["weights"])
            logits = self.top(pooled).squeeze(1)
            return F.binary_cross_entropy_with_logits(logits, batch["label"]), logits

    batches = make_batches(5, "zipf", seed=13)
    for batch in batches:
        batch["weights"] = torch.rand(batch["ids"].numel())
    torch.manual_seed(1)
    ref = Weighted(torch.nn.EmbeddingBag(N, D, mode="sum"))
    ref_opt = torch.optim.Adagrad(ref.parameters(), lr=LR_EMB)
    torch.manual_seed(1)
    model = Weighted(HostEmbeddingBag(N, D, cache_rows=pair_working_set(batches), optimizer="adagrad", lr=LR_EMB))
    pipe = EmbCacheTrainPipeline(model, torch.optim.Adagrad(model.top.parameters(), lr=LR_EMB), "cpu", ids_of=ids_of)
    trains_like_the_whole_table(pipe, batches, model, ref, ref_opt)


def test_the_public_names() -> None:
    import swpipeline.embcache as embcache

    assert sorted(embcache.__all__) == ["EmbCacheStats", "EmbCacheTrainPipeline", "HostEmbeddingBag", "StageTime",
                                        "SwapPlan", "TableStats", "format_trace"]


# -- one answer: serial, pipelined, both engines -------------------------------------------------------


ENGINES: Dict[str, Dict[str, Any]] = {
    "clocked-lockstep": {},
    "clocked-free-running": {"lockstep": False},
    "dataflow": {"engine": "dataflow"},
    "dataflow-2": {"engine": "dataflow", "max_depth": 2},
    "dataflow-deep": {"engine": "dataflow", "max_depth": 6},
}


def test_every_engine_equals_run_serial() -> None:
    batches = make_batches(14, "zipf", seed=2)
    cache_rows = pair_working_set(batches)
    serial_model = cached_model(cache_rows, "adagrad")
    serial = pipeline(serial_model)
    serial_outputs = serial.run_serial(batches)
    serial_stats = serial.stats().table("emb")
    ref = Reference("adagrad")
    assert all(torch.equal(out, ref.step(b)) for out, b in zip(serial_outputs, batches))
    for name, options in ENGINES.items():
        model = cached_model(cache_rows, "adagrad")
        pipe = pipeline(model, **options)
        outputs = pipe.run(batches)
        assert len(outputs) == len(batches), name
        assert all(torch.equal(a, b) for a, b in zip(outputs, serial_outputs)), name
        assert torch.equal(emb(model).full_weight(), emb(serial_model).full_weight()), name
        assert torch.equal(emb(model).full_optimizer_state(), emb(serial_model).full_optimizer_state()), name
        stats = pipe.stats()
        assert stats.mode == "pipelined" and stats.steps == len(batches)
        assert stats.table("emb") == serial_stats, name  # the same cache decisions, batch for batch


def test_a_reset_run_continues_exactly() -> None:
    """reset() drops the batches in flight; the tables forget their plans and training carries on exactly."""
    batches = make_batches(10, "zipf", seed=4)
    ref, model = Reference("adagrad"), cached_model(pair_working_set(batches), "adagrad")
    pipe = pipeline(model)
    it = iter(batches)
    for batch in batches[:4]:
        assert torch.equal(pipe.progress(it), ref.step(batch))
    pipe.reset()  # batches 4.. were swapped or planned, not trained
    for batch, output in zip(batches[4:], pipe.run(batches[4:])):
        assert torch.equal(output, ref.step(batch))
    assert torch.equal(emb(model).full_weight(), ref.weight)
    assert torch.equal(emb(model).full_optimizer_state(), ref.adagrad_sum())


def test_eval_mode_reads_without_updating() -> None:
    batches = make_batches(5, "uniform", seed=6)
    ref, model = Reference("sgd"), cached_model(pair_working_set(batches), "sgd")
    model.eval()
    before = emb(model).full_weight()
    outputs = pipeline(model).run(batches)
    ref.model.eval()
    with torch.no_grad():
        assert all(torch.equal(out, ref.model(b)[1]) for out, b in zip(outputs, batches))
    assert torch.equal(emb(model).full_weight(), before)


def test_forward_outside_a_pipeline_reads_the_current_rows() -> None:
    batches = make_batches(6, "zipf", seed=8)
    ref, model = Reference("sgd"), cached_model(N // 4, "sgd")
    pipeline(model).run(batches[:5])
    for batch in batches[:5]:
        ref.step(batch)
    with torch.no_grad():
        assert torch.equal(model(batches[5])[1], ref.model(batches[5])[1])
        two_d = torch.randint(0, N, (4, 3))
        assert torch.equal(emb(model)(two_d), ref.model.emb(two_d))


def test_state_dict_holds_the_whole_table() -> None:
    batches = make_batches(4, "zipf", seed=9)
    model = cached_model(pair_working_set(batches), "adagrad")
    pipeline(model).run(batches)
    state = model.state_dict()
    assert sorted(state) == ["emb.optimizer_sum", "emb.weight", "top.bias", "top.weight"]
    copy = cached_model(N, "adagrad")
    copy.load_state_dict(state)
    twin = deepcopy(model)
    for other in (copy, twin):
        assert torch.equal(emb(other).full_weight(), emb(model).full_weight())
        assert torch.equal(emb(other).full_optimizer_state(), emb(model).full_optimizer_state())


# -- the plan -------------------------------------------------------------------------------------------


SCHEDULE = """\
#  Task              Thread  Stream       | P0    P1    P2    P3    P4
-- ----------------- ------- ------------ + ----- ----- ----- ----- -----
0  ZeroGrad          default default      | --    --    --    i0    i1
1  Lookup            default default      | --    --    --    i0    i1
2  Forward           default default      | --    --    --    i0    i1
3  Backward          default default      | --    --    --    i0    i1
4  SparseUpdate      default default      | --    --    --    i0    i1
5  DenseStep         default default      | --    --    --    i0    i1
6  Swap              swap    swap         | --    --    i0    i1    i2
7  ComputeSwap       prep    swap_plan    | --    i0    i1    i2    i3
8  H2D               prep    memcpy       | i0    i1    i2    i3    i4"""


def test_the_plan_declares_the_rule_for_shared_rows() -> None:
    pipe = pipeline(cached_model(N, "sgd"))
    plan = pipe.plan
    # batch i+1 reads the rows it shares with batch i after its update
    assert plan.inter["Lookup"] == [("SparseUpdate", 1)]
    assert plan.inter["Swap"] == [("Lookup", 1)]  # batch i+1's swap moves only rows whose updates are done
    assert plan.intra["Lookup"] == ["Swap"]
    assert [plan.stage(t) for t in ("H2D", "ComputeSwap", "Swap", "Forward")] == [0, 1, 2, 3]
    assert pipe.format_schedule(5) == SCHEDULE


def test_on_a_gpu_the_swap_waits_for_the_lookup_only() -> None:
    """The device protocol (simulated): Swap(i+1) follows SparseUpdate(i-1), but not SparseUpdate(i)."""
    batches = make_batches(6, "zipf", seed=3)
    pipe = pipeline(cached_model(pair_working_set(batches), "sgd"))
    sim = SimulatedDevice()
    SWPipeline(pipe.plan, device=sim).run(batches)
    at = sim.launches()
    for i in range(1, len(batches) - 1):
        assert sim.happens_before(at[("SparseUpdate", i - 1)], at[("Swap", i + 1)])
        assert sim.happens_before(at[("Lookup", i)], at[("Swap", i + 1)])
        assert not sim.happens_before(at[("SparseUpdate", i)], at[("Swap", i + 1)])
        assert sim.happens_before(at[("Swap", i + 1)], at[("Lookup", i + 1)])
        assert sim.happens_before(at[("SparseUpdate", i)], at[("Lookup", i + 1)])


def test_the_swap_of_the_next_batch_overlaps_the_training_of_this_one() -> None:
    """Forward(i) waits until Swap(i+1) has started, and Swap(i+1) until Forward(i) has: they must overlap."""
    batches = make_batches(6, "zipf", seed=1)
    model = cached_model(pair_working_set(batches), "sgd")
    pipe = pipeline(model)
    rows = emb(model).rows
    swap_started = [threading.Event() for _ in batches]
    forward_started = [threading.Event() for _ in batches]
    original_swap, original_forward = rows.swap, model.top.forward
    seen: List[int] = []

    def swap(plan: SwapPlan) -> None:
        swap_started[plan.batch].set()
        if plan.batch >= 1:
            assert forward_started[plan.batch - 1].wait(10)
        original_swap(plan)

    def top(x: torch.Tensor) -> torch.Tensor:
        i = len(seen)
        seen.append(i)
        forward_started[i].set()
        if i + 1 < len(batches):
            assert swap_started[i + 1].wait(10)
        return original_forward(x)

    rows.swap = swap  # type: ignore[method-assign]
    model.top.forward = top  # type: ignore[method-assign]
    with pipe.tracing():
        pipe.run(batches)
    timeline = pipe.timeline
    assert timeline is not None
    for i in range(len(batches) - 1):
        (forward,), (next_swap,) = [[r for r in timeline.records if r.task == t and r.iteration == n]
                                    for t, n in (("Forward", i), ("Swap", i + 1))]
        assert next_swap.cpu_start < forward.cpu_end and forward.cpu_start < next_swap.cpu_end
        assert next_swap.period == forward.period and next_swap.thread_group != forward.thread_group
    picture = format_trace(timeline, 1, 2).splitlines()
    lanes = {line.split("|")[0].rsplit(None, 1)[0].strip(): line.split("|")[1] for line in picture[1:]}
    assert set(lanes["forward/backward/update"]) >= {"1", "2"}
    assert set(lanes["swap"]) >= {"2", "3"}  # the swaps of batches 2 and 3 under the training of 1 and 2


# -- the directory: pinning and eviction ------------------------------------------------------------------


def plan_of(directory: CacheDirectory, ids: List[int]) -> SwapPlan:
    unique = torch.tensor(sorted(set(ids)), dtype=torch.int64)
    return directory.plan(unique, len(ids))


def test_directory_pins_the_previous_batch_and_evicts_least_recently_used() -> None:
    directory = CacheDirectory("t", 30, 5)
    first = plan_of(directory, [3, 1, 3])  # cold: slots 0, 1
    assert first.slots.tolist() == [0, 1] and first.load_ids.tolist() == [1, 3] and first.num_evicted == 0
    second = plan_of(directory, [1, 7, 8])  # 1 hits; 7, 8 take the free slots 2, 3
    assert second.slots.tolist() == [0, 2, 3] and second.num_hits == 1
    third = plan_of(directory, [9, 10])  # slot 4 is free; then slot 1 (row 3, batch 0: least recent, unpinned)
    assert third.load_slots.tolist() == [4, 1]
    assert third.evict_ids.tolist() == [3] and third.evict_slots.tolist() == [1]
    fourth = plan_of(directory, [11])  # batch 1's rows (slots 0, 2, 3) are evictable now; slot 0 is the lowest
    assert fourth.evict_ids.tolist() == [1] and fourth.load_slots.tolist() == [0]
    assert not any(p.waits for p in (first, second, third, fourth))
    # Five new rows: batch 3's row 11 (slot 0) must go too, last and late (after batch 3 has trained).
    fifth = plan_of(directory, [12, 13, 14, 15, 16])
    assert fifth.load_slots.tolist() == [2, 3, 1, 4, 0] and fifth.evict_ids.tolist() == [7, 8, 10, 9, 11]
    assert fifth.num_late == 1 and fifth.waits
    with pytest.raises(ValueError, match=r"cache_rows=5 of table 't' is too small for this batch: it looks up 6 "
                                         r"distinct ids .* use cache_rows >= 6"):
        plan_of(directory, [20, 21, 22, 23, 24, 25])
    assert plan_of(directory, [12]).batch == 5  # the refused batch changed nothing


# -- misuse ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error, message", [
    ({"cache_rows": 0}, ValueError, "cache_rows must be >= 1, got 0"),
    ({"cache_rows": 11}, ValueError, "cache_rows=11 is larger than the table"),
    ({"cache_rows": 2.5}, TypeError, "cache_rows must be an int"),
    ({"optimizer": "adam"}, ValueError, "optimizer='adam' is unknown"),
    ({"mode": "median"}, ValueError, "mode='median' is unknown"),
    ({"lr": -1.0}, ValueError, "lr=-1.0 is invalid"),
    ({"lr": "fast"}, TypeError, "lr must be a number"),
])
def test_bad_table_arguments_are_refused(kwargs: Dict[str, Any], error: type, message: str) -> None:
    args: Dict[str, Any] = {"cache_rows": 4, "lr": 0.1, **kwargs}
    with pytest.raises(error, match=message):
        HostEmbeddingBag(10, 2, **args)


def test_ids_out_of_range_name_the_table_and_the_id() -> None:
    batches = make_batches(3, "zipf")
    batches[1]["ids"][0] = N + 5
    pipe = pipeline(cached_model(N, "sgd"))
    with pytest.raises(ValueError, match=rf"ids_of\(batch\)\['emb'\]: id {N + 5} is out of range"):
        pipe.run(batches)
    pipe.reset()


@pytest.mark.parametrize("bad_ids_of, error, message", [
    (lambda b: {"table": (b["ids"], b["offsets"])}, ValueError, r"returned tables \['table'\], but the model's"),
    (lambda b: [b["ids"]], TypeError, "must return a dict"),
    (lambda b: {"emb": (b["ids"].float(), b["offsets"])}, TypeError, "ids must be an int64 or int32 tensor"),
    (lambda b: {"emb": (b["ids"].flip(0), b["offsets"])}, ValueError, "called with other ids than ids_of"),
])
def test_ids_of_must_name_the_ids_the_model_uses(bad_ids_of: Callable[[Batch], Any], error: type,
                                                 message: str) -> None:
    model = cached_model(N, "sgd")
    pipe = EmbCacheTrainPipeline(model, None, "cpu", ids_of=bad_ids_of)
    batches = make_batches(2, "uniform")
    with pytest.raises(error, match=message):
        pipe.run(batches)
    pipe.reset()


@pytest.mark.parametrize("build, error, message", [
    (lambda m: EmbCacheTrainPipeline(torch.nn.Linear(2, 2), None, "cpu", ids_of=ids_of), ValueError,
     "has no HostEmbeddingBag"),
    (lambda m: EmbCacheTrainPipeline(m, None, "cpu", ids_of=ids_of, engine="async"), ValueError,
     "engine='async' is unknown"),
    (lambda m: EmbCacheTrainPipeline(m, object(), "cpu", ids_of=ids_of), TypeError, "dense_optimizer must be"),
    (lambda m: EmbCacheTrainPipeline(m, None, "cpu", ids_of="emb"), TypeError, "ids_of must be a function"),
])
def test_bad_pipeline_arguments_are_refused(build: Callable[[Model], Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        build(cached_model(N, "sgd"))


def test_rows_cannot_be_loaded_while_a_run_is_in_flight() -> None:
    batches = make_batches(4, "zipf")
    model = cached_model(N, "sgd")
    pipe = pipeline(model)
    it = iter(batches)
    pipe.progress(it)
    with pytest.raises(RuntimeError, match="while a pipeline run is in flight"):
        emb(model).load_weight(torch.zeros(N, D))
    pipe.reset()
    emb(model).load_weight(torch.ones(N, D))
    assert torch.equal(emb(model).full_weight(), torch.ones(N, D))
    with pytest.raises(ValueError, match=r"expected shape \[600, 8\], got \[3, 8\]"):
        emb(model).load_weight(torch.ones(3, D))
    with pytest.raises(RuntimeError, match="keeps no state"):
        emb(model).load_optimizer_state(torch.ones(N, D))


def test_a_table_called_twice_in_one_step_is_refused() -> None:
    class Twice(Model):
        def forward(self, batch: Batch) -> Tuple[torch.Tensor, torch.Tensor]:
            self.emb(batch["ids"], batch["offsets"])
            return super().forward(batch)

    torch.manual_seed(1)
    model = Twice(HostEmbeddingBag(N, D, cache_rows=N, lr=0.1))
    pipe = EmbCacheTrainPipeline(model, None, "cpu", ids_of=ids_of)
    with pytest.raises(ValueError, match="called twice in one training step"):
        pipe.run(make_batches(2, "zipf"))
    pipe.reset()


def test_stats_before_any_run_say_what_to_do() -> None:
    pipe = pipeline(cached_model(N, "sgd"))
    with pytest.raises(RuntimeError, match="no run yet"):
        pipe.stats()
    assert "EmbCacheTrainPipeline(engine=SWPipeline" in repr(pipe)
