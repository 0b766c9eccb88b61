"""Weights tied across stages (a language model's token embedding used again as its output head), on 2 gloo ranks.

Declared with ``tied_weights=[TiedWeight(...)]``, every copy's gradient is the one-process model's (where the
head's weight *is* the embedding's), bit for bit, under 1F1B, interleaved 1F1B, and the zero-bubble V (both uses
on one rank, one Parameter object, the backward split in I and W); the copies, and the whole model, stay equal to
one process through two AdamW steps. ``exact=False`` gives every copy the same gradient, within rounding of one
process's. Clipping counts the tied weight once. Ties that cannot work are refused, naming the fix.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Tuple

import pytest
import torch
from torch import nn

from dist_harness import run_on_ranks

VOCAB, WIDTH, BLOCKS, N_MB = 11, 8, 4, 4


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.lin(h))


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(h)


def make_lm() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(Embed(), *[Block() for _ in range(BLOCKS)], Head())
    model[-1].out.weight = model[0].tok.weight  # tied, as GPT-2's
    return model


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def lm_batch(step: int) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, VOCAB, (8, 5), generator=g)
    return ids, torch.randint(0, VOCAB, (8, 5), generator=g)


def pieces(model: nn.Sequential, num_stages: int) -> List[nn.Sequential]:
    """The model cut into ``num_stages`` pieces of whole modules (Embed first, Head last)."""
    mods = list(model)
    per = len(mods) // num_stages
    cuts = [i * per for i in range(num_stages)] + [len(mods)]
    return [nn.Sequential(*mods[a:b]) for a, b in zip(cuts, cuts[1:])]


def one_process(steps: int, clip: float = 0.0) -> Dict[str, Any]:
    model = make_lm()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    found: Dict[str, Any] = {}
    for step in range(steps):
        ids, target = lm_batch(step)
        for i_mb, t_mb in zip(ids.tensor_split(N_MB), target.tensor_split(N_MB)):
            lm_loss(model(i_mb), t_mb).backward()
        for p in model.parameters():
            p.grad /= N_MB
        if clip:
            found["total"] = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if step == 0:
            found["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    found["weights"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return found


CASES = {  # name: (schedule, stages, V placement)
    "1F1B": ("Schedule1F1B", 2),
    "interleaved 1F1B": ("ScheduleInterleaved1F1B", 4),
    "zero-bubble V, one Parameter for both uses": ("ScheduleZBVZeroBubble", 4),
}


def train_on_rank(rank: int, world: int, case: str, exact: bool, steps: int, clip: float) -> Dict[str, Any]:
    import swpipeline.pp as pp
    from swpipeline.pp.orders import placement_of
    from swpipeline.pp.placement import stages_of

    name, num_stages = CASES[case]
    model = make_lm()
    if case.startswith("zero-bubble"):
        model = copy.deepcopy(model)  # one deepcopy: both uses stay one Parameter, both on rank 0
    else:
        model = nn.Sequential(*[copy.deepcopy(m) for m in model])  # each stage its own copy
    parts = pieces(model, num_stages)
    mine = stages_of(rank, world, num_stages, placement_of(name))
    stages = [pp.PipelineStage(parts[s], s, num_stages, torch.device("cpu")) for s in mine]
    tie = pp.TiedWeight("embedding", {0: "0.tok.weight", num_stages - 1: f"{len(parts[-1]) - 1}.out.weight"},
                        exact=exact)
    schedule = getattr(pp, name)(stages if len(stages) > 1 else stages[0], N_MB, loss_fn=lm_loss,
                                 tied_weights=[tie])
    params = list({id(p): p for s in stages for p in s.submod.parameters()}.values())
    opt = torch.optim.AdamW(params, lr=0.05)
    got: Dict[str, Any] = {}
    for step in range(steps):
        ids, target = lm_batch(step)
        schedule.step(*([ids] if 0 in mine else []), **({"target": target} if num_stages - 1 in mine else {}))
        if clip:
            got["total"] = pp.clip_grad_norm_(schedule, clip)
        if step == 0:
            got["grads"] = {(s.stage_index, n): p.grad.clone() for s in stages for n, p in
                            s.submod.named_parameters(remove_duplicate=False)}
        opt.step()
        opt.zero_grad()
    got["weights"] = {(s.stage_index, n): p.detach().clone() for s in stages for n, p in
                      s.submod.named_parameters(remove_duplicate=False)}
    return got


def _one_process_name(num_stages: int, stage: int, name: str) -> str:
    """The one-process model's name of a stage's parameter (the head's weight is the embedding's)."""
    per = (BLOCKS + 2) // num_stages
    index, rest = name.split(".", 1)
    whole = f"{stage * per + int(index)}.{rest}"
    return "0.tok.weight" if rest == "out.weight" else whole


@pytest.mark.parametrize("case", list(CASES))
def test_a_declared_tie_gives_every_copy_one_process_s_gradient_and_weights_bit_for_bit(case: str) -> None:
    ranks = run_on_ranks(train_on_rank, 2, timeout=120, case=case, exact=True, steps=2, clip=0.0)
    want = one_process(2)
    num_stages = CASES[case][1]
    checked = 0
    for got in ranks:
        for (stage, name), grad in got["grads"].items():
            whole = _one_process_name(num_stages, stage, name)
            assert torch.equal(grad, want["grads"][whole]), (case, stage, name)
            assert torch.equal(got["weights"][(stage, name)], want["weights"][whole]), (case, stage, name)
            checked += whole == "0.tok.weight"
    assert checked == 2  # both copies


def test_the_cheaper_tie_gives_every_copy_the_same_gradient_close_to_one_process_s() -> None:
    zero, one = run_on_ranks(train_on_rank, 2, timeout=120, case="1F1B", exact=False, steps=2, clip=0.0)
    want = one_process(2)
    first, last = zero["grads"][(0, "0.tok.weight")], one["grads"][(1, "2.out.weight")]
    assert torch.equal(first, last)
    torch.testing.assert_close(first, want["grads"]["0.tok.weight"], rtol=1e-6, atol=1e-7)
    assert torch.equal(zero["weights"][(0, "0.tok.weight")], one["weights"][(1, "2.out.weight")])


def test_clipping_counts_a_tied_weight_once_as_one_process_does() -> None:
    ranks = run_on_ranks(train_on_rank, 2, timeout=120, case="1F1B", exact=True, steps=2, clip=0.05)
    want = one_process(2, clip=0.05)
    for got in ranks:
        assert torch.equal(got["total"], want["total"]), (got["total"], want["total"])
        for (stage, name), weight in got["weights"].items():
            assert torch.equal(weight, want["weights"][_one_process_name(2, stage, name)]), (stage, name)


# -- refused --------------------------------------------------------------------------------------------------

def refused_on_rank(rank: int, world: int, case: str) -> Dict[str, Any]:
    import swpipeline.pp as pp

    model = make_lm()
    parts = pieces(copy.deepcopy(model) if case == "undeclared" else
                   nn.Sequential(*[copy.deepcopy(m) for m in model]), 4 if case == "undeclared" else 2)
    tie = [pp.TiedWeight("embedding", {0: "0.tok.weight", 1: "2.out.weight"})]
    try:
        if case == "undeclared":  # stages 0 and 3 on rank 0 share the Parameter
            mine = [0, 3] if rank == 0 else [1, 2]
            pp.ScheduleZBVZeroBubble([pp.PipelineStage(parts[s], s, 4, "cpu") for s in mine], N_MB, loss_fn=lm_loss)
            return {"type": None}
        stage = pp.PipelineStage(parts[rank], rank, 2, "cpu")
        if case == "misnamed":
            tie = [pp.TiedWeight("embedding", {0: "0.tok.weight", 1: "2.head.weight"})]
        if case == "copies differ" and rank == 1:
            with torch.no_grad():
                parts[1][2].out.weight[0, 0] += 1
        schedule = pp.Schedule1F1B(stage, N_MB, loss_fn=lm_loss, tied_weights=tie if (case != "declared on one rank"
                                                                                     or rank == 0) else [])
        if case == "misnamed":
            return {"type": None}
        ids, target = lm_batch(0)
        schedule.step(*([ids] if rank == 0 else []), **({"target": target} if rank == 1 else {}))
    except Exception as exc:
        return {"type": type(exc).__name__, "text": str(exc)}
    return {"type": None}


def test_one_parameter_in_two_stages_of_a_rank_is_refused_unless_declared() -> None:
    zero, one = run_on_ranks(refused_on_rank, 2, timeout=60, case="undeclared")
    assert zero == {"type": "ValueError", "text": (
        "ScheduleZBVZeroBubble: stage 0's 0.tok.weight and stage 3's 2.out.weight are one Parameter; declare the "
        "tie so that its gradient is summed as one process sums it: tied_weights=[TiedWeight('shared', {0: "
        "'0.tok.weight', 3: '2.out.weight'})]")}
    assert one == {"type": None}


def test_a_tie_naming_a_parameter_a_stage_lacks_is_refused_listing_what_it_has() -> None:
    zero, one = run_on_ranks(refused_on_rank, 2, timeout=60, case="misnamed")
    assert zero == {"type": None}
    assert one == {"type": "ValueError", "text": (
        "Schedule1F1B: tied weight 'embedding' names stage 1's parameter '2.head.weight', which its module does not "
        "have (it has: 0.lin.weight, 0.lin.bias, 1.lin.weight, 1.lin.bias, 2.out.weight)")}


def test_copies_that_differ_fail_the_first_step_on_both_holders() -> None:
    zero, one = run_on_ranks(refused_on_rank, 2, timeout=60, case="copies differ")
    for got, (stage, other) in ((zero, (0, 1)), (one, (1, 0))):
        names = {0: "0.tok.weight", 1: "2.out.weight"}
        assert got == {"type": "ValueError", "text": (
            f"tied weight 'embedding': stage {stage}'s {names[stage]} and stage {other}'s {names[other]} hold "
            f"different values; make the copies equal before the first step (build both stages from one model, or "
            f"copy one into the other)")}, got


def test_a_tie_declared_on_one_rank_only_fails_the_first_step_naming_both_configurations() -> None:
    zero, one = run_on_ranks(refused_on_rank, 2, timeout=60, case="declared on one rank")
    said = {r["type"] for r in (zero, one)}
    assert "ScheduleMismatchError" in said and said <= {"ScheduleMismatchError", "PipelineRankError"}, (zero, one)
    text = zero["text"] + one["text"]
    assert "tied weights embedding (stage 0 0.tok.weight, stage 1 2.out.weight)" in text, text


def test_bad_declarations_are_refused_when_written() -> None:
    import swpipeline.pp as pp

    with pytest.raises(ValueError, match=r"TiedWeight 'e': uses must map at least two stage indices"):
        pp.TiedWeight("e", {0: "w"})
    with pytest.raises(TypeError, match=r"TiedWeight 'e': the keys of uses are stage indices"):
        pp.TiedWeight("e", {"0": "w", 1: "v"})
    with pytest.raises(TypeError, match=r"TiedWeight: name must be a non-empty str"):
        pp.TiedWeight("", {0: "w", 1: "v"})
    with pytest.raises(TypeError, match=r"TiedWeight 'e': exact must be True or False"):
        pp.TiedWeight("e", {0: "w", 1: "v"}, exact=1)  # type: ignore[arg-type]
