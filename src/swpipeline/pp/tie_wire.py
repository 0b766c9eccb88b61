"""A tied weight's exchange after a step: every holder's shares to one holder (the root), the total back.

The root is the holder of the tie's last stage (the output head, whose share is dense). Every
other holder keeps its shares packed (``pack``): an embedding's share per microbatch has a row
per token the microbatch saw and +0.0 everywhere else, so only those rows travel, and ``dense``
or ``plus`` gives back, bit for bit, what adding the whole share gives. The messages, with the
tags ``base + part`` on the transport's one-way groups (``transport.direction_groups``)::

    part 0   holder -> root   int64: the holder's fingerprint (or 0, 0 once checked), then per share the
                              number of rows it kept (-1: no share)
    part 1   holder -> root   bytes: the kept rows' indices (int64), then the rows
    part 2   root -> holder   int64: the root's fingerprint (the first step only)
    part 3   root -> holder   the total gradient, flattened, then 1 (or 0: no gradient at all)

A holder posts all its messages at once and then waits, so a step pays about one round trip
for the exchange; every wait ends after twice the schedule's timeout, naming the silent rank.
"""

from __future__ import annotations

import datetime
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from .errors import RankTimeoutError
from .transport import direction_groups

__all__: List[str] = []

_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
Fingerprint = Tuple[int, int]


class Packed(NamedTuple):
    """A share as the rows (along dimension 0) that hold a bit other than 0, and their indices."""

    where: torch.Tensor  # the rows kept, int64
    rows: torch.Tensor  # (len(where), the rest of the shape flattened)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0] if t.dim() else 1, -1)


def pack(share: torch.Tensor) -> Packed:
    """``share`` packed (a row of -0.0 is kept: ``dense`` gives it back bit for bit)."""
    rows = _rows(share.detach())
    bits = rows.view(_BITS[rows.element_size()])  # as integers, -0.0 is not 0
    kept = ((bits.amax(dim=1) != 0) | (bits.amin(dim=1) != 0)).nonzero().flatten()  # (4x faster than aminmax)
    return Packed(kept, rows.index_select(0, kept))


def dense(share: Union[torch.Tensor, Packed], like: torch.Tensor) -> torch.Tensor:
    """A share whole, of ``like``'s shape (a new tensor when packed)."""
    if isinstance(share, torch.Tensor):
        return share
    whole = torch.zeros(like.shape, dtype=like.dtype, device=like.device)
    _rows(whole).index_copy_(0, share.where, share.rows)
    return whole


def plus(total: torch.Tensor, term: Union[torch.Tensor, Packed]) -> torch.Tensor:
    """``total + term`` as the whole tensors add, bit for bit, written into ``total`` (the caller's own). A packed
    term: its rows added to those of ``total``, and +0.0 to the rest (which turns a -0.0 into +0.0, as adding the
    whole share's zeros would), without making the whole share."""
    if isinstance(term, torch.Tensor):
        return total.add_(term)
    rows = _rows(total)
    touched = rows.index_select(0, term.where)
    total.add_(0.0)
    rows.index_copy_(0, term.where, touched + term.rows)
    return total


class Heard:
    """What a holder gets back from the root, waited for when asked."""

    def __init__(self, wire: "TieWire", root: int, said: Optional[Tuple[torch.Tensor, Any]],
                 back: Tuple[torch.Tensor, Any], sends: List[Any], like: torch.Tensor) -> None:
        self.wire, self.root, self.said, self.back, self.sends, self.like = wire, root, said, back, sends, like

    def fingerprint(self) -> Fingerprint:
        """The root's fingerprint (asked for at the first step only)."""
        assert self.said is not None
        self._sent()  # all of it delivered first: copies that differ fail this rank, and it may exit at once
        self.wire.wait(self.said[1], self.root)
        a, b = self.said[0].tolist()
        return a, b

    def _sent(self) -> None:
        while self.sends:
            self.wire.wait(self.sends.pop(), self.root)

    def total(self) -> Optional[torch.Tensor]:
        """The total gradient (None: no use had a gradient)."""
        back, work = self.back
        self.wire.wait(work, self.root)
        self._sent()
        if not float(back[-1]):
            return None
        return back[:-1].view(self.like.shape).to(self.like.device)


class TieWire:
    """One tie's messages between this rank and the other holders, for one step."""

    def __init__(self, group: Any, rank: int, device: torch.device, timeout: float, name: str, base: int) -> None:
        self.group, self.rank, self.device, self.timeout = group, rank, device, timeout
        self.name, self.base = name, base
        self.up, self.down = direction_groups(group)  # one way per connection, as the step's messages go

    def to_root(self, root: int, packed: Sequence[Optional[Packed]], like: torch.Tensor,
                fingerprint: Optional[Fingerprint]) -> Heard:
        """A holder's side: send its shares (None: no share), get the root's fingerprint and the total."""
        counts = [-1 if p is None else len(p.where) for p in packed]
        meta = torch.tensor(list(fingerprint or (0, 0)) + counts, dtype=torch.int64, device=self.device)
        kept = [p for p in packed if p is not None and len(p.where)]
        works = [self._post(root, 0, meta, send=True)]
        if kept:
            payload = torch.cat([torch.cat([p.where for p in kept]).view(torch.uint8),
                                 torch.cat([p.rows for p in kept]).reshape(-1).view(torch.uint8)])
            works.append(self._post(root, 1, payload.to(self.device), send=True))
        said = torch.empty(2, dtype=torch.int64, device=self.device)
        back = torch.empty(like.numel() + 1, dtype=like.dtype, device=self.device)
        return Heard(self, root, (said, self._post(root, 2, said, send=False)) if fingerprint is not None else None,
                     (back, self._post(root, 3, back, send=False)), works, like)

    def from_others(self, entries: Mapping[int, int], like: torch.Tensor, fingerprint: Optional[Fingerprint]
                    ) -> Dict[int, Tuple[Fingerprint, List[Optional[Packed]]]]:
        """The root's side: each other holder's fingerprint and shares (``entries``: how many it sends)."""
        metas = {r: torch.empty(2 + k, dtype=torch.int64, device=self.device) for r, k in entries.items()}
        works = [(r, self._post(r, 0, meta, send=False)) for r, meta in metas.items()]
        sent = [(r, self._post(r, 2, torch.tensor(list(fingerprint), dtype=torch.int64, device=self.device),
                               send=True)) for r in entries] if fingerprint is not None else []
        for r, work in works:
            self.wait(work, r)
        width = _rows(like).shape[1]
        found: Dict[int, Tuple[Fingerprint, List[Optional[Packed]]]] = {}
        for r, meta in metas.items():
            values = meta.tolist()
            counts = values[2:]
            rows = sum(c for c in counts if c > 0)
            payload = torch.empty(rows * (8 + width * like.element_size()), dtype=torch.uint8, device=self.device)
            if rows:
                self.wait(self._post(r, 1, payload, send=False), r)
            payload = payload.to(like.device)
            where = payload[:rows * 8].view(torch.int64)
            flat = payload[rows * 8:].view(like.dtype).view(rows, width)
            shares: List[Optional[Packed]] = []
            at = 0
            for k in counts:
                shares.append(None if k < 0 else Packed(where[at:at + k], flat[at:at + k]))
                at += max(k, 0)
            found[r] = ((values[0], values[1]), shares)
        for r, work in sent:
            self.wait(work, r)
        return found

    def total_to_others(self, others: Sequence[int], grad: Optional[torch.Tensor], like: torch.Tensor) -> None:
        """The root's side: the total gradient (with its flag) to every other holder."""
        if not others:
            return
        flag = torch.ones(1, dtype=like.dtype, device=self.device)
        back = (torch.cat([grad.detach().reshape(-1).to(self.device), flag]) if grad is not None
                else torch.zeros(like.numel() + 1, dtype=like.dtype, device=self.device))
        for r, work in [(r, self._post(r, 3, back, send=True)) for r in others]:
            self.wait(work, r)

    def _post(self, peer: int, part: int, tensor: torch.Tensor, send: bool) -> Any:
        if send:
            return dist.isend(tensor, group=self.up if peer > self.rank else self.down, group_dst=peer,
                              tag=self.base + part)
        return dist.irecv(tensor, group=self.down if peer > self.rank else self.up, group_src=peer,
                          tag=self.base + part)

    def wait(self, work: Any, peer: int) -> None:
        try:
            if work is not None:
                work.wait(datetime.timedelta(seconds=2 * self.timeout))
        except RuntimeError as exc:
            raise RankTimeoutError(
                f"rank {peer} did not exchange tied weight {self.name!r}'s gradient with rank {self.rank} ({exc}); "
                f"rank {peer} is stuck, much slower, or gone", rank=peer, stage=None, microbatch=None, action=None,
                error=str(exc)) from None
