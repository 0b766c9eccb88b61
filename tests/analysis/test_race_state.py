"""What ``check_races=True`` sees besides the context, and what it says when a read comes too early.

* **Weights.** A step on a thread group of its own, without ``(Forward, Step)``: ``analyze``
  said "Forward reads model.0.bias ..., which Step writes" while ``run(check_races=True)``
  finished without a word. The run-time check now sees the state ``analyze`` names
  (parameters, buffers, gradients and optimizer state the task functions reach) through the
  operators that read and write it.
* **A read before the write.** Without ``(Forward, Prep)``, ``Forward`` read ``ctx.x`` before
  ``Prep`` had set it, and the run raised ``AttributeError`` (6 of 6 runs) instead of the
  race naming both tasks. The check now waits, at such a read, for the tasks that could set
  the attribute, and reports the race as it does when the write comes first.
* **The default generator named explicitly.** ``generator=torch.default_generator`` is the
  default generator: two thread groups drawing from it race (no test drew with it named).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, List, Optional, Sequence, Tuple

import pytest
import torch

from engine_helpers import Fn, Spec, plan_of
from swpipeline import IterContext, PipelinePlan, RaceChecker, RaceError, SWPipeline
from swpipeline import analyze
from test_shared_state import CALLER, ENGINES, engine



# -- weights --------------------------------------------------------------------------------------------------------


class Training:
    """Forward and Backward on the default thread group; Step one stage later on a thread group of its own."""

    def __init__(self, step_group: str = "opt") -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.step_group = step_group
        self.losses: List[torch.Tensor] = []

    def forward(self, ctx: IterContext) -> None:
        ctx.loss = self.model(ctx.batch).square().mean()

    def backward(self, ctx: IterContext) -> None:
        ctx.loss.backward()
        self.losses.append(ctx.loss.detach())

    def step(self, ctx: IterContext) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad()

    def plan(self, inter: Sequence[Tuple[str, str]] = ()) -> PipelinePlan:
        stream = None if self.step_group == "default" else self.step_group
        spec: Spec = {"Forward": (0, None, "default", self.forward), "Backward": (0, None, "default", self.backward),
                      "Step": (1, stream, self.step_group, self.step)}
        return plan_of(spec, intra=[("Backward", "Forward"), ("Step", "Backward")], inter=inter)


def batches(n: int = 6) -> List[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randn(5, 4, generator=gen) for _ in range(n)]


def weight_race(name: str) -> str:
    return (f"race on {name}: 'Forward' (iteration 1) reads {name}, which 'Step' (iteration 0) writes, and no declared "
            f"dependency orders the two (a serial run runs 'Step' first): add (\"Forward\", \"Step\") to "
            f"inter_iter_deps")


WEIGHT_RACE = weight_race("model.0.bias")  # found when Forward(1) returns: its reads, by name


def test_analyze_and_check_races_name_the_same_weights() -> None:
    analysis = analyze(Training().plan(), batches()[0], warmup=1)
    assert [(t, d, kind) for t, d, kind, _ in analysis.missing_deps] == [("Forward", "Step", "inter")]
    assert "Forward reads `model.0.bias`, `model.0.weight`, `model.2.bias`, `model.2.weight`, which Step writes" \
        in analysis.missing_deps[0][3]


@pytest.mark.parametrize("caller", [c for c, _ in CALLER], ids=[i for _, i in CALLER])
@pytest.mark.parametrize("kind", ENGINES)
def test_check_races_sees_the_weights_a_step_on_another_thread_group_writes(kind: str, caller: Any) -> None:
    with pytest.raises(RaceError) as info:
        engine(kind, Training().plan(), caller, check_races=True).run(batches())
    # Step(0)'s first write (model.0.weight) if Forward(1) had returned by then, else Forward(1)'s first read by name
    assert info.value.attribute in ("model.0.weight", "model.0.bias")
    assert str(info.value) == weight_race(info.value.attribute)
    assert (info.value.first, info.value.second) == (("Step", 0), ("Forward", 1))


class WriteBeforeBackward(Training):
    """Step(0) writes the weights while Backward(1), whose graph saved them, waits; Backward(1) runs before Step(0)
    returns. Were the write of the weights logged only when Step(0)'s call ends, Backward(1) would fail first, with
    autograd's "modified by an inplace operation", hiding the race that caused it."""

    def __init__(self) -> None:
        super().__init__()
        self.backward_started, self.stepped, self.backward_done = threading.Event(), threading.Event(), \
            threading.Event()

    def backward(self, ctx: IterContext) -> None:
        if ctx.iter_idx != 1:
            return super().backward(ctx)
        self.backward_started.set()
        try:
            assert self.stepped.wait(10)
            super().backward(ctx)
        finally:
            self.backward_done.set()

    def step(self, ctx: IterContext) -> None:
        if ctx.iter_idx != 0:
            return super().step(ctx)
        assert self.backward_started.wait(10)
        try:
            super().step(ctx)
        finally:
            self.stepped.set()
            assert self.backward_done.wait(10)


@pytest.mark.parametrize("caller", [c for c, _ in CALLER], ids=[i for _, i in CALLER])
@pytest.mark.parametrize("kind", ENGINES)
def test_the_race_is_reported_before_the_write_it_names_changes_what_another_task_computes(
        kind: str, caller: Any) -> None:
    training = WriteBeforeBackward()
    with pytest.raises(RaceError) as info:
        engine(kind, training.plan(), caller, check_races=True).run(batches())
    assert str(info.value) == weight_race("model.0.weight")  # Step(0)'s first write, judged before it lands
    assert training.backward_done.is_set()
    untouched = Training().model  # the same initial weights: Step(0) was refused before it changed them
    with torch.no_grad():
        expected = [untouched(b).square().mean() for b in batches()[:2]]
    assert len(training.losses) == 2 and all(torch.equal(a, b) for a, b in zip(training.losses, expected))


def test_run_serial_reports_the_same_weight_race() -> None:
    with pytest.raises(RaceError) as info:
        SWPipeline(Training().plan(), device="cpu", check_races=True).run_serial(batches())
    assert str(info.value) == WEIGHT_RACE


@pytest.mark.parametrize("caller", [c for c, _ in CALLER], ids=[i for _, i in CALLER])
@pytest.mark.parametrize("kind", ENGINES)
def test_the_fixed_plan_runs_checked_without_a_report_and_bitwise_as_serial(kind: str, caller: Any) -> None:
    serial, checked = Training(), Training()
    SWPipeline(serial.plan([("Forward", "Step")]), device="cpu").run_serial(batches())
    pipe = engine(kind, checked.plan([("Forward", "Step")]), caller, check_races=True)
    pipe.run(batches())
    assert len(serial.losses) == 6 and torch.equal(torch.stack(checked.losses), torch.stack(serial.losses))
    assert all(torch.equal(a, b) for a, b in zip(checked.model.parameters(), serial.model.parameters()))


def test_weights_ordered_only_by_the_placement_are_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    job = Training(step_group="default")
    checker = RaceChecker(job.plan())
    with caplog.at_level(logging.WARNING, logger="swpipeline"):
        SWPipeline(job.plan(), device="cpu", check_races=True).run(batches())
        tasks = {t.name: checker.wrap(t) for t in job.plan().tasks}
        for k, batch in enumerate(batches(3)):
            ctx = IterContext(batch, k)
            for name in ("Forward", "Backward", "Step"):
                tasks[name](ctx)
    assert checker.warnings == [
        "'Forward' (iteration 1) reads model.0.bias, which 'Step' (iteration 0) writes; only the placement orders "
        "the two (both on thread group 'default' and the default stream), so another thread group or stream would "
        "race: add (\"Forward\", \"Step\") to inter_iter_deps",
        "'Backward' (iteration 1) reads model.2.weight, which 'Step' (iteration 0) writes; only the placement "
        "orders the two (both on thread group 'default' and the default stream), so another thread group or stream "
        "would race: add (\"Backward\", \"Step\") to inter_iter_deps"]  # one warning per pair of tasks


def test_a_check_never_changes_what_the_weights_compute() -> None:
    plain, checked = Training(), Training()
    SWPipeline(plain.plan([("Forward", "Step")]), device="cpu").run(batches())
    SWPipeline(checked.plan([("Forward", "Step")]), device="cpu", check_races=True).run(batches())
    assert torch.equal(torch.stack(plain.losses), torch.stack(checked.losses))


# -- a read before the write ----------------------------------------------------------------------------------------


class Early:
    """Prep (stage 0, its own thread group) sets ctx.x; Forward (stage 1, the default thread group) reads it; the
    plan forgets
    (Forward, Prep). ``gate``: Prep waits for it before writing, so that Forward reads first."""

    def __init__(self, gate: Optional[threading.Event] = None) -> None:
        self.gate = gate
        self.seen: List[int] = []

    def prep(self, ctx: IterContext) -> None:
        if self.gate is not None:
            assert self.gate.wait(timeout=10)
        ctx.x = ctx.iter_idx

    def forward(self, ctx: IterContext) -> None:
        if self.gate is not None:
            threading.Timer(0.05, self.gate.set).start()  # Prep writes once Forward waits at its read
        self.seen.append(ctx.x)

    def spec(self) -> Spec:
        return {"Prep": (0, "prep", "prep", self.prep), "Forward": (1, None, "default", self.forward)}


EARLY_RACE = ("race on ctx.x: 'Forward' (iteration 0) reads ctx.x, which 'Prep' (iteration 0) writes, and no "
              "declared dependency orders the two (a serial run runs 'Prep' first): add (\"Forward\", \"Prep\") to "
              "intra_iter_deps")


@pytest.mark.parametrize("caller", [c for c, _ in CALLER], ids=[i for _, i in CALLER])
@pytest.mark.parametrize("kind", ENGINES)
def test_a_read_before_the_write_is_the_race_naming_both_tasks(kind: str, caller: Any) -> None:
    with pytest.raises(RaceError) as info:
        engine(kind, plan_of(Early(threading.Event()).spec()), caller, check_races=True).run(range(4))
    assert str(info.value) == EARLY_RACE
    assert info.value.__cause__ is None
    assert (info.value.first, info.value.second) == (("Prep", 0), ("Forward", 0))


def test_the_reader_waits_for_the_writer_and_both_report_the_race() -> None:
    # Forced: Forward reads ctx.x on a thread of its own before Prep has run at all; Prep then runs and
    # writes it. Forward, waiting at its read for the tasks that could set x, reports the race once Prep
    # is done; Prep reports it at its write. The same words both.
    job = Early()
    checker = RaceChecker(plan_of(job.spec()))
    prep, forward = checker.wrap("Prep"), checker.wrap("Forward")
    ctx = IterContext(None, 0)
    in_forward: List[BaseException] = []

    def reader() -> None:
        try:
            forward(ctx)
        except BaseException as exc:  # noqa: BLE001 (handed to the test thread)
            in_forward.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    thread.join(timeout=0.2)
    assert thread.is_alive()  # waiting at its read for Prep
    with pytest.raises(RaceError) as info:
        prep(ctx)
    thread.join(timeout=10)
    assert not thread.is_alive() and job.seen == []
    assert [str(e) for e in in_forward] == [str(info.value)] == [EARLY_RACE]


def test_a_read_of_an_attribute_no_task_sets_is_still_an_attribute_error() -> None:
    def look(ctx: IterContext) -> None:
        ctx.y = ctx.nothing

    spec: Spec = {"Prep": (0, "prep", "prep", lambda ctx: None), "Look": (1, None, "default", look)}
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        SWPipeline(plan_of(spec), device="cpu", check_races=True).run(range(3))
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        SWPipeline(plan_of(spec), device="cpu", check_races=True).run_serial(range(3))


@pytest.mark.parametrize("kind", ENGINES)
def test_a_tolerant_read_of_an_attribute_no_task_sets_computes_as_without_the_check(kind: str) -> None:
    seen: List[Any] = []
    spec: Spec = {"Prep": (0, "prep", "prep", lambda ctx: setattr(ctx, "x", ctx.iter_idx)),
                  "Other": (0, "other", "other", lambda ctx: None),
                  "Look": (1, None, "default", lambda ctx: seen.append((ctx.x, getattr(ctx, "extra", None))))}
    engine(kind, plan_of(spec, intra=[("Look", "Prep")]), check_races=True).run(range(5))
    assert seen == [(k, None) for k in range(5)]


# -- the default generator, named ------------------------------------------------------------------------------------


def draw_default(log: List[float]) -> Fn:
    def draw(ctx: IterContext) -> None:
        log.append(float(torch.rand(1, generator=torch.default_generator)))

    return draw


@pytest.mark.parametrize("kind", ENGINES)
def test_draws_from_the_default_generator_named_explicitly_race(kind: str) -> None:
    log: List[float] = []
    spec: Spec = {"A": (0, "a", "a", draw_default(log)), "B": (0, "b", "b", draw_default(log))}
    analysis = analyze(plan_of(spec), None)
    assert [(t, d, kind_) for t, d, kind_, _ in analysis.missing_deps] == [("B", "A", "intra"), ("A", "B", "inter")]
    assert "torch.default_generator" in analysis.writes["A"] & analysis.writes["B"]
    with pytest.raises(RaceError) as info:
        engine(kind, plan_of(spec), check_races=True).run(range(4))
    assert info.value.attribute == "torch.default_generator"
    assert (info.value.first, info.value.second) == (("A", 0), ("B", 0))


# -- names and values the checks hand back ---------------------------------------------------------------------------


def test_analyze_names_a_weight_version_after_its_parameter() -> None:
    from swpipeline import WeightVersions

    job = Training()
    versions = WeightVersions(job.model, staleness=1)

    def forward(ctx: IterContext) -> None:
        with versions.use(ctx):
            ctx.loss = job.model(ctx.batch).square().mean()

    spec: Spec = {"Forward": (0, "f", "f", forward), "Backward": (1, "b", "b", lambda ctx: ctx.loss.backward()),
                  "Step": (2, None, "default", lambda ctx: versions.step(ctx, job.optimizer))}
    plan = plan_of(spec, intra=[("Backward", "Forward"), ("Step", "Backward")])
    plan = PipelinePlan(plan.schedule, plan.intra_iter_deps, [versions.deps(plan.task("Forward"), plan.task("Step"))])
    analysis = analyze(plan, batches()[0], warmup=2)
    assert (analysis.missing_deps, analysis.warnings) == ([], [])
    assert analysis.reads["Forward"] == {"job.model.0.bias (version 1)", "job.model.0.weight (version 1)",
                                         "job.model.2.bias (version 1)", "job.model.2.weight (version 1)"}
    assert "job.model.2.weight (version 1)" in analysis.reads["Backward"]  # through the iteration's leaf
    assert not [n for n in analysis.reads["Forward"] | analysis.reads["Backward"] if n.startswith("tensor ")]
