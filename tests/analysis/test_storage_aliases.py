"""The checks follow memory, not attribute names: aliases and views of one storage.

Each case was a plan whose checks disagreed with what its runs computed:

* one tensor under two names (``ctx.y = ctx.x``), a view (``ctx.head = ctx.x[:2]``) or a
  value of the batch (``ctx.img = ctx.batch["x"]``), changed in place under one name on one
  thread group and read under the other on another: ``analyze``, ``infer_deps`` and
  ``check_races=True`` saw nothing, and pipelined runs differed from ``run_serial``;
* two disjoint views of one buffer (``ctx.a, ctx.b = buf[0], buf[1]``), one changed in place
  while another thread group reads the other: views share one version counter, so every
  check reported a race that cannot happen (and ``infer_deps`` serialised the two).

A write is now the memory an operator wrote (a storage and the bytes of it the written
tensor covers), and a write of memory is a write of every context attribute whose value
covers any of those bytes.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch

from engine_helpers import Spec, plan_of
from swpipeline import IterContext, RaceError, SWPipeline
from swpipeline import analyze, infer_deps
from test_shared_state import CALLER, ENGINES, engine, names



class Aliased:
    """Prep makes ctx.x (and an alias of it); Change doubles the alias in place; Look (another thread group) sums
    ``read``. Serially Look sees Change's doubling wherever the two names overlap."""

    def __init__(self, alias: str, read: str = "x") -> None:
        self.alias, self.read = alias, read
        self.seen: List[float] = []

    def prep(self, ctx: IterContext) -> None:
        ctx.x = ctx.batch["x"] if self.alias == "batch" else torch.arange(4.0) + 10 * ctx.iter_idx
        if self.alias == "name":
            ctx.y = ctx.x
        elif self.alias == "view":
            ctx.y = ctx.x[:2]
        elif self.alias == "batch":
            ctx.y = ctx.batch["x"]
        ctx.tail, ctx.middle = ctx.x[2:], ctx.x[1:3]

    def scale(self, ctx: IterContext) -> None:
        ctx.y.mul_(2)

    def read_it(self, ctx: IterContext) -> None:
        value = ctx.batch["x"] if self.read == "batch" else getattr(ctx, self.read)
        self.seen.append(float(value.sum()))

    def spec(self) -> Spec:
        return {"Prep": (0, "prep", "prep", self.prep), "Change": (1, None, "default", self.scale),
                "Look": (1, "side", "side", self.read_it)}


def batches() -> List[Dict[str, torch.Tensor]]:
    return [{"x": torch.arange(4.0) + 10 * k} for k in range(4)]


DECLARED = [("Change", "Prep"), ("Look", "Prep")]
ALIASES = [("name", "x"), ("view", "x"), ("batch", "batch"), ("view", "middle")]


@pytest.mark.parametrize("alias,read", ALIASES)
def test_a_write_through_an_alias_is_a_write_of_every_name_that_shares_its_memory(alias: str, read: str) -> None:
    job = Aliased(alias, read)
    shown = "ctx.batch" if read == "batch" else f"ctx.{read}"
    analysis = analyze(plan_of(job.spec(), DECLARED), batches()[0])
    assert [reason for *_, reason in analysis.missing_deps] == [
        f"Look reads `{shown}`, which Change changes in place; in a pipelined run Look(i) may run before Change(i): "
        f"add (\"Look\", \"Change\") to intra_iter_deps"]
    assert shown in analysis.writes["Change"] and "ctx.y" in analysis.writes["Change"]
    intra, inter = infer_deps(plan_of(job.spec()).schedule, batches()[0])
    assert (names(intra), names(inter)) == ([("Change", "Prep"), ("Look", "Change")], [])


@pytest.mark.parametrize("caller", [c for c, _ in CALLER], ids=[i for _, i in CALLER])
@pytest.mark.parametrize("kind", ENGINES)
@pytest.mark.parametrize("alias,read", ALIASES)
def test_check_races_catches_a_write_through_an_alias_and_the_fixed_plan_runs_as_serial(
        alias: str, read: str, kind: str, caller: Any) -> None:
    shown = "ctx.batch" if read == "batch" else f"ctx.{read}"
    with pytest.raises(RaceError) as info:
        engine(kind, plan_of(Aliased(alias, read).spec(), DECLARED), caller, check_races=True).run(batches())
    assert str(info.value) == (
        f"race on {shown}: 'Look' (iteration 0) reads {shown}, which 'Change' (iteration 0) changes in place, and "
        f"no declared dependency orders the two (a serial run runs 'Change' first): add (\"Look\", \"Change\") to "
        f"intra_iter_deps")
    assert (info.value.first, info.value.second) == (("Change", 0), ("Look", 0))
    fixed, serial = Aliased(alias, read), Aliased(alias, read)
    engine(kind, plan_of(fixed.spec(), [*DECLARED, ("Look", "Change")]), caller, check_races=True).run(batches())
    SWPipeline(plan_of(serial.spec(), [*DECLARED, ("Look", "Change")]), device="cpu").run_serial(batches())
    assert fixed.seen == serial.seen and len(serial.seen) == 4


def test_run_serial_checks_aliases_too() -> None:
    with pytest.raises(RaceError, match="^race on ctx.x: 'Look' \\(iteration 0\\) reads ctx.x, which 'Change'"):
        SWPipeline(plan_of(Aliased("view").spec(), DECLARED), device="cpu", check_races=True).run_serial(batches())


@pytest.mark.parametrize("alias", ["view", "name"])
def test_memory_an_alias_does_not_cover_is_not_written(alias: str) -> None:
    # ctx.tail is x[2:]: the view y = x[:2] does not cover it; the alias y = x does.
    job = Aliased(alias, "tail")
    analysis = analyze(plan_of(job.spec(), DECLARED), batches()[0])
    if alias == "view":
        assert analysis.missing_deps == [] and "ctx.tail" not in analysis.writes["Change"]
    else:
        assert [(t, d) for t, d, *_ in analysis.missing_deps] == [("Look", "Change")]


class Disjoint:
    """Prep puts two rows of one buffer on the context; Change adds a to b in place; Look (another thread group)
    reads a only."""

    def __init__(self) -> None:
        self.seen: List[List[float]] = []
        self.updated: List[List[float]] = []

    def prep(self, ctx: IterContext) -> None:
        buf = torch.stack([torch.full((3,), float(ctx.iter_idx + 1)), torch.zeros(3)])
        ctx.a, ctx.b = buf[0], buf[1]

    def update(self, ctx: IterContext) -> None:
        ctx.b.add_(ctx.a)
        self.updated.append(ctx.b.tolist())

    def read_a(self, ctx: IterContext) -> None:
        self.seen.append(ctx.a.tolist())

    def spec(self) -> Spec:
        return {"Prep": (0, "prep", "prep", self.prep), "Change": (1, None, "default", self.update),
                "Look": (1, "side", "side", self.read_a)}


DISJOINT_DEPS = [("Change", "Prep"), ("Look", "Prep")]


def test_disjoint_views_of_one_buffer_do_not_conflict_for_analyze_and_infer_deps() -> None:
    job = Disjoint()
    analysis = analyze(plan_of(job.spec(), DISJOINT_DEPS), None)
    assert (analysis.missing_deps, analysis.warnings) == ([], [])
    assert analysis.writes["Change"] == {"ctx.b"}
    intra, inter = infer_deps(plan_of(job.spec()).schedule, None)
    assert (names(intra), names(inter)) == (DISJOINT_DEPS, [])


@pytest.mark.parametrize("caller", [c for c, _ in CALLER], ids=[i for _, i in CALLER])
@pytest.mark.parametrize("kind", ENGINES)
def test_disjoint_views_run_checked_without_a_report_and_as_serial(kind: str, caller: Any) -> None:
    job, serial = Disjoint(), Disjoint()
    engine(kind, plan_of(job.spec(), DISJOINT_DEPS), caller, check_races=True).run(range(5))
    SWPipeline(plan_of(serial.spec(), DISJOINT_DEPS), device="cpu", check_races=True).run_serial(range(5))
    assert job.seen == serial.seen == [[float(k + 1)] * 3 for k in range(5)]
    assert job.updated == serial.updated == [[float(k + 1)] * 3 for k in range(5)]


class Columns:
    """Two interleaved views of one buffer: columns 0 and 1 of a 4 x 4 matrix (their byte spans overlap, their
    elements do not); Change doubles column 1, Look reads column 0 (or column 1, or the whole matrix)."""

    def __init__(self, read: str) -> None:
        self.read = read
        self.seen: List[float] = []

    def prep(self, ctx: IterContext) -> None:
        ctx.m = torch.arange(16.0).reshape(4, 4) + ctx.iter_idx
        ctx.c0, ctx.c1 = ctx.m[:, 0], ctx.m[:, 1]
        ctx.b6, ctx.b8 = ctx.m.view(torch.uint8)[:, 6], ctx.m.view(torch.uint8)[:, 8]  # a byte of c1's, of column 2's

    def update(self, ctx: IterContext) -> None:
        ctx.c1.mul_(2)

    def read_it(self, ctx: IterContext) -> None:
        self.seen.append(float(getattr(ctx, self.read).sum()))

    def spec(self) -> Spec:
        return {"Prep": (0, "prep", "prep", self.prep), "Change": (1, None, "default", self.update),
                "Look": (1, "side", "side", self.read_it)}


@pytest.mark.parametrize("read,conflict", [("c0", False), ("c1", True), ("m", True), ("b6", True), ("b8", False)])
def test_interleaved_views_conflict_only_where_their_elements_meet(read: str, conflict: bool) -> None:
    analysis = analyze(plan_of(Columns(read).spec(), DISJOINT_DEPS), None)
    assert [(t, d) for t, d, *_ in analysis.missing_deps] == ([("Look", "Change")] if conflict else [])
    if conflict:
        with pytest.raises(RaceError, match=f"^race on ctx.{read}: 'Look' \\(iteration 0\\) reads ctx.{read}"):
            engine("SWPipeline", plan_of(Columns(read).spec(), DISJOINT_DEPS), check_races=True).run(range(3))
    else:
        engine("DataFlowPipeline", plan_of(Columns(read).spec(), DISJOINT_DEPS), check_races=True).run(range(3))


class FlatParameters(torch.nn.Module):
    """Two parameters that are views of one flat buffer (as FSDP and fused optimizers lay them out)."""

    def __init__(self) -> None:
        super().__init__()
        flat = torch.arange(8.0)
        self.a, self.b = torch.nn.Parameter(flat[:4]), torch.nn.Parameter(flat[4:])


def test_two_parameters_in_one_flat_buffer_are_two_names() -> None:
    model = FlatParameters()
    seen: List[float] = []

    def bump_a(ctx: IterContext) -> None:
        with torch.no_grad():
            model.a.add_(1)

    def read_b(ctx: IterContext) -> None:
        seen.append(float(model.b.detach().sum()))

    plan = plan_of({"Bump": (0, "a", "a", bump_a), "Read": (0, "b", "b", read_b)})
    analysis = analyze(plan, None)
    assert analysis.missing_deps == []
    assert (analysis.writes["Bump"], analysis.reads["Read"]) == ({"model.a"}, {"model.b"})
    SWPipeline(plan, device="cpu", check_races=True).run(range(3))
    assert seen == [22.0] * 4  # analyze's iteration, then three
