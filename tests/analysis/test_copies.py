"""Copying is reading: what users do to tensors, contexts, modules and state dicts, judged read or write by both checks.

The story: once the checks followed memory (a write is the memory an operator wrote), a
copy became a write of what it copied. ``copy.deepcopy(t)`` makes an empty tensor, points
it at ``t``'s storage with ``set_`` to copy the bytes, then fills a new storage; ``set_``'s
schema marks its tensor written, and after the call that tensor covered ``t``'s memory.
So ``analyze`` reported a missing dependency and ``check_races=True`` raised ``RaceError``
on correct plans that snapshot their best weights (``copy.deepcopy(model.state_dict())``)
or copy a context tensor for logging, in ``run_serial`` and on both engines.

The rule now: an operator writes the memory its written arguments covered *before* it ran
(a copy's new tensor covered none of what it copies); one that points a tensor at other
memory (``set_``) changes that tensor object, written wherever it is held.

Each row below is one thing a task does (``Act``) to one target that another thread group
(``Look``) reads, both after ``Prep``, with no order between them. A read row: ``analyze``
finds nothing missing and no write of the target, and ``check_races=True`` (``run_serial``
and both engines, the caller's thread group on and off) runs clean and computes bit for bit
what the unchecked serial run computes. A write row: ``analyze`` reports ``("Look", "Act")``
and ``check_races=True`` raises ``RaceError`` on the target.
"""

from __future__ import annotations

import copy
import importlib.util
import io
import pickle
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, List, NamedTuple, Set

import pytest
import torch

from engine_helpers import plan_of
from swpipeline import IterContext, RaceError, SWPipeline, analyze
from test_shared_state import CALLER, ENGINES, engine

ROOT = Path(__file__).resolve().parents[2]
Action = Callable[["Job", IterContext], Any]


class Row(NamedTuple):
    action: Action
    target: str  # what Look reads (a context attribute, model or opt), and what a write row writes
    writes: FrozenSet[str] = frozenset()  # for a read row, what else it writes (that Look does not read)


def _saved(value: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer)


def _printed(value: Any) -> str:
    out = io.StringIO()
    print(value, file=out)
    return out.getvalue()


READS: Dict[str, Row] = {
    "copy.copy(tensor)": Row(lambda j, c: copy.copy(c.x), "ctx.x"),
    "copy.deepcopy(tensor)": Row(lambda j, c: copy.deepcopy(c.x), "ctx.x"),
    "copy.deepcopy(tensor) kept on the context": Row(lambda j, c: setattr(c, "snap", copy.deepcopy(c.x)), "ctx.x"),
    "copy.deepcopy(a view)": Row(lambda j, c: copy.deepcopy(c.x[1:]), "ctx.x"),
    "copy.copy(dict of tensors)": Row(lambda j, c: copy.copy(c.d), "ctx.d"),
    "copy.deepcopy(dict of tensors)": Row(lambda j, c: copy.deepcopy(c.d), "ctx.d"),
    "copy.deepcopy(a state dict on the context)": Row(lambda j, c: copy.deepcopy(c.sd), "ctx.sd"),
    "copy.deepcopy(model.state_dict())": Row(lambda j, c: copy.deepcopy(j.model.state_dict()), "model"),
    "copy.deepcopy(optimizer.state_dict())": Row(lambda j, c: copy.deepcopy(j.opt.state_dict()), "opt"),
    "copy.deepcopy(module)": Row(lambda j, c: copy.deepcopy(j.model), "model"),
    "pickle (tensor)": Row(lambda j, c: pickle.loads(pickle.dumps(c.x)), "ctx.x"),
    "pickle (state_dict)": Row(lambda j, c: pickle.loads(pickle.dumps(j.model.state_dict())), "model"),
    "torch.save (tensor)": Row(lambda j, c: _saved(c.x), "ctx.x"),
    "torch.save (state_dict)": Row(lambda j, c: _saved(j.model.state_dict()), "model"),
    "torch.save (optimizer.state_dict())": Row(lambda j, c: _saved(j.opt.state_dict()), "opt"),
    "clone": Row(lambda j, c: c.x.clone(), "ctx.x"),
    "detach": Row(lambda j, c: c.x.detach(), "ctx.x"),
    "to(dtype)": Row(lambda j, c: c.x.to(torch.float64), "ctx.x"),
    "cpu()": Row(lambda j, c: c.x.cpu(), "ctx.x"),
    "numpy().copy()": Row(lambda j, c: torch.from_numpy(c.x.numpy().copy()), "ctx.x"),
    "tolist": Row(lambda j, c: c.x.tolist(), "ctx.x"),
    "contiguous": Row(lambda j, c: c.x.t().contiguous(), "ctx.x"),
    "repr": Row(lambda j, c: repr(c.x), "ctx.x"),
    "print": Row(lambda j, c: _printed(c.d), "ctx.d"),
    "torch.equal / allclose": Row(lambda j, c: (torch.equal(c.x, c.sd["weight"]), torch.allclose(c.x, c.x)), "ctx.x"),
    "other.load_state_dict(model.state_dict())": Row(
        lambda j, c: j.other.load_state_dict(j.model.state_dict()), "model", frozenset({"other.weight", "other.bias"})),
    "set_, read through a view of the old memory": Row(
        lambda j, c: c.x.set_(torch.ones(3, 2)), "ctx.head", frozenset({"ctx.x"})),  # head's bytes stay as they were
}

WRITES: Dict[str, Row] = {
    "an in-place operator": Row(lambda j, c: c.x.mul_(2), "ctx.x"),
    "out=": Row(lambda j, c: torch.add(c.x, 1, out=c.x), "ctx.x"),
    "an in-place operator on a dict's tensor": Row(lambda j, c: c.d["rows"][1].add_(1), "ctx.d"),
    ".data changed in place": Row(lambda j, c: c.x.data.mul_(2), "ctx.x"),
    "a weight's .data changed in place": Row(lambda j, c: j.model.weight.data.mul_(2), "model.weight"),
    "set_": Row(lambda j, c: c.x.set_(torch.ones(3, 2)), "ctx.x"),
    "set_ to a copy of its own storage": Row(lambda j, c: c.x.set_(c.x.untyped_storage().clone()), "ctx.x"),
    "resize_": Row(lambda j, c: c.x.resize_(2, 2), "ctx.x"),
    "resize_ of an empty tensor": Row(lambda j, c: c.empty.resize_(2).fill_(1), "ctx.empty"),
    "copy_ into": Row(lambda j, c: c.x.copy_(torch.zeros(2, 3)), "ctx.x"),
    "two rows written, a view of one read": Row(lambda j, c: (c.x[1].add_(1), c.x[0].add_(1)), "ctx.head"),
    "a list appended to, then read again": Row(lambda j, c: (c.log.append(len(c.log)), len(c.log)), "ctx.log"),
    "a foreach operator (an optimizer's)": Row(lambda j, c: torch._foreach_mul_([c.sd["bias"], c.x], 2), "ctx.x"),
    "load_state_dict into a module a task reads": Row(
        lambda j, c: j.model.load_state_dict(j.other.state_dict()), "model"),
}


class Job:
    """Prep puts a tensor, a dict of tensors and a state dict on the context; Act does one row's action; Look (another
    thread group) reads the row's target. ``made`` and ``seen`` keep what Act made and what Look read."""

    def __init__(self, action: Action, target: str) -> None:
        torch.manual_seed(0)
        self.model, self.other = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=0.1)
        self.model(torch.ones(1, 3)).sum().backward()
        self.opt.step()
        self.initial = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.action, self.target = action, target
        self.made: List[Any] = []
        self.seen: List[Any] = []

    def prep(self, ctx: IterContext) -> None:
        ctx.x = torch.arange(6.0).reshape(2, 3) + ctx.iter_idx
        ctx.d = {"sum": ctx.x.sum(), "rows": [ctx.x[0] * 2, ctx.x[1] * 3]}
        ctx.sd = {k: v.clone() for k, v in self.initial.items()}
        ctx.empty = torch.empty(0)
        ctx.head = ctx.x[0]
        ctx.log = [0]

    def act(self, ctx: IterContext) -> None:
        self.made.append(plain(self.action(self, ctx)))

    def look(self, ctx: IterContext) -> None:
        if self.target.startswith("model"):  # the model's output
            with torch.no_grad():
                self.seen.append(plain(self.model(torch.ones(1, 3))))
        elif self.target == "opt":
            self.seen.append([plain(s["exp_avg"].clone()) for s in self.opt.state.values()])  # (tolist: no operator)
        else:
            self.seen.append(plain(getattr(ctx, self.target[len("ctx."):])))

    def spec(self) -> Dict[str, Any]:
        return {"Prep": (0, "prep", "prep", self.prep), "Act": (1, "a", "a", self.act),
                "Look": (1, "b", "b", self.look)}


def plain(value: Any) -> Any:
    """What a value holds, in plain Python (tensors as dtype, shape and exact values), to compare two runs."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), value.detach().flatten().tolist())
    if isinstance(value, torch.nn.Module):
        return plain(value.state_dict())
    if isinstance(value, dict):
        return [(plain(k), plain(v)) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


DECLARED = [("Act", "Prep"), ("Look", "Prep")]
BATCHES = [None] * 4


def names_of(target: str) -> Set[str]:
    """The names analyze gives the target (model.weight: Look reads the whole model, the row writes the weight)."""
    return {"model": {"model.weight", "model.bias"},
            "opt": {"opt.state[model.weight].exp_avg", "opt.state[model.bias].exp_avg"}}.get(target, {target})


def test_the_reported_case_is_clean() -> None:
    # a snapshot of ctx.x on one thread group while another reads it: both checks called it a write
    snapshot: Action = lambda j, c: copy.deepcopy(c.x)  # noqa: E731
    assert analyze(plan_of(Job(snapshot, "ctx.x").spec(), DECLARED), None).missing_deps == []
    job = Job(snapshot, "ctx.x")
    SWPipeline(plan_of(job.spec(), DECLARED), device="cpu", check_races=True).run(BATCHES)
    assert job.made == job.seen == [plain(torch.arange(6.0).reshape(2, 3) + k) for k in range(4)]


@pytest.mark.parametrize("row", READS, ids=list(READS))
def test_analyze_calls_a_copy_a_read(row: str) -> None:
    job = Job(READS[row].action, READS[row].target)
    analysis = analyze(plan_of(job.spec(), DECLARED), None)
    assert analysis.missing_deps == []
    assert analysis.writes["Act"] - {"ctx.snap"} == READS[row].writes
    assert names_of(job.target) <= analysis.reads["Look"]


RUNS = ["run_serial"] + [f"{kind}/{caller_id}" for kind in ENGINES for _, caller_id in CALLER]


def checked_run(job: Job, run: str) -> None:
    plan = plan_of(job.spec(), DECLARED)
    if run == "run_serial":
        SWPipeline(plan, device="cpu", check_races=True).run_serial(BATCHES)
        return
    kind, caller_id = run.split("/")
    caller = dict((i, c) for c, i in CALLER)[caller_id]
    engine(kind, plan, caller, check_races=True).run(BATCHES)


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("row", READS, ids=list(READS))
def test_check_races_calls_a_copy_a_read_and_changes_nothing_it_computes(row: str, run: str) -> None:
    checked, serial = Job(READS[row].action, READS[row].target), Job(READS[row].action, READS[row].target)
    checked_run(checked, run)
    SWPipeline(plan_of(serial.spec(), DECLARED), device="cpu").run_serial(BATCHES)
    assert len(serial.made) == len(serial.seen) == 4
    assert (checked.made, checked.seen) == (serial.made, serial.seen)


@pytest.mark.parametrize("row", WRITES, ids=list(WRITES))
def test_analyze_calls_a_change_a_write(row: str) -> None:
    job = Job(WRITES[row].action, WRITES[row].target)
    analysis = analyze(plan_of(job.spec(), DECLARED), None)
    assert ("Look", "Act", "intra") in [(t, d, kind) for t, d, kind, _ in analysis.missing_deps]
    assert names_of(job.target) <= analysis.writes["Act"]


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("row", WRITES, ids=list(WRITES))
def test_check_races_calls_a_change_a_write(row: str, run: str) -> None:
    job = Job(WRITES[row].action, WRITES[row].target)
    with pytest.raises(RaceError) as info:
        checked_run(job, run)
    assert info.value.attribute in names_of(job.target)
    assert {info.value.first[0], info.value.second[0]} == {"Act", "Look"}


def test_the_sampled_mutations_of_the_checks_still_apply() -> None:
    # tools/mutate_checks.py: each mutation's text must stay in its file, once, or the sampling tests nothing
    spec = importlib.util.spec_from_file_location("mutate_checks", ROOT / "tools" / "mutate_checks.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert len(tool.MUTATIONS) >= 20
    for mutation in tool.MUTATIONS:
        text = (ROOT / "src" / "swpipeline" / "analysis" / mutation.file).read_text()
        assert text.count(mutation.old) == 1, mutation.name
        assert mutation.old != mutation.new
    for file in ("memory.py", "operators.py", "inplace.py", "checked_call.py"):
        assert sum(m.file == file for m in tool.MUTATIONS) >= 5, file
