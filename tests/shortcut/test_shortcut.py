"""Task shortcut: caching, replay, DeclaredIO, the gradient bridge, and both engines."""

from __future__ import annotations

import threading
from collections import namedtuple
from typing import Any, Dict, List

import pytest
import torch

from engine_helpers import ExecLog, sparse_dist_plan
from swpipeline import (DataFlowPipeline, DeclaredIO, IterContext, PipelinePlan, PipelineTask, SWPipeline,
                        TaskSchedule)
from swpipeline.engine.signals import Turns
from swpipeline.shortcut.snapshot import cache_val, restore_val


# Plans here put several thread groups on one stream on purpose (the turns are what is tested).
pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")

Pair = namedtuple("Pair", "left right")


class Jagged:
    """Stands in for TorchRec's KeyedJaggedTensor: an object holding tensors in attributes."""

    def __init__(self, values: torch.Tensor, lengths: torch.Tensor, keys: List[str]) -> None:
        self._values, self._lengths, self._keys = values, lengths, keys


class Slotted:
    __slots__ = ("weight", "name")

    def __init__(self, weight: torch.Tensor, name: str) -> None:
        self.weight, self.name = weight, name


def test_cache_and_restore_values_recursively() -> None:
    leaf = torch.randn(3, requires_grad=True)
    value = {"a": leaf * 2, "b": [torch.ones(2), (torch.zeros(1), "tag")], "p": Pair(torch.arange(3), 7),
             "j": Jagged(torch.arange(5.0), torch.tensor([2, 3]), ["f1", "f2"]), "s": Slotted(torch.ones(2), "w"),
             "n": None}
    cached = cache_val(value)
    first, second = restore_val(cached), restore_val(cached)
    assert torch.equal(first["a"], leaf.detach() * 2) and first["a"].requires_grad and first["a"].is_leaf
    assert first["a"] is not second["a"] and first["a"].data_ptr() == second["a"].data_ptr()
    assert first["a"].data_ptr() != value["a"].data_ptr()  # a clone: later changes to the original don't leak
    assert isinstance(first["b"][1], tuple) and first["b"][1][1] == "tag"
    assert isinstance(first["p"], Pair) and torch.equal(first["p"].left, torch.arange(3)) and first["p"].right == 7
    assert isinstance(first["j"], Jagged) and first["j"] is not value["j"]
    assert torch.equal(first["j"]._values, torch.arange(5.0)) and first["j"]._keys == ["f1", "f2"]
    assert isinstance(first["s"], Slotted) and torch.equal(first["s"].weight, torch.ones(2)) and first["s"].name == "w"
    assert first["n"] is None and not first["b"][0].requires_grad
    with pytest.raises(TypeError, match="expects a value produced by cache_val"):
        restore_val(("not", "cached"))


def counting_plan(calls: Dict[str, int], io_log: List[Any]) -> PipelinePlan:
    shared: Dict[str, Any] = {"counter": torch.zeros(1)}

    def load(ctx: IterContext) -> None:
        calls["Load"] += 1
        ctx.x = torch.full((2,), float(ctx.batch))
        ctx.scratch = 1

    def encode(ctx: IterContext) -> None:
        calls["Encode"] += 1
        ctx.code = ctx.x * 10  # cached: later iterations get iteration-0's code
        del ctx.scratch
        shared["counter"] += 1

    def use(ctx: IterContext) -> None:
        calls["Use"] += 1
        ctx.out = float(ctx.code.sum()) + float(shared["counter"].item()) * 1000
        assert not hasattr(ctx, "scratch")

    io = DeclaredIO(capture=lambda: {"counter": shared["counter"].clone()},
                    restore=lambda s: (io_log.append(float(s["counter"].item())), shared.update(s)))
    tasks = [PipelineTask("Load", load), PipelineTask("Encode", encode, io=[io]), PipelineTask("Use", use)]
    return PipelinePlan({tasks[0]: TaskSchedule(stage=0, thread_group="io"),
                         tasks[1]: TaskSchedule(stage=1, stream="enc"), tasks[2]: TaskSchedule(stage=1)},
                        intra_iter_deps=[(tasks[1], tasks[0]), (tasks[2], tasks[1])])


def test_serial_shortcut_caches_once_then_replays() -> None:
    calls = {"Load": 0, "Encode": 0, "Use": 0}
    io_log: List[Any] = []
    pipe = SWPipeline(counting_plan(calls, io_log), device="cpu")
    assert pipe.run_one_serial_iter(1).out == 20 + 1000
    pipe.enable_shortcut("Encode")
    assert pipe.run_one_serial_iter(2, 1).out == 40 + 2000  # caching run: Encode really runs
    third = pipe.run_one_serial_iter(3, 2)
    assert third.out == 40 + 2000  # replayed: iteration 1's code, and the counter restored to its capture
    assert calls == {"Load": 3, "Encode": 2, "Use": 3}
    assert io_log == [2.0]
    assert not hasattr(third, "scratch")
    pipe.disable_shortcut("Encode")
    assert pipe.run_one_serial_iter(3, 3).out == 60 + 3000
    assert calls["Encode"] == 3


@pytest.mark.parametrize("engine", ["clocked", "dataflow"])
def test_pipelined_shortcut_and_it_survives_drain(engine: str) -> None:
    calls = {"Load": 0, "Encode": 0, "Use": 0}
    io_log: List[Any] = []
    plan = counting_plan(calls, io_log)
    pipe: Any = SWPipeline(plan, device="cpu") if engine == "clocked" else DataFlowPipeline(plan, 3, device="cpu")
    pipe.enable_shortcut("Encode")
    outs: List[float] = []
    it = pipe.fill_pipeline(range(1, 7))
    with pytest.raises(RuntimeError, match=r"enable_shortcut\(\) while iterations are in flight"):
        pipe.enable_shortcut("Use")
    while True:
        try:
            pipe.progress(it)
        except StopIteration:
            break
        outs.append(pipe.last_context.out)
    assert outs == [20 + 1000] * 6 and calls["Encode"] == 1
    pipe.run(range(5, 8))
    assert calls["Encode"] == 1  # the cache outlived drain()
    assert pipe.shortcuts == ["Encode"]


def test_unknown_names_and_types() -> None:
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu")
    with pytest.raises(ValueError, match=r"enable_shortcut: unknown task 'Embed' \(known: \["):
        pipe.enable_shortcut("Forward", "Embed")
    assert pipe.shortcuts == []
    with pytest.raises(ValueError, match="disable_shortcut: unknown task 'x'"):
        pipe.disable_shortcut("x")
    with pytest.raises(TypeError, match="task names are strings"):
        pipe.enable_shortcut(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name at least one task"):
        pipe.enable_shortcut()


def test_skip_marks_in_schedule_analysis_repr_and_ranges() -> None:
    log = ExecLog()
    pipe = SWPipeline(sparse_dist_plan(log), device="cpu")
    pipe.enable_shortcut("InputDistStart")
    table = pipe.format_schedule(3)
    assert "5  InputDistStart [skip] dist    data_dist    | --    .     ." in table.splitlines()
    assert "InputDistStart [skip]" in pipe.format_stage_analysis()
    assert " skip" in [line for line in pipe.format_stage_analysis().splitlines() if "[skip]" in line][0]
    assert repr(pipe).startswith("SWPipeline(device=cpu, depth=3, tasks=[")
    assert "shortcuts=['InputDistStart']" in repr(pipe)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        pipe.run_serial(range(2))
    names = {e.name for e in prof.events()}
    assert {"SWP_serial/InputDistStart [skip]/iter0", "SWP_serial/Forward/iter1"} <= names


def test_globally_ordered_shortcut_keeps_its_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    issued: List[Any] = []
    lock = threading.Lock()

    def note(name: str) -> Any:
        def fn(ctx: IterContext) -> None:
            with lock:
                issued.append((name, ctx.iter_idx))
            ctx.__dict__[name] = torch.ones(1)
        return fn

    a2a, ar = PipelineTask("AllToAll", note("AllToAll")), PipelineTask("AllReduce", note("AllReduce"))
    plan = PipelinePlan({a2a: TaskSchedule(stage=0, stream="comm", thread_group="comm", globally_ordered=True),
                         ar: TaskSchedule(stage=1, thread_group="compute", globally_ordered=True)})
    pipe = SWPipeline(plan, device="cpu")
    pipe.enable_shortcut("AllToAll")
    seq_log: List[Any] = []
    original = Turns.run_in_turn

    def spy(self: Turns, key: Any, fn: Any, *args: Any) -> None:
        seq_log.append(key)
        original(self, key, fn, *args)

    monkeypatch.setattr(Turns, "run_in_turn", spy)
    pipe.run(range(10))
    assert sorted(seq_log) == sorted((k, i) for k in (0, 1) for i in range(10))  # every ordered unit took its turn
    assert issued[0] == ("AllToAll", 0) and [x for x in issued if x[0] == "AllToAll"] == [("AllToAll", 0)]


class Tower(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.bottom = torch.nn.Linear(4, 8)
        self.middle = torch.nn.Linear(8, 8)
        self.top = torch.nn.Linear(8, 1)


def tower_plan(model: Tower) -> PipelinePlan:
    def bottom(ctx: IterContext) -> None:
        ctx.h = torch.relu(model.bottom(ctx.batch))

    def middle(ctx: IterContext) -> None:
        ctx.z = torch.tanh(model.middle(ctx.h))

    def top(ctx: IterContext) -> None:
        ctx.loss = model.top(ctx.z).pow(2).mean()
        ctx.loss.backward()

    tasks = [PipelineTask(f.__name__, f) for f in (bottom, middle, top)]
    return PipelinePlan({t: TaskSchedule() for t in tasks},
                        intra_iter_deps=[(tasks[1], tasks[0]), (tasks[2], tasks[1])])


def grads(model: Tower) -> Dict[str, Any]:
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def test_gradient_bridge_through_a_shortcut_task() -> None:
    model = Tower()
    pipe = SWPipeline(tower_plan(model), device="cpu")
    x = torch.randn(5, 4)
    pipe.run_one_serial_iter(x)
    reference = grads(model)
    model.zero_grad(set_to_none=True)

    pipe.enable_shortcut("middle")
    pipe.run_one_serial_iter(x)  # caching run: a normal forward/backward
    model.zero_grad(set_to_none=True)
    for _ in range(3):  # replays: backward never runs through a freed graph
        model.zero_grad(set_to_none=True)
        pipe.run_one_serial_iter(x)
        replay = grads(model)
        for name in ("top.weight", "top.bias"):  # downstream: exactly the gradients of the cached values
            assert torch.equal(replay[name], reference[name])
        for name in ("bottom.weight", "bottom.bias"):  # upstream: reached, with zeros through the bridge
            assert replay[name] is not None and torch.count_nonzero(replay[name]) == 0
        assert replay["middle.weight"] is None and replay["middle.bias"] is None  # the skipped task's own


def test_shortcut_of_a_task_reading_nothing_differentiable_needs_no_bridge() -> None:
    model = Tower()
    pipe = SWPipeline(tower_plan(model), device="cpu")
    pipe.enable_shortcut("bottom")
    x = torch.randn(5, 4)
    pipe.run_one_serial_iter(x)
    model.zero_grad(set_to_none=True)
    ctx = pipe.run_one_serial_iter(x)
    assert ctx.h.is_leaf and ctx.h.requires_grad
    assert model.bottom.weight.grad is None and model.middle.weight.grad is not None


# -- a cache holds exactly what its task wrote, under any concurrency --------------------------------


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_caching_ignores_what_another_thread_group_writes_meanwhile(engine: str) -> None:
    # Shortcut (group g1) and Writer (group g2) run in the same iteration with no dependency between
    # them. While Shortcut caches (iteration 0), Writer sets ctx.y; a cache that took every changed
    # attribute would replay that stale y over Writer's fresh one. Gate (before Shortcut on g1) makes
    # every later replay come after Writer, so such a cache would show y == 0 in every iteration.
    import collections

    written: Dict[int, threading.Event] = collections.defaultdict(threading.Event)
    seen: List[Any] = []

    def gate(ctx: IterContext) -> None:
        if ctx.iter_idx > 0:
            assert written[ctx.iter_idx].wait(5)

    caching = threading.Event()

    def shortcut(ctx: IterContext) -> None:
        caching.set()
        assert written[0].wait(5)  # Writer has written ctx.y while this task is caching
        ctx.x = torch.tensor([float(ctx.iter_idx)])

    def writer(ctx: IterContext) -> None:
        if ctx.iter_idx == 0:
            assert caching.wait(5)
        ctx.y = ctx.iter_idx
        written[ctx.iter_idx].set()

    def consume(ctx: IterContext) -> None:
        seen.append((ctx.iter_idx, ctx.y, float(ctx.x)))

    g, s = PipelineTask("Gate", gate), PipelineTask("Shortcut", shortcut)
    w, c = PipelineTask("Writer", writer), PipelineTask("Consume", consume)
    plan = PipelinePlan({g: TaskSchedule(thread_group="g1", stream="s1"),
                         s: TaskSchedule(thread_group="g1", stream="s1"),
                         w: TaskSchedule(thread_group="g2", stream="s2"),
                         c: TaskSchedule(thread_group="g3", stream="s3")},
                        intra_iter_deps=[(s, g), (c, s), (c, w)])
    # (max_depth=1: the manual Gate must not hold iteration i+1's Gate ahead of iteration i's Shortcut)
    pipe = SWPipeline(plan, device="cpu") if engine == "SWPipeline" else DataFlowPipeline(plan, max_depth=1,
                                                                                          device="cpu")
    pipe.enable_shortcut("Shortcut")
    pipe.run(range(6))
    assert seen == [(i, i, 0.0) for i in range(6)]  # y is always Writer's; x is the cached 0.0


class Box:
    def __init__(self, value: int) -> None:
        self.value = value


def test_a_replaced_attribute_is_cached_even_when_the_new_object_reuses_the_old_address() -> None:
    def make(ctx: IterContext) -> None:
        ctx.a = Box(100 + ctx.iter_idx)

    def replace(ctx: IterContext) -> None:
        target = id(ctx.a)
        del ctx.a  # the only reference: its memory is free again
        spare = []
        for _ in range(10000):  # allocate until CPython hands the same address back
            box = Box(-ctx.iter_idx)
            if id(box) == target:
                break
            spare.append(box)
        ctx.a = box

    seen: List[int] = []
    m, r = PipelineTask("Make", make), PipelineTask("Replace", replace)
    c = PipelineTask("Use", lambda ctx: seen.append(ctx.a.value))
    pipe = SWPipeline(PipelinePlan({m: TaskSchedule(), r: TaskSchedule(), c: TaskSchedule()},
                                   intra_iter_deps=[(r, m), (c, r)]), device="cpu")
    pipe.enable_shortcut("Replace")
    pipe.run_serial(range(4))
    assert seen == [0, 0, 0, 0]  # the cached replacement every time, never Make's fresh Box


def test_caching_is_invisible_to_the_other_tasks_on_the_same_context() -> None:
    # While A caches (iteration 0), Other runs on the same context on another thread: it must see the
    # context as it is, not a read-tracking stand-in (the context's class used to be swapped in place).
    a_caching, other_done = threading.Event(), threading.Event()
    classes: List[type] = []

    def a(ctx: IterContext) -> None:
        a_caching.set()
        if ctx.iter_idx == 0:
            assert other_done.wait(5)
        ctx.a = ctx.iter_idx

    def other(ctx: IterContext) -> None:
        if ctx.iter_idx == 0:
            assert a_caching.wait(5)
        classes.append(type(ctx))
        other_done.set()

    ta, to = PipelineTask("A", a), PipelineTask("Other", other)
    plan = PipelinePlan({ta: TaskSchedule(thread_group="g1", stream="s1"),
                         to: TaskSchedule(thread_group="g2", stream="s2")})
    pipe = SWPipeline(plan, device="cpu")
    pipe.enable_shortcut("A")
    pipe.run(range(3))
    assert classes == [IterContext] * 3


def test_values_a_replay_cannot_reproduce_are_refused_when_cached() -> None:
    def gen(ctx: IterContext) -> None:
        ctx.stream = (k for k in range(3))

    pipe = SWPipeline(PipelinePlan({PipelineTask("Gen", gen): TaskSchedule()}), device="cpu")
    pipe.enable_shortcut("Gen")
    with pytest.raises(TypeError, match="task 'Gen' set ctx.stream to a generator, which a shortcut cannot replay"):
        pipe.run_one_serial_iter(0)

    def cyclic(ctx: IterContext) -> None:
        loop: List[Any] = [1]
        loop.append(loop)
        ctx.loop = loop

    pipe = SWPipeline(PipelinePlan({PipelineTask("Cyclic", cyclic): TaskSchedule()}), device="cpu")
    pipe.enable_shortcut("Cyclic")
    with pytest.raises(ValueError, match="task 'Cyclic' set ctx.loop to a value that contains itself"):
        pipe.run_one_serial_iter(0)


def test_replayed_containers_keep_their_type_factory_and_shared_parts() -> None:
    import collections

    shared = torch.ones(2)

    def fill(ctx: IterContext) -> None:
        counts: Dict[str, List[int]] = collections.defaultdict(list)
        counts["a"].append(1)
        ctx.counts = counts
        ctx.pair = [shared, shared]

    pipe = SWPipeline(PipelinePlan({PipelineTask("Fill", fill): TaskSchedule()}), device="cpu")
    pipe.enable_shortcut("Fill")
    pipe.run_one_serial_iter(0)
    ctx = pipe.run_one_serial_iter(1)  # replay
    assert isinstance(ctx.counts, collections.defaultdict) and ctx.counts["new"] == []
    assert ctx.counts["a"] == [1]
    assert ctx.pair[0] is ctx.pair[1]  # one tensor twice stays one tensor
