"""State the engine shares between tasks without a name on the context: generators, values changed in place.

Two kinds of writes a plain attribute assignment does not show, each built from a plan
whose pipelined run silently differed from ``run_serial``:

* a draw from a random generator reads and advances it: nanoGPT's loop draws batch
  indices with ``torch.randint`` on a prep thread group and dropout masks on the training
  thread, both from ``torch.default_generator``;
* a value read from the context and changed in place (``ctx.x.mul_(2)``,
  ``ctx.batch["img"].div_(255)``, ``ctx.log.append(...)``) is a write of that attribute.

``analyze``, ``infer_deps`` and ``check_races=True`` (both engines, the caller's thread
group on and off) report each with the pair to add; the fixed plans, and the plan that
gives the prep task a generator of its own, run bitwise as ``run_serial``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
import torch

from engine_helpers import Fn, Spec, plan_of, schedule_of
from inplace_job import INPLACE_RACE, InPlace
from swpipeline import DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, RaceError, SWPipeline
from swpipeline import RaceChecker, analyze, infer_deps


ENGINES = ["SWPipeline", "DataFlowPipeline"]
CALLER = [("auto", "caller-runs-last-group"), (None, "every-group-on-a-worker")]


def engine(kind: str, plan: PipelinePlan, caller: Any = "auto", **kwargs: Any) -> Any:
    if kind == "SWPipeline":
        return SWPipeline(plan, device="cpu", caller_thread_group=caller, **kwargs)
    return DataFlowPipeline(plan, max_depth=plan.depth + 1, device="cpu", caller_thread_group=caller, **kwargs)


def names(pairs: Sequence[Tuple[PipelineTask, PipelineTask]]) -> List[Tuple[str, str]]:
    return [(t.name, d.name) for t, d in pairs]


def missing(plan: PipelinePlan, batch: Any) -> List[Tuple[str, str, str, str]]:
    return analyze(plan, batch).missing_deps


# -- values changed in place ------------------------------------------------------------------------------------


def test_an_in_place_write_is_a_write_for_infer_deps_and_analyze() -> None:
    job = InPlace()
    intra, inter = infer_deps(schedule_of(job.spec()), None)
    assert (names(intra), names(inter)) == ([("B", "A"), ("C", "B")], [])
    analysis = analyze(plan_of(job.spec(), intra=[("B", "A"), ("C", "A")]), None)
    assert analysis.writes == {"A": {"ctx.x"}, "B": {"ctx.x"}, "C": set()}
    assert [reason for *_, reason in analysis.missing_deps] == [
        "C reads `ctx.x`, which B changes in place; in a pipelined run C(i) may run before B(i): add (\"C\", \"B\") "
        "to intra_iter_deps"]


@pytest.mark.parametrize("caller", [c for c, _ in CALLER], ids=[i for _, i in CALLER])
@pytest.mark.parametrize("kind", ENGINES)
def test_check_races_catches_an_in_place_write_and_the_fixed_plan_runs_as_serial(kind: str, caller: Any) -> None:
    job = InPlace()
    with pytest.raises(RaceError) as info:
        engine(kind, plan_of(job.spec(), intra=[("B", "A"), ("C", "A")]), caller, check_races=True).run(range(4))
    assert str(info.value) == INPLACE_RACE
    assert (info.value.attribute, info.value.first, info.value.second) == ("ctx.x", ("B", 0), ("C", 0))
    fixed = InPlace()
    engine(kind, plan_of(fixed.spec(), intra=[("B", "A"), ("C", "B")]), caller, check_races=True).run(range(4))
    serial = InPlace()
    SWPipeline(plan_of(serial.spec(), intra=[("B", "A"), ("C", "B")]), device="cpu").run_serial(range(4))
    assert fixed.seen == serial.seen == [0, 6, 12, 18]


class BatchInPlace:
    """Prepare scales the batch's image in place on its own thread group; Sum reads the batch."""

    def __init__(self) -> None:
        self.sums: List[float] = []

    def prepare(self, ctx: IterContext) -> None:
        ctx.batch["img"].div_(255)

    def total(self, ctx: IterContext) -> None:
        self.sums.append(float(ctx.batch["img"].sum()))

    def spec(self) -> Spec:
        return {"Prepare": (0, "prep", "prep", self.prepare), "Sum": (1, None, "default", self.total)}


def images() -> List[Dict[str, torch.Tensor]]:
    return [{"img": torch.full((4,), 255.0 * k)} for k in range(4)]


@pytest.mark.parametrize("kind", ENGINES)
def test_a_batch_changed_in_place_is_a_write_of_ctx_batch(kind: str) -> None:
    job = BatchInPlace()
    intra, inter = infer_deps(schedule_of(job.spec()), images()[1])
    assert (names(intra), names(inter)) == ([("Sum", "Prepare")], [])
    assert [reason for *_, reason in missing(plan_of(job.spec()), images()[1])] == [
        "Sum reads `ctx.batch`, which Prepare changes in place; in a pipelined run Sum(i) may run before Prepare(i): "
        "add (\"Sum\", \"Prepare\") to intra_iter_deps"]
    with pytest.raises(RaceError, match="^race on ctx.batch: 'Sum' \\(iteration 0\\) reads ctx.batch, which "
                                        "'Prepare' \\(iteration 0\\) changes in place, and no declared dependency"):
        engine(kind, plan_of(job.spec()), check_races=True).run(images())
    fixed = BatchInPlace()
    engine(kind, plan_of(fixed.spec(), intra=[("Sum", "Prepare")]), check_races=True).run(images())
    assert fixed.sums == [0.0, 4.0, 8.0, 12.0]


def test_the_batch_is_left_out_of_the_report_while_no_task_changes_it() -> None:
    def read_batch(ctx: IterContext) -> None:
        ctx.x = ctx.batch["img"] * 2

    analysis = analyze(plan_of({"Prepare": (0, None, "default", read_batch)}), images()[1])
    assert analysis.reads == {"Prepare": set()} and analysis.writes == {"Prepare": {"ctx.x"}}


class Appends:
    """A puts a list on the context, B appends to it, C (another thread group) counts it."""

    def __init__(self) -> None:
        self.counts: List[int] = []

    def a(self, ctx: IterContext) -> None:
        ctx.log = ["a"]

    def b(self, ctx: IterContext) -> None:
        ctx.log.append("b")

    def c(self, ctx: IterContext) -> None:
        self.counts.append(len(ctx.log))

    def spec(self) -> Spec:
        return {"A": (0, "prep", "prep", self.a), "B": (1, None, "default", self.b), "C": (1, "side", "side", self.c)}


@pytest.mark.parametrize("kind", ENGINES)
def test_appending_to_a_list_on_the_context_is_a_write(kind: str) -> None:
    job = Appends()
    intra, _ = infer_deps(schedule_of(job.spec()), None)
    assert names(intra) == [("B", "A"), ("C", "B")]
    with pytest.raises(RaceError, match="^race on ctx.log: 'C' \\(iteration 0\\) reads ctx.log, which 'B' "
                                        "\\(iteration 0\\) changes in place"):
        engine(kind, plan_of(job.spec(), intra=[("B", "A"), ("C", "A")]), check_races=True).run(range(3))
    fixed = Appends()
    engine(kind, plan_of(fixed.spec(), intra=[("B", "A"), ("C", "B")]), check_races=True).run(range(3))
    assert fixed.counts == [2, 2, 2]


CHANGES: Dict[str, Tuple[Callable[[], Any], Callable[[Any], None]]] = {
    # what a task finds on the context, and how it changes it without an assignment
    "tensor through a view": (lambda: torch.zeros(4), lambda v: v[1:3].add_(1)),
    "tensor in a dict in a list": (lambda: [{"w": torch.zeros(2)}], lambda v: v[0]["w"].mul_(3)),
    "dict item replaced": (lambda: {"k": 1}, lambda v: v.update(k=2)),
    "key added to a nested dict": (lambda: ({"inner": {}},), lambda v: v[0]["inner"].setdefault("new", 0)),
    "set grown": (lambda: {1}, lambda v: v.add(2)),
    "list item removed": (lambda: [1, 2], lambda v: v.pop()),
    "tensor resized": (lambda: torch.zeros(2), lambda v: v.resize_(3)),
}
CHANGES_THROUGH_VARS: Dict[str, Callable[[IterContext], None]] = {  # the value reached through vars(ctx)
    "vars(ctx)[name]": lambda ctx: vars(ctx)["v"].mul_(2),
    "vars(ctx).get(name)": lambda ctx: vars(ctx).get("v").add_(1),
    "vars(ctx).values()": lambda ctx: [v.neg_() for v in vars(ctx).values()],
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_every_kind_of_change_in_place_is_seen_by_analyze_and_the_checker(change: str) -> None:
    make, modify = CHANGES[change]

    def put(ctx: IterContext) -> None:
        ctx.v = make()

    def touch(ctx: IterContext) -> None:
        modify(ctx.v)

    spec: Spec = {"Put": (0, None, "default", put), "Change": (0, None, "default", touch),
                  "Look": (0, "side", "side", lambda ctx: ctx.v)}  # serially: Put, Change, Look
    analysis = analyze(plan_of(spec, intra=[("Change", "Put"), ("Look", "Put")]), None)
    assert analysis.writes["Change"] == {"ctx.v"}
    assert [(t, d) for t, d, *_ in analysis.missing_deps] == [("Look", "Change")]
    with pytest.raises(RaceError, match="^race on ctx.v: 'Look' \\(iteration 0\\) reads ctx.v, which 'Change'"):
        SWPipeline(plan_of(spec, intra=[("Change", "Put"), ("Look", "Put")]), device="cpu",
                   check_races=True).run_serial(range(1))


@pytest.mark.parametrize("change", list(CHANGES_THROUGH_VARS))
def test_a_value_reached_through_vars_and_changed_in_place_is_a_write(change: str) -> None:
    def put(ctx: IterContext) -> None:
        ctx.v = torch.ones(2)

    spec: Spec = {"Put": (0, None, "default", put), "Change": (0, None, "default", CHANGES_THROUGH_VARS[change]),
                  "Look": (0, "side", "side", lambda ctx: ctx.v)}
    plan = plan_of(spec, intra=[("Change", "Put"), ("Look", "Put")])
    assert [(t, d) for t, d, *_ in analyze(plan, None).missing_deps] == [("Look", "Change")]
    with pytest.raises(RaceError, match="^race on ctx.v: 'Look' \\(iteration 0\\) reads ctx.v, which 'Change'"):
        SWPipeline(plan, device="cpu", check_races=True).run_serial(range(1))


def test_reading_without_changing_is_no_write() -> None:
    def put(ctx: IterContext) -> None:
        ctx.v = [torch.zeros(2), {"k": (1, [2])}]

    def look(ctx: IterContext) -> None:
        ctx.total = float(ctx.v[0].sum()) + len(ctx.v[1]["k"][1])

    analysis = analyze(plan_of({"Put": (0, None, "default", put), "Look": (0, None, "default", look)},
                               intra=[("Look", "Put")]), None)
    assert analysis.writes == {"Put": {"ctx.v"}, "Look": {"ctx.total"}}


# -- random generators --------------------------------------------------------------------------------------------


class TinyGPT:
    """nanoGPT's loop in miniature: get_batch draws indices with torch.randint, forward runs Dropout."""

    def __init__(self, own_generator: bool = False) -> None:
        torch.manual_seed(0)
        self.data = torch.arange(64, dtype=torch.float32) / 64
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.25), torch.nn.Linear(16, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.own_generator = own_generator
        self.losses: List[torch.Tensor] = []

    def get_batch(self, ctx: IterContext) -> None:
        if self.own_generator:
            from swpipeline import task_generator

            ix = torch.randint(0, len(self.data) - 8, (4,), generator=task_generator(ctx, "get_batch"))
        else:
            ix = torch.randint(0, len(self.data) - 8, (4,))
        ctx.x = torch.stack([self.data[i:i + 8] for i in ix])

    def forward(self, ctx: IterContext) -> None:
        ctx.loss = self.model(ctx.x).square().mean()

    def backward(self, ctx: IterContext) -> None:
        ctx.loss.backward()

    def step(self, ctx: IterContext) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.losses.append(ctx.loss.detach())

    def plan(self) -> PipelinePlan:
        spec: Spec = {"get_batch": (0, "prep", "prep", self.get_batch), "forward": (1, None, "default", self.forward),
                      "backward": (1, None, "default", self.backward), "step": (1, None, "default", self.step)}
        return plan_of(spec, intra=[("forward", "get_batch"), ("backward", "forward"), ("step", "backward")],
                       inter=[("forward", "step")])


HINT = ("; or keep their random numbers apart: let one of the two draw from a generator of its own "
        "(swpipeline.task_generator) instead of torch.default_generator")
GENERATOR_RACE = ("race on torch.default_generator: 'get_batch' (iteration 1) draws from torch.default_generator, "
                  "which 'forward' (iteration 0) also draws from, and no declared dependency orders the two (a serial "
                  "run runs 'forward' first): add (\"get_batch\", \"forward\") to inter_iter_deps" + HINT)


def test_analyze_reports_the_pair_that_shares_the_default_generator() -> None:
    analysis = analyze(TinyGPT().plan(), None)
    assert [reason for *_, reason in analysis.missing_deps] == [
        "get_batch draws from `torch.default_generator`, which forward also draws from; in a pipelined run "
        "get_batch(i+1) may run before forward(i): add (\"get_batch\", \"forward\") to inter_iter_deps" + HINT]
    assert "torch.default_generator" in analysis.writes["get_batch"] & analysis.writes["forward"]
    assert "torch.default_generator" in analysis.state


def test_infer_deps_orders_the_two_draws() -> None:
    job = TinyGPT()
    intra, inter = infer_deps(dict(job.plan().schedule), None)
    assert names(intra) == [("forward", "get_batch"), ("backward", "forward"), ("step", "backward")]
    assert names(inter) == [("get_batch", "forward"), ("forward", "step")]


@pytest.mark.parametrize("caller", [c for c, _ in CALLER], ids=[i for _, i in CALLER])
@pytest.mark.parametrize("kind", ENGINES)
def test_check_races_names_both_tasks_and_the_generator(kind: str, caller: Any) -> None:
    with pytest.raises(RaceError) as info:
        engine(kind, TinyGPT().plan(), caller, check_races=True).run([None] * 6)
    assert str(info.value) == GENERATOR_RACE
    assert (info.value.attribute, info.value.first, info.value.second) == (
        "torch.default_generator", ("forward", 0), ("get_batch", 1))


def test_two_threads_finding_races_on_one_generator_report_the_same_one() -> None:
    # The order of a flaky failure on two workers: get_batch draws for iterations 0 and 1, forward(0) draws
    # and finds its race with get_batch(1); get_batch(2), already running on its own thread, draws next and
    # finds one with forward(0). Both report the pair a serial run reaches first, so whichever error reaches
    # the caller first, it is the same.
    job = TinyGPT()
    checker = RaceChecker(job.plan())
    get_batch, forward = checker.wrap("get_batch"), checker.wrap("forward")
    contexts = [IterContext(None, i) for i in range(3)]
    get_batch(contexts[0])
    get_batch(contexts[1])
    with pytest.raises(RaceError) as first:
        forward(contexts[0])
    with pytest.raises(RaceError) as second:
        get_batch(contexts[2])
    assert str(first.value) == str(second.value) == GENERATOR_RACE


def test_run_serial_reports_the_same_race() -> None:  # the verdict never depends on the order things ran in
    with pytest.raises(RaceError) as info:
        SWPipeline(TinyGPT().plan(), device="cpu", check_races=True).run_serial([None] * 3)
    assert str(info.value) == GENERATOR_RACE


def losses(kind: Optional[str], caller: Any = "auto", check: bool = False) -> torch.Tensor:
    job = TinyGPT(own_generator=True)
    torch.manual_seed(1234)  # the dropout masks: the default generator, left to forward alone
    if kind is None:
        SWPipeline(job.plan(), device="cpu").run_serial([None] * 8)
    else:
        engine(kind, job.plan(), caller, check_races=check).run([None] * 8)
    return torch.stack(job.losses)


@pytest.mark.parametrize("caller", [c for c, _ in CALLER], ids=[i for _, i in CALLER])
@pytest.mark.parametrize("kind", ENGINES)
def test_a_generator_of_its_own_for_get_batch_makes_the_run_bitwise_serial(kind: str, caller: Any) -> None:
    expected = losses(None)
    assert len(expected) == 8
    assert torch.equal(losses(kind, caller), expected)
    assert torch.equal(losses(kind, caller, check=True), expected)  # and the checker finds nothing
    analysis = analyze(TinyGPT(own_generator=True).plan(), None)
    assert analysis.missing_deps == [] and analysis.warnings == []


def draws(log: List[Tuple[str, int, float]], name: str) -> Fn:
    def draw(ctx: IterContext) -> None:
        log.append((name, ctx.iter_idx, float(torch.rand(1))))

    return draw


@pytest.mark.parametrize("gap", [1, 2])
def test_two_draws_on_one_thread_group_are_ordered_by_the_stages_or_not(gap: int,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    # One thread group runs a period's older iterations first: with the later task one stage up, B(i) still runs
    # before A(i+1), as in the serial loop (a warning: only the placement orders them); two stages up, A(i+1) runs
    # first and the numbers differ from the serial run's (missing).
    def run(how: str) -> List[Tuple[str, int, float]]:
        log: List[Tuple[str, int, float]] = []
        plan = plan_of({"A": (0, None, "default", draws(log, "A")), "B": (gap, None, "default", draws(log, "B"))})
        torch.manual_seed(0)
        pipe = SWPipeline(plan, device="cpu", check_races=how == "checked")
        pipe.run_serial(range(4)) if how == "serial" else pipe.run(range(4))
        return sorted(log)

    plan = plan_of({"A": (0, None, "default", draws([], "A")), "B": (gap, None, "default", draws([], "B"))})
    analysis = analyze(plan, None)
    warned = [(t, d, k) for t, d, k, _ in analysis.warnings]
    if gap == 1:
        assert warned == [("B", "A", "intra"), ("A", "B", "inter")] and analysis.missing_deps == []
        with caplog.at_level(logging.WARNING, logger="swpipeline"):
            assert run("checked") == run("serial")
        assert "'A' (iteration 1) draws from torch.default_generator, which 'B' (iteration 0) also draws from; " \
               "only the placement orders the two" in caplog.text
    else:
        assert warned == [("B", "A", "intra")]
        assert [(t, d, k) for t, d, k, _ in analysis.missing_deps] == [("A", "B", "inter")]
        assert "in a pipelined run A(i+1) runs before B(i)" in analysis.missing_deps[0][3]
        assert run("pipelined") != run("serial")
        with pytest.raises(RaceError, match="a serial run runs 'B' first; this placement runs 'A' first"):
            run("checked")


SHARED = torch.Generator().manual_seed(0)  # an explicit generator two tasks reach as a global


def draw_shared(ctx: IterContext) -> None:
    ctx.noise = torch.rand(2, generator=SHARED)


def draw_shared_too(ctx: IterContext) -> None:
    ctx.more = torch.rand(2, generator=SHARED)


def test_an_explicit_generator_the_tasks_reach_is_named_and_checked() -> None:
    spec: Spec = {"A": (0, "a", "a", draw_shared), "B": (0, "b", "b", draw_shared_too)}
    analysis = analyze(plan_of(spec), None)
    assert [(t, d, k) for t, d, k, _ in analysis.missing_deps] == [("B", "A", "intra"), ("A", "B", "inter")]
    assert analysis.missing_deps[0][3].startswith("B draws from `SHARED`, which A also draws from")
    with pytest.raises(RaceError, match="^race on SHARED: 'B' \\(iteration 0\\) draws from SHARED, which 'A' "
                                        "\\(iteration 0\\) also draws from"):
        SWPipeline(plan_of(spec), device="cpu", check_races=True).run(range(3))


def test_a_generator_made_inside_a_task_is_its_own() -> None:
    def private(ctx: IterContext) -> None:
        torch.rand(2, generator=torch.Generator().manual_seed(ctx.iter_idx))

    spec: Spec = {"A": (0, "a", "a", private), "B": (0, "b", "b", private)}
    assert analyze(plan_of(spec), None).missing_deps == []
    SWPipeline(plan_of(spec), device="cpu", check_races=True).run(range(4))


def test_the_default_generator_of_an_accelerator_is_named_as_torch_spells_it() -> None:
    from swpipeline.analysis.generators import drawn_from, generator_name

    key = drawn_from(torch.ops.aten.rand.default, ([2],), {"device": torch.device("cuda", 1)}, None)
    assert key == torch.device("cuda", 1)
    assert generator_name(key, {}) == "torch.cuda.default_generators[1]"
    assert generator_name(torch.device("cpu"), {}) == "torch.default_generator"
    assert drawn_from(torch.ops.aten.add.Tensor, (torch.ones(1), torch.ones(1)), {}, None) is None
    no_dropout = drawn_from(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
                            (torch.ones(1), torch.ones(1), torch.ones(1), 0.0), {}, None)
    assert no_dropout is None


def test_the_walk_over_live_tensors_finds_plain_tensors_and_leaves_python_dispatch_wrappers_alone() -> None:
    """The checks list every tensor alive before a run (to name a write to one); an orphaned FakeTensor of a
    compile that has ended must not be asked for its storage (the suite once crashed in that walk)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from swpipeline.analysis.access import _live_tensors

    plain, weight = torch.ones(3), torch.nn.Parameter(torch.ones(2))
    with FakeTensorMode() as mode:
        fake = torch.empty(4)
    assert type(fake).__name__ == "FakeTensor" and mode is not None
    found = {id(t) for t in _live_tensors()}
    assert id(plain) in found and id(weight) in found and id(fake) not in found
