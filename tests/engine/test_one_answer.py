"""One plan, one answer: a plan's results depend neither on its task names nor on the engine that runs it.

The loop users write: ``prep`` on its own thread group and stream, then ``fwd``,
``bwd`` and ``step`` (an in-place SGD step) on one thread group and the default
stream, with ``fwd -> prep``, ``bwd -> fwd``, ``step -> bwd`` and no inter-iteration
dependency. On one stream the engine must run each period's older iterations first
(stage-descending), so that ``fwd(i+1)`` never runs between ``bwd(i)`` and ``step(i)``:
then every pipelined run computes exactly what ``run_serial`` computes, whatever the
tasks are called and whichever engine runs them.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Dict, List, Sequence, Tuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dist_harness import run_on_ranks
from engine_helpers import check_dependencies, output_plan, swp_threads, valid_plans
from swpipeline import (DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SimulatedDevice, SWPipeline,
                        TaskSchedule)


# Plans here put several thread groups on one stream on purpose (the turns are what is tested).
pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")

Stages = Tuple[int, int, int]  # fwd, bwd, step (prep is at stage 0)
ENGINES: Dict[str, Callable[[PipelinePlan], Any]] = {
    "SWPipeline": lambda plan: SWPipeline(plan, device="cpu"),
    "DataFlow-2": lambda plan: DataFlowPipeline(plan, max_depth=2, device="cpu"),
    "DataFlow-3": lambda plan: DataFlowPipeline(plan, max_depth=3, device="cpu"),
    "DataFlow-5": lambda plan: DataFlowPipeline(plan, max_depth=5, device="cpu"),
}


def batches(n: int = 16) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    return [(torch.randn(32, 8, generator=gen), torch.randn(32, 1, generator=gen)) for _ in range(n)]


def training(model: torch.nn.Module, stages: Stages, names: Sequence[str] = ("prep", "fwd", "bwd", "step"),
             fused_update: bool = False) -> Tuple[PipelinePlan, List[float]]:
    """The loop as a plan; ``fused_update`` makes bwd + step one task (named ``names[2]``)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses: List[float] = []

    def prep(ctx: IterContext) -> None:
        ctx.x, ctx.y = ctx.batch[0] * 2.0, ctx.batch[1]

    def fwd(ctx: IterContext) -> None:
        ctx.loss = torch.nn.functional.mse_loss(model(ctx.x), ctx.y)
        losses.append(ctx.loss.item())

    def bwd(ctx: IterContext) -> None:
        ctx.loss.backward()

    def step(ctx: IterContext) -> None:
        opt.step()
        opt.zero_grad()

    def update(ctx: IterContext) -> None:
        bwd(ctx)
        step(ctx)

    p, f = PipelineTask(names[0], prep), PipelineTask(names[1], fwd)
    schedule = {p: TaskSchedule(stage=0, thread_group="prep", stream="prep"), f: TaskSchedule(stage=stages[0])}
    intra = [(f, p)]
    if fused_update:
        u = PipelineTask(names[2], update)
        schedule[u] = TaskSchedule(stage=stages[1])
        intra.append((u, f))
    else:
        b, s = PipelineTask(names[2], bwd), PipelineTask(names[3], step)
        schedule[b], schedule[s] = TaskSchedule(stage=stages[1]), TaskSchedule(stage=stages[2])
        intra += [(b, f), (s, b)]
    return PipelinePlan(schedule, intra_iter_deps=intra), losses


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def serial_reference(stages: Stages, **kw: Any) -> Tuple[List[float], List[torch.Tensor]]:
    net = model()
    plan, losses = training(net, stages, **kw)
    SWPipeline(plan, device="cpu").run_serial(batches())
    return losses, [p.detach().clone() for p in net.parameters()]


def pipelined(engine: str, stages: Stages, **kw: Any) -> Tuple[List[float], List[torch.Tensor]]:
    net = model()
    plan, losses = training(net, stages, **kw)
    ENGINES[engine](plan).run(batches())
    return losses, [p.detach().clone() for p in net.parameters()]


def same(a: Tuple[List[float], List[torch.Tensor]], b: Tuple[List[float], List[torch.Tensor]]) -> bool:
    return a[0] == b[0] and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


@pytest.mark.parametrize("stages", [(1, 1, 1), (1, 2, 2)], ids=["1-1-1", "1-2-2"])
@pytest.mark.parametrize("engine", list(ENGINES))
def test_the_training_loop_gives_the_serial_answer_on_every_engine(engine: str, stages: Stages) -> None:
    assert same(pipelined(engine, stages), serial_reference(stages))
    assert swp_threads() == []


@pytest.mark.parametrize("name", ["update", "apply"])
@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_tasks_name_does_not_decide_the_answer(engine: str, name: str) -> None:
    # fwd at stage 1, one task doing backward + step at stage 2: it used to fail with autograd's
    # in-place error when named "update" and pass when named "apply".
    kw: Dict[str, Any] = dict(names=("prep", "fwd", name, "-"), fused_update=True)
    assert same(pipelined(engine, (1, 2, 2), **kw), serial_reference((1, 2, 2), **kw))


def test_a_compiled_model_on_a_worker_thread_group_gives_the_serial_answer() -> None:
    torch._dynamo.reset()
    compiled_net = model()
    compiled_net.forward = torch.compile(compiled_net.forward, backend="eager")  # type: ignore[method-assign]
    plan, losses = training(compiled_net, (1, 2, 2))
    # fwd/bwd/step on a worker thread: prep goes to the default group, training to "train"
    schedule = {t: TaskSchedule(stage=s.stage, thread_group="train" if t.name != "prep" else "default",
                                stream=s.stream) for t, s in zip(plan.tasks, plan.schedules.values())}
    plan = PipelinePlan(schedule, intra_iter_deps=plan.intra_iter_deps)
    SWPipeline(plan, device="cpu").run(batches())
    assert losses == serial_reference((1, 2, 2))[0]


# -- DistributedDataParallel on 2 gloo ranks --------------------------------------------------------------


def ddp_losses(rank: int, world_size: int, stages: Stages, engine: str) -> Dict[str, Any]:
    """Serial and pipelined losses of the loop with a DDP model (each rank its own shard of the batches)."""
    import torch.distributed as dist

    def run(how: str) -> List[float]:
        torch.manual_seed(0)
        net = torch.nn.parallel.DistributedDataParallel(model())
        plan, losses = training(net, stages)
        data = batches(12)[rank::world_size] * 2
        if how == "serial":
            SWPipeline(plan, device="cpu").run_serial(data)
        else:
            ENGINES[engine](plan).run(data)
        dist.barrier()
        return losses

    return {"serial": run("serial"), "pipelined": run("pipelined")}


@pytest.mark.parametrize("stages", [(1, 1, 1), (1, 2, 2)], ids=["1-1-1", "1-2-2"])
@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlow-3"])
def test_ddp_on_two_gloo_ranks_gives_the_serial_answer(engine: str, stages: Stages) -> None:
    for rank, result in enumerate(run_on_ranks(ddp_losses, world_size=2, timeout=180, stages=stages, engine=engine)):
        assert result["pipelined"] == result["serial"], f"rank {rank}"


# -- names never change what runs on a stream; both engines run the same sequences ----------------------


def stream_sequences(device: SimulatedDevice) -> Dict[str, List[Tuple[str, int]]]:
    return {stream: [(op[1], op[2]) for op in ops if op[0] == "launch"] for stream, ops in device.log.items()}


def renamed(shape: Dict[str, Any], mapping: Dict[str, str]) -> Dict[str, Any]:
    return {"spec": {mapping[n]: v for n, v in shape["spec"].items()},
            "intra": [(mapping[a], mapping[b]) for a, b in shape["intra"]],
            "inter": [(mapping[a], mapping[b], *back) for a, b, *back in shape["inter"]]}


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=valid_plans(), seed=st.integers(0, 2**32 - 1), iters=st.integers(1, 12))
def test_renaming_tasks_leaves_every_streams_sequence_the_same(shape: Dict[str, Any], seed: int, iters: int) -> None:
    names = list(shape["spec"])
    shuffled = names[:]
    random.Random(seed).shuffle(shuffled)
    mapping = {old: f"{new}_r" for old, new in zip(names, shuffled)}  # every name changes; sort order too
    back = {v: k for k, v in mapping.items()}
    sequences = []
    for variant in (shape, renamed(shape, mapping)):
        for engine in ("SWPipeline", "DataFlowPipeline"):
            plan = output_plan(variant)[0]
            device = SimulatedDevice()
            pipe = SWPipeline(plan, device=device) if engine == "SWPipeline" else DataFlowPipeline(
                plan, max_depth=plan.depth, device=device)
            pipe.run(range(iters))
            seqs = stream_sequences(device)
            if variant is not shape:
                seqs = {s: [(back[t], i) for t, i in units] for s, units in seqs.items()}
            sequences.append((engine, seqs))
    reference = sequences[0][1]
    for engine, seqs in sequences[1:]:
        assert seqs == reference, engine


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=valid_plans(), iters=st.integers(1, 16), extra_depth=st.integers(0, 3))
def test_each_thread_group_runs_the_same_units_in_the_same_order_on_both_engines(shape: Dict[str, Any], iters: int,
                                                                                extra_depth: int) -> None:
    per_group = []
    for engine in ("SWPipeline", "DataFlowPipeline"):
        plan, log, values = output_plan(shape)
        pipe = SWPipeline(plan, device="cpu") if engine == "SWPipeline" else DataFlowPipeline(
            plan, max_depth=plan.depth + extra_depth, device="cpu")
        pipe.run(range(iters))
        check_dependencies(log, plan, iters)
        group_of = {name: plan.schedules[name].thread_group for name in plan.task_names}
        threads = {group_of[t]: log.threads_of(t) for t in plan.task_names if log.threads_of(t)}
        assert all(len(th) == 1 for th in threads.values())  # each group's units on one thread
        starts = {group: [(t, i) for t, i in log.starts() if group_of[t] == group] for group in threads}
        per_group.append((starts, values))
    assert per_group[0] == per_group[1]


# -- the printed schedule is the order that runs ---------------------------------------------------------


def test_print_schedule_lists_each_streams_tasks_in_the_order_they_run() -> None:
    plan, _ = training(model(), (1, 2, 2))
    pipe = SWPipeline(plan, device="cpu")
    assert [t for t in pipe.enqueue_order if t != "prep"] == ["bwd", "step", "fwd"]  # the default stream's order
    # stages: prep 0 (its own thread and stream), fwd 1, bwd and step 2; period p runs stage s on iteration p - s
    assert pipe.format_schedule(4) == (
        "#  Task              Thread  Stream       | P0    P1    P2    P3\n"
        "-- ----------------- ------- ------------ + ----- ----- ----- -----\n"
        "0  bwd               default default      | --    --    i0    i1\n"
        "1  step              default default      | --    --    i0    i1\n"
        "2  fwd               default default      | --    i0    i1    i2\n"
        "3  prep              prep    prep         | i0    i1    i2    i3")
