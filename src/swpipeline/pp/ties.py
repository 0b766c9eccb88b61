"""Weights tied across stages: one weight that two stages use (a GPT's token embedding and its output head).

Each stage that uses the weight holds a copy of it; the user declares the tie, on every rank alike::

    TiedWeight("embedding", {0: "tok.weight", 3: "head.weight"})               exact (the default)
    TiedWeight("embedding", {0: "tok.weight", 3: "head.weight"}, exact=False)  each rank's sum over the step

One process computes the gradient of a weight used twice as, per microbatch, the sum of its
uses' shares (autograd adds them, the later stage's first, before the weight's gradient takes
them), then adds the microbatches' sums to the gradient one after another. So, exact: each
backward of a stage that uses the weight runs with the weight's gradient set aside, which
leaves that use's share for the microbatch. After the step every other holder sends its shares
to the *root*, the holder of the tie's last stage, which adds them all in the one-process order
onto its copy's gradient and sends that gradient back (``tie_wire.py``). Every copy gets the same
gradient, bit for bit one process's, so the copies stay equal through any optimizer step.

The cost: the root keeps its use's share per microbatch during the step (``n_microbatches``
times the weight; the head's share is dense); the other holders keep theirs packed, only the
rows that are not zero (an embedding's share has one row per token the microbatch saw), and
send only those; the root sends the weight's size back. ``exact=False``: each copy sums its own
shares over the step as usual, and the root adds the holders' sums (the last stage's first):
the copies still get the same gradient, within rounding of one process's, and no share per
microbatch is kept.

At the first step every holder also sends a fingerprint of its copy (shape, dtype and bytes):
copies that differ fail that step on the ranks that hold them, naming both stages.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Sequence, Set, Tuple

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from .placement import Placement, rank_of
from .stage import PipelineStage
from .tie_wire import TieWire, dense, pack, plus

__all__: List[str] = []

TAG_BASE = 1 << 19  # on the transport's groups, below its tags (transport.TAG_BASE): 4 per tie
Shares = Dict[Tuple[str, int, int], Any]  # (tie, stage, microbatch) -> that use's share of the gradient (or Packed)


@dataclass(frozen=True)
class TiedWeight:
    """A weight that several stages use, each holding a copy: ``uses`` maps each stage index to the name of its
    copy in that stage's module (as ``module.get_parameter`` takes it). ``exact``: gradients bit for bit one
    process's (the default); ``False``: one exchange of each rank's sum per step, equal on every copy, within
    rounding of one process's."""

    name: str
    uses: Mapping[int, str]
    exact: bool = True
    _key: Tuple[Tuple[int, str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"TiedWeight: name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.uses, Mapping) or len(self.uses) < 2:
            raise ValueError(f"TiedWeight {self.name!r}: uses must map at least two stage indices to parameter names, "
                             f"such as {{0: 'tok.weight', 3: 'head.weight'}}, got {self.uses!r}")
        for stage, param in self.uses.items():
            if isinstance(stage, bool) or not isinstance(stage, int) or stage < 0:
                raise TypeError(f"TiedWeight {self.name!r}: the keys of uses are stage indices (ints >= 0), got "
                                f"{stage!r}")
            if not isinstance(param, str) or not param:
                raise TypeError(f"TiedWeight {self.name!r}: stage {stage}'s parameter must be a name such as "
                                f"'head.weight', got {param!r}")
        if not isinstance(self.exact, bool):
            raise TypeError(f"TiedWeight {self.name!r}: exact must be True or False, got {self.exact!r}")
        object.__setattr__(self, "_key", tuple(sorted(self.uses.items())))

    def describe(self) -> str:
        uses = ", ".join(f"stage {s} {p}" for s, p in self._key)
        return f"{self.name} ({uses}{'' if self.exact else ', exact=False'})"


_NONE = contextlib.nullcontext()


class Ties:
    """One rank's side of a schedule's tied weights (see the module docstring)."""

    def __init__(self, ties: Sequence[Any], stages: Sequence[PipelineStage], placement: Placement, timeout: float,
                 who: str, resolve: bool = True) -> None:
        """``resolve``: find this rank's copies (once the placement is known); without it, only check the ties."""
        self.ties = _check_ties(ties, stages[0].num_stages, who)
        first = stages[0]
        self.group, self.rank, self.timeout = first.group, first.group_rank, timeout
        self.size, self.placement = first.group_size, placement
        self.wire = first.device if dist.get_backend(first.group) == "nccl" else torch.device("cpu")
        held = {s.stage_index: s for s in stages}
        self.ranks = {t.name: sorted({rank_of(s, first.group_size, placement) for s in t.uses}) for t in self.ties}
        # tie -> this rank's uses, the later stage first: (stage, parameter)
        self.mine: Dict[str, List[Tuple[int, torch.nn.Parameter]]] = {}
        for tie in self.ties if resolve else []:
            for s in sorted((s for s in tie.uses if s in held), reverse=True):
                self.mine.setdefault(tie.name, []).append((s, _parameter(held[s], tie, who)))
        # tie -> this rank's copies, each once (one Parameter may serve several stages of the rank)
        self.copies = {name: list({id(p): p for _, p in uses}.values()) for name, uses in self.mine.items()}
        self.exact_of_stage: Dict[int, List[torch.nn.Parameter]] = {}
        for tie in self.ties:
            if tie.exact:
                for s, param in self.mine.get(tie.name, []):
                    self.exact_of_stage.setdefault(s, []).append(param)
        self.root = {t.name: rank_of(max(t.uses), self.size, placement) for t in self.ties}  # adds the shares up
        self.tie_of = {(s, id(p)): tie.name for tie in self.ties for s, p in self.mine.get(tie.name, [])}
        if resolve:
            _refuse_undeclared(stages, self.tie_of, who)
        self.checked = False

    def description(self) -> str:
        return "; ".join(t.describe() for t in self.ties)

    def repeats(self) -> Set[int]:
        """The copies that clipping leaves out: each tie's counted once, in its first stage, as one process counts
        a shared parameter once, where it first comes."""
        return {id(p) for tie in self.ties for s, p in self.mine.get(tie.name, []) if s != min(tie.uses)}

    # -- during the step ---------------------------------------------------------------------------

    def capture(self, stage: int, microbatch: int, shares: Shares) -> Any:
        """The context a backward of ``stage`` runs in: each exact tie's copy's gradient set aside, so that the
        backward leaves this use's share for the microbatch in ``shares``."""
        params = self.exact_of_stage.get(stage)
        if not params:
            return _NONE
        return self._captured(stage, microbatch, params, shares)

    @contextlib.contextmanager
    def _captured(self, stage: int, microbatch: int, params: List[torch.nn.Parameter], shares: Shares
                  ) -> Iterator[None]:
        aside = [p.grad for p in params]
        for p in params:
            p.grad = None
        try:
            yield
        finally:
            for p, grad in zip(params, aside):
                share, p.grad = p.grad, grad
                if share is not None:
                    self._keep(shares, self.tie_of[(stage, id(p))], stage, microbatch, share)

    def _keep(self, shares: Shares, tie: str, stage: int, microbatch: int, share: torch.Tensor) -> None:
        """Keep a use's share: whole on the root, packed elsewhere (what it sends: ``tie_wire.pack``)."""
        key = (tie, stage, microbatch)
        if key in shares:  # a second backward of the same use and microbatch (a dw_builder's W after its I)
            share = dense(shares[key], share) + share
        shares[key] = share if self.rank == self.root[tie] else pack(share)

    @contextlib.contextmanager
    def step(self, n: int, shares: Shares) -> Iterator[None]:
        """Around the run of a training step: the cheap ties' gradients set aside (each copy sums its own share),
        then, when the run succeeds, the shares swapped and added up on every copy."""
        cheap = [(tie, s, p) for tie in self.ties if not tie.exact for s, p in self.mine.get(tie.name, [])]
        aside = {id(p): p.grad for _, _, p in cheap}
        for _, _, p in cheap:
            p.grad = None
        try:
            yield
        finally:
            for tie, s, p in cheap:
                if id(p) in aside:
                    share, p.grad = p.grad, aside.pop(id(p))
                    if share is not None:
                        self._keep(shares, tie.name, s, 0, share)
        for tie in self.ties:
            if tie.name in self.mine:
                self._combine(tie, n if tie.exact else 1, shares)
        self.checked = True

    # -- after the step: the shares to one holder, the total back ------------------------------------

    def _combine(self, tie: TiedWeight, n: int, shares: Shares) -> None:
        """Every holder's shares to the root (the holder of the tie's last stage), which adds them in the one-process
        order onto its copy's gradient and sends that gradient back to every other holder (``tie_wire.py``)."""
        mine, root = self.mine[tie.name], self.root[tie.name]
        first = mine[0][1]
        fingerprint = None if self.checked else _fingerprint(first)
        if fingerprint is not None:
            for s, p in mine[1:]:
                self._check_copies(tie, mine[0][0], fingerprint, s, _fingerprint(p))
        wire = TieWire(self.group, self.rank, self.wire, self.timeout, tie.name, TAG_BASE + 4 * self.ties.index(tie))
        if self.rank != root:
            packed = [shares.pop((tie.name, s, m), None) for s, _ in mine for m in range(n)]
            heard = wire.to_root(root, packed, first, fingerprint)
            if fingerprint is not None:
                self._check_copies(tie, mine[0][0], fingerprint, self._stages_on(tie, root)[0], heard.fingerprint())
            total = heard.total()
            if total is not None:
                for p in self.copies[tie.name]:
                    if p.grad is None:
                        p.grad = total.to(p.device, copy=True)
                    else:
                        p.grad.copy_(total)
            return
        self._add_up(tie, n, shares, wire, fingerprint)

    def _add_up(self, tie: TiedWeight, n: int, shares: Shares, wire: TieWire, fingerprint: Any) -> None:
        """The root's side: the other holders' shares in, every share added in the one-process order onto each of
        this rank's copies, the gradient out."""
        mine = self.mine[tie.name]
        first = mine[0][1]
        others = {r: self._stages_on(tie, r) for r in self.ranks[tie.name] if r != self.rank}
        for r, (theirs, got) in wire.from_others({r: len(ss) * n for r, ss in others.items()}, first,
                                                  fingerprint).items():
            if fingerprint is not None:
                self._check_copies(tie, mine[0][0], fingerprint, others[r][0], theirs)
            for k, share in enumerate(got):
                if share is not None:
                    shares[(tie.name, others[r][k // n], k % n)] = share
        order = sorted(tie.uses, reverse=True)
        copies = self.copies[tie.name]
        for m in range(n):  # per microbatch its uses' shares, the later stage's first; then onto the gradient
            terms = [shares.pop((tie.name, s, m)) for s in order if (tie.name, s, m) in shares]
            if not terms:
                continue
            total = dense(terms[0], first)
            for term in terms[1:]:
                total = plus(total, term)
            for k, p in enumerate(copies):
                if p.grad is None:
                    p.grad = total if k == len(copies) - 1 else total.clone()
                else:
                    p.grad.add_(total)
        wire.total_to_others(list(others), first.grad, first)

    def _stages_on(self, tie: TiedWeight, rank: int) -> List[int]:
        """The tie's stages on ``rank``, the later first."""
        return sorted((s for s in tie.uses if rank_of(s, self.size, self.placement) == rank), reverse=True)

    def _check_copies(self, tie: TiedWeight, stage: int, mine: Sequence[int], other: int,
                      theirs: Sequence[int]) -> None:
        if mine[0] != theirs[0]:
            raise ValueError(f"tied weight {tie.name!r}: stage {stage}'s {tie.uses[stage]} and stage {other}'s "
                             f"{tie.uses[other]} differ in shape or dtype; a tie joins copies of one weight")
        if mine[1] != theirs[1]:
            raise ValueError(f"tied weight {tie.name!r}: stage {stage}'s {tie.uses[stage]} and stage {other}'s "
                             f"{tie.uses[other]} hold different values; make the copies equal before the first step "
                             f"(build both stages from one model, or copy one into the other)")


def _check_ties(ties: Sequence[Any], num_stages: int, who: str) -> List[TiedWeight]:
    """The declared ties: TiedWeight objects, of distinct names, each use a stage of the pipeline, no copy in two."""
    if isinstance(ties, TiedWeight):
        ties = [ties]
    found: List[TiedWeight] = []
    claimed: Dict[Tuple[int, str], str] = {}
    for tie in ties:
        if not isinstance(tie, TiedWeight):
            raise TypeError(f"{who}: tied_weights takes TiedWeight objects, such as TiedWeight('embedding', "
                            f"{{0: 'tok.weight', {num_stages - 1}: 'head.weight'}}), got {tie!r}")
        if any(t.name == tie.name for t in found):
            raise ValueError(f"{who}: two tied weights are named {tie.name!r}; give each its own name")
        for stage, param in tie.uses.items():
            if stage >= num_stages:
                raise ValueError(f"{who}: tied weight {tie.name!r} names stage {stage}, but the pipeline has "
                                 f"{num_stages} stages (0 to {num_stages - 1})")
            if (stage, param) in claimed:
                raise ValueError(f"{who}: stage {stage}'s {param} is in two tied weights, {claimed[(stage, param)]!r} "
                                 f"and {tie.name!r}; declare one tie with every use of it")
            claimed[(stage, param)] = tie.name
        found.append(tie)
    return found


def _parameter(stage: PipelineStage, tie: TiedWeight, who: str) -> torch.nn.Parameter:
    """The stage's copy of the tied weight (a stage wrapped for data parallelism is refused: not handled yet)."""
    module, name = stage.submod, tie.uses[stage.stage_index]
    if isinstance(module, (DistributedDataParallel, FSDPModule)) or any(
            isinstance(m, FSDPModule) for m in module.modules()):
        raise ValueError(f"{who}: stage {stage.stage_index} is wrapped for data parallelism (DDP or FSDP2) and holds "
                         f"tied weight {tie.name!r}; tied weights are handled on plain stages only for now")
    try:
        return module.get_parameter(name)
    except AttributeError:
        names = [n for n, _ in module.named_parameters()]
        raise ValueError(f"{who}: tied weight {tie.name!r} names stage {stage.stage_index}'s parameter {name!r}, "
                         f"which its module does not have (it has: {', '.join(names) or 'no parameters'})") from None


def _refuse_undeclared(stages: Sequence[PipelineStage], tie_of: Mapping[Tuple[int, int], str], who: str) -> None:
    """One Parameter object in two of this rank's stages is a tie: refused unless declared (each stage would add
    its share to the one gradient in its own order, not one process's)."""
    seen: Dict[int, Tuple[int, str]] = {}
    for stage in stages:
        for name, param in stage.submod.named_parameters():
            if id(param) in seen and seen[id(param)][0] != stage.stage_index:
                s, other = seen[id(param)]
                if not ((s, id(param)) in tie_of and (stage.stage_index, id(param)) in tie_of):
                    raise ValueError(
                        f"{who}: stage {s}'s {other} and stage {stage.stage_index}'s {name} are one Parameter; "
                        f"declare the tie so that its gradient is summed as one process sums it: "
                        f"tied_weights=[TiedWeight('shared', {{{s}: '{other}', "
                        f"{stage.stage_index}: '{name}'}})]")
            seen.setdefault(id(param), (stage.stage_index, name))


def _fingerprint(param: torch.Tensor) -> Tuple[int, int]:
    """A copy's shape and dtype, and its bytes, each as a 63-bit hash."""
    def digest(data: bytes) -> int:
        return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") >> 1

    values = param.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
    return digest(repr((tuple(param.shape), str(param.dtype))).encode()), digest(values)
