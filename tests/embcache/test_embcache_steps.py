"""swpipeline.embcache: the model holds exactly ``pipeline.steps`` steps, and a cache that fits one batch trains.

Two promises, on every engine (clocked in lockstep and free-running, data-flow at, below
and above the plan's depth):

* a batch trains only inside the ``progress()`` call that returns it, and a step is
  whole or absent: after ``reset()``, a failure or a Ctrl-C, the table, Adagrad's state
  and the dense weights are those of the whole-table reference trained on exactly
  ``pipeline.steps`` batches, and continuing from batch ``steps`` equals the
  uninterrupted reference, bit for bit;
* a cache that holds one batch but not two consecutive ones trains exactly like the
  whole table: the part of a swap that does not fit beside the previous batch waits for
  that batch's update (less overlap), and only a batch that cannot fit alone is
  refused, before anything of it runs.
"""

from __future__ import annotations

import _thread
import gc
import signal
import threading
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import torch

from swpipeline.embcache import EmbCacheTrainPipeline, SwapPlan
from test_embcache import (ENGINES, Batch, Model, Reference, cached_model, emb, make_batches, pair_working_set,
                           pipeline)

NO_RUN_AHEAD_S = 0.3  # how long a test gives a pipeline to (wrongly) train ahead while the caller is away


def single_working_set(batches: List[Batch]) -> int:
    """The smallest cache that holds each batch's distinct ids: the tightest one that can train."""
    return max(len(set(b["ids"].tolist())) for b in batches)


def same_as_reference(model: Model, ref: Reference, optimizer: str = "adagrad") -> None:
    assert torch.equal(emb(model).full_weight(), ref.weight)
    assert torch.equal(model.top.weight, ref.model.top.weight) and torch.equal(model.top.bias, ref.model.top.bias)
    if optimizer == "adagrad":
        assert torch.equal(emb(model).full_optimizer_state(), ref.adagrad_sum())


def resume_equals_reference(pipe: EmbCacheTrainPipeline, model: Model, ref: Reference, batches: List[Batch]) -> None:
    """Continue from batch ``pipe.steps`` and compare every output and the final state with the reference."""
    start = pipe.steps
    for batch, output in zip(batches[start:], pipe.run(batches[start:])):
        assert torch.equal(output, ref.step(batch))
    assert pipe.steps == len(batches)
    same_as_reference(model, ref)


class ForwardProbe:
    """Wraps the model's dense layer: counts the forwards and can act on a given one."""

    def __init__(self, model: Model, action: Optional[Callable[[int], None]] = None) -> None:
        self.calls = 0
        self.started: Dict[int, threading.Event] = {}
        self._action = action
        self._forward = model.top.forward
        model.top.forward = self  # type: ignore[method-assign]

    def event(self, call: int) -> threading.Event:
        return self.started.setdefault(call, threading.Event())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        call = self.calls
        self.calls += 1
        self.event(call).set()
        if self._action is not None:
            self._action(call)
        return self._forward(x)


# -- reset() leaves exactly the returned batches trained -------------------------------------------------


@pytest.mark.parametrize("engine", list(ENGINES))
def test_reset_leaves_exactly_the_returned_batches_trained(engine: str) -> None:
    batches = make_batches(10, "zipf", seed=4)
    ref, model = Reference("adagrad"), cached_model(pair_working_set(batches), "adagrad")
    probe = ForwardProbe(model)
    pipe = pipeline(model, **ENGINES[engine])
    it = iter(batches)
    for batch in batches[:4]:
        assert torch.equal(pipe.progress(it), ref.step(batch))
    # Between calls nothing trains: the next batch's forward does not start, however long the caller is away.
    assert not probe.event(4).wait(NO_RUN_AHEAD_S)
    same_as_reference(model, ref)
    pipe.reset()
    assert pipe.steps == 4 and probe.calls == 4
    same_as_reference(model, ref)
    resume_equals_reference(pipe, model, ref, batches)


# -- a failure or a Ctrl-C: the model holds exactly `steps` steps ----------------------------------------


class InterruptingData:
    """The batches, raising KeyboardInterrupt instead of yielding batch ``at``."""

    def __init__(self, batches: List[Batch], at: int) -> None:
        self.batches, self.at, self.next = batches, at, 0

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        if self.next == self.at:
            self.next += 1
            raise KeyboardInterrupt
        if self.next >= len(self.batches):
            raise StopIteration
        self.next += 1
        return self.batches[self.next - 1]


def interrupt_in_forward(model: Model, batch: int) -> None:
    def action(call: int) -> None:
        if call == batch:
            raise KeyboardInterrupt

    ForwardProbe(model, action)


def ctrl_c_after_the_table_write(model: Model, batch: int) -> None:
    """A Ctrl-C the moment batch ``batch``'s rows are written: it lands between its two updates.

    On the main thread (the training runs there) a real SIGINT; from a worker thread, which has
    SIGINT blocked, the same as it arriving in the main thread (``_thread.interrupt_main``).
    """
    rows = emb(model).rows
    original = rows.write
    writes = []

    def write(slots: torch.Tensor, values: torch.Tensor, state: Optional[torch.Tensor]) -> None:
        original(slots, values, state)
        writes.append(1)
        if len(writes) == batch + 1:
            if threading.current_thread() is threading.main_thread():
                signal.raise_signal(signal.SIGINT)
            else:
                _thread.interrupt_main(signal.SIGINT)

    rows.write = write  # type: ignore[method-assign]


@pytest.mark.parametrize("where", ["data", "forward", "after-the-table-write"])
@pytest.mark.parametrize("engine", list(ENGINES))
def test_after_a_ctrl_c_the_model_holds_exactly_steps_steps(engine: str, where: str) -> None:
    batches = make_batches(10, "zipf", seed=5)
    ref, model = Reference("adagrad"), cached_model(pair_working_set(batches), "adagrad")
    pipe = pipeline(model, **ENGINES[engine])
    data: Iterator[Batch] = iter(batches)
    if where == "data":
        data = InterruptingData(batches, 7)
    elif where == "forward":
        interrupt_in_forward(model, 4)
    else:
        ctrl_c_after_the_table_write(model, 4)
    returned = 0
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            while True:
                pipe.progress(data)
                returned += 1
    finally:
        signal.signal(signal.SIGINT, previous)
    expected = {"data": None, "forward": 4, "after-the-table-write": 5}[where]
    if expected is not None:
        assert pipe.steps == expected  # the step whose tables were written is completed, not lost or halved
    assert returned <= pipe.steps <= returned + 1
    for batch in batches[:pipe.steps]:
        ref.step(batch)
    same_as_reference(model, ref)  # before reset(): the failed step already left the model whole
    pipe.reset()
    same_as_reference(model, ref)
    resume_equals_reference(pipe, model, ref, batches)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_failure_on_another_thread_between_a_steps_two_updates_leaves_the_step_whole(engine: str) -> None:
    """The swap plan of a later batch fails on the prep thread just after batch 3's tables were updated, before its
    dense step: the run stops there, and batch 3's step is completed (its dense step run once), not left half done."""
    batches = make_batches(10, "zipf", seed=6)
    ref, model = Reference("adagrad"), cached_model(pair_working_set(batches), "adagrad")
    written = threading.Event()
    calls: List[int] = []
    failing = 4 if engine == "dataflow-2" else 5  # a batch whose swap plan is handed out before batch 3 trains

    def ids_of(batch: Batch) -> Dict[str, Tuple[torch.Tensor, torch.Tensor]]:
        calls.append(1)
        if len(calls) == failing + 1:
            assert written.wait(10)
            raise ValueError("no ids today")
        return {"emb": (batch["ids"], batch["offsets"])}

    rows = emb(model).rows
    original_write = rows.write
    writes: List[int] = []

    def write(slots: torch.Tensor, values: torch.Tensor, state: Optional[torch.Tensor]) -> None:
        original_write(slots, values, state)
        writes.append(1)
        if len(writes) == 4:  # batch 3's tables: let the plan fail, and wait until the run knows
            prep = [t for t in threading.enumerate() if t.name == "swp-prep"]
            written.set()
            for thread in prep:
                thread.join(10)  # a worker ends right after reporting its failure
            assert not any(t.is_alive() for t in prep)

    rows.write = write  # type: ignore[method-assign]
    pipe = EmbCacheTrainPipeline(model, torch.optim.SGD(model.top.parameters(), lr=0.1), "cpu", ids_of=ids_of,
                                 **ENGINES[engine])
    with pytest.raises(ValueError, match="no ids today"):
        pipe.run(batches)
    assert pipe.steps == 4
    for batch in batches[:4]:
        ref.step(batch)
    same_as_reference(model, ref)
    pipe.reset()
    same_as_reference(model, ref)


# -- the gate of a data-flow engine below the plan's depth ------------------------------------------------


def gated_pipeline(batches: List[Batch]) -> Tuple[EmbCacheTrainPipeline, Model, Iterator[Batch]]:
    """A data-flow pipeline at max_depth 2 after one step, its next batch's training waiting at the gate."""
    model = cached_model(pair_working_set(batches), "adagrad")
    pipe = pipeline(model, engine="dataflow", max_depth=2)
    it = iter(batches)
    pipe.progress(it)
    gate = pipe.tasks.gate
    assert gate is not None
    for _ in range(2000):  # until the training thread reached the gate (bounded)
        if gate.waiting:
            break
        threading.Event().wait(0.005)
    assert gate.waiting == 1
    return pipe, model, it


def test_reset_releases_a_training_task_waiting_at_the_gate() -> None:
    batches = make_batches(6, "zipf", seed=7)
    pipe, model, _ = gated_pipeline(batches)
    pipe.reset()  # the join finds the training thread gone; conftest checks that no thread is left
    assert pipe.steps == 1
    ref = Reference("adagrad")
    ref.step(batches[0])
    same_as_reference(model, ref)


def test_a_pipeline_dropped_mid_run_ends_its_gated_thread() -> None:
    batches = make_batches(6, "zipf", seed=7)
    pipe, model, it = gated_pipeline(batches)
    threads = [t for t in threading.enumerate() if t.name.startswith("swp-")]
    del pipe, model, it
    gc.collect()
    for thread in threads:
        thread.join(10)
    assert not [t.name for t in threads if t.is_alive()]


# -- a cache that fits one batch but not two ----------------------------------------------------------------


@pytest.mark.parametrize("engine", ["clocked-lockstep", "clocked-free-running", "dataflow", "dataflow-2"])
@pytest.mark.parametrize("dist", ["zipf", "uniform"])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_a_cache_that_fits_one_batch_but_not_two_trains_exactly(optimizer: str, dist: str, engine: str) -> None:
    batches = make_batches(10, dist, seed=8)
    single, pair = single_working_set(batches), pair_working_set(batches)
    assert single < pair
    for cache_rows in sorted({single, single + 1, (single + pair) // 2, pair - 1, pair}):
        ref, model = Reference(optimizer), cached_model(cache_rows, optimizer)
        pipe = pipeline(model, **ENGINES[engine], signal_timeout=20.0, progress_timeout=20.0)
        it = iter(batches)
        for batch in batches:
            assert torch.equal(pipe.progress(it), ref.step(batch))
            same_as_reference(model, ref, optimizer)
        with pytest.raises(StopIteration):
            pipe.progress(it)
        stats = pipe.stats().table("emb")
        assert stats.pair_rows == pair
        assert (stats.waited > 0) == (cache_rows < pair), cache_rows
        if cache_rows < pair:
            assert f"cache_rows >= {pair} keeps every swap overlapped" in str(pipe.stats())


@pytest.mark.parametrize("engine", list(ENGINES))
def test_reset_in_a_cache_that_fits_one_batch_continues_exactly(engine: str) -> None:
    """reset() with late parts of swaps pending: the tables forget them and training carries on exactly."""
    batches = make_batches(10, "uniform", seed=13)
    ref, model = Reference("adagrad"), cached_model(single_working_set(batches), "adagrad")
    pipe = pipeline(model, **ENGINES[engine])
    it = iter(batches)
    for batch in batches[:5]:
        assert torch.equal(pipe.progress(it), ref.step(batch))
    pipe.reset()
    assert pipe.steps == 5
    same_as_reference(model, ref)
    resume_equals_reference(pipe, model, ref, batches)


def test_waiting_swaps_are_said_in_the_statistics_and_match_run_serial() -> None:
    batches = make_batches(10, "uniform", seed=9)
    cache_rows = single_working_set(batches)
    serial = pipeline(cached_model(cache_rows, "adagrad"))
    serial.run_serial(batches)
    expected = serial.stats().table("emb")
    assert expected.waited >= 8 and sum(expected.swapped_late) > 0
    for engine, options in ENGINES.items():
        pipe = pipeline(cached_model(cache_rows, "adagrad"), **options)
        pipe.run(batches)
        assert pipe.stats().table("emb") == expected, engine


@pytest.mark.parametrize("engine", list(ENGINES))
def test_the_late_part_of_a_swap_waits_for_the_previous_batchs_update_in_the_tightest_cache(engine: str) -> None:
    """Every batch's swap overlaps the previous batch's training (forced with events), and in a cache that holds
    just one batch the rows it cannot place meanwhile are moved only after that batch's update: no deadlock,
    the whole table's bits."""
    batches = make_batches(8, "uniform", seed=10)
    ref, model = Reference("adagrad"), cached_model(single_working_set(batches), "adagrad")
    rows = emb(model).rows
    order: List[Tuple[str, int]] = []
    swap_started = [threading.Event() for _ in batches]
    original_swap, original_finish, original_write = rows.swap, rows.finish_swap, rows.write
    updates: List[int] = []

    def swap(plan: SwapPlan) -> None:
        order.append(("swap", plan.batch))
        swap_started[plan.batch].set()
        if plan.batch >= 1:
            assert forwards.event(plan.batch - 1).wait(10)  # batch j-1 is training now
        original_swap(plan)

    def finish_swap(plan: SwapPlan) -> None:
        if plan.num_late:
            order.append(("late", plan.batch))
        original_finish(plan)

    def write(slots: torch.Tensor, values: torch.Tensor, state: Optional[torch.Tensor]) -> None:
        order.append(("update", len(updates)))
        updates.append(1)
        original_write(slots, values, state)

    def hold_forward(call: int) -> None:
        if call + 1 < len(batches):
            assert swap_started[call + 1].wait(10)  # batch j+1's swap has started while batch j trains

    forwards = ForwardProbe(model, hold_forward)
    rows.swap, rows.finish_swap, rows.write = swap, finish_swap, write  # type: ignore[method-assign]
    pipe = pipeline(model, **ENGINES[engine], signal_timeout=20.0, progress_timeout=20.0)
    for batch, output in zip(batches, pipe.run(batches)):
        assert torch.equal(output, ref.step(batch))
    same_as_reference(model, ref)
    late = [j for kind, j in order if kind == "late"]
    assert len(late) >= len(batches) - 2  # uniform ids in the tightest cache: nearly every batch waits
    for j in late:
        assert order.index(("update", j - 1)) < order.index(("late", j))
        assert order.index(("swap", j)) < order.index(("update", j - 1))  # the swap started under its training


def test_a_batch_that_cannot_fit_alone_is_refused_before_its_work_starts() -> None:
    batches = make_batches(8, "uniform", seed=11)
    cache_rows = single_working_set(batches[:3] + batches[4:])
    batches[3]["ids"] = torch.arange(cache_rows + 5) % 600  # batch 3: more distinct ids than the cache holds
    batches[3]["offsets"] = torch.arange(0, cache_rows + 5, (cache_rows + 5) // 12 + 1)
    batches[3]["label"] = torch.ones(batches[3]["offsets"].numel())
    ref, model = Reference("adagrad"), cached_model(cache_rows, "adagrad")
    pipe = pipeline(model)
    with pytest.raises(ValueError, match=rf"cache_rows={cache_rows} of table 'emb' is too small for this batch: it "
                                         rf"looks up {cache_rows + 5} distinct ids .* use cache_rows >= "
                                         rf"{cache_rows + 5}") as caught:
        pipe.run(batches)
    assert getattr(caught.value, "swp_task") == "ComputeSwap"
    assert emb(model).rows.batches_swapped <= 3  # nothing of batch 3 was swapped (nor trained)
    assert pipe.steps <= 3
    for batch in batches[:pipe.steps]:
        ref.step(batch)
    same_as_reference(model, ref)
    pipe.reset()


# -- offsets -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("offsets, message", [
    ([0, 3, 1, 5], r"offsets must not decrease .* offsets\[2\]=1 comes after offsets\[1\]=3 "
                   r"\(offsets\[0:4\] = \[0, 3, 1, 5\]\); give each bag's start in order"),
    ([2, 3, 5], r"offsets must start at 0 .* got offsets\[0\]=2"),
    ([0, 3, 50], r"offsets\[2\]=50 is past the end of the 8 ids"),
])
def test_bad_offsets_are_refused_before_the_batch_trains(offsets: List[int], message: str) -> None:
    batches = make_batches(5, "zipf", seed=12)
    batches[2] = {"ids": torch.arange(8), "offsets": torch.tensor(offsets), "label": torch.ones(len(offsets))}
    ref, model = Reference("sgd"), cached_model(pair_working_set(batches), "sgd")
    pipe = pipeline(model)
    with pytest.raises(ValueError, match=r"ids_of\(batch\)\['emb'\]: " + message) as caught:
        pipe.run(batches)
    assert getattr(caught.value, "swp_task") == "ComputeSwap"
    assert pipe.steps <= 2
    for batch in batches[:pipe.steps]:
        ref.step(batch)
    same_as_reference(model, ref, "sgd")
    pipe.reset()
    with pytest.raises(ValueError, match=r"emb.forward: " + message), torch.no_grad():
        model(batches[2])
