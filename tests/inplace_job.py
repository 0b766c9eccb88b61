"""A job whose race is a value changed in place: shared by the analysis tests and a bug story (tests/test_bugs.py)."""

from __future__ import annotations

from typing import List

import torch

from engine_helpers import Spec
from swpipeline import IterContext


class InPlace:
    """A writes ctx.x, B doubles it in place, C (another thread group) reads it: serially [0, 6, 12, 18]."""

    def __init__(self) -> None:
        self.seen: List[int] = []

    def a(self, ctx: IterContext) -> None:
        ctx.x = torch.tensor(3 * ctx.iter_idx)

    def b(self, ctx: IterContext) -> None:
        ctx.x.mul_(2)

    def c(self, ctx: IterContext) -> None:
        self.seen.append(int(ctx.x))

    def spec(self) -> Spec:
        return {"A": (0, "prep", "prep", self.a), "B": (1, None, "default", self.b),
                "C": (1, "side", "side", self.c)}


INPLACE_RACE = ("race on ctx.x: 'C' (iteration 0) reads ctx.x, which 'B' (iteration 0) changes in place, and no "
                "declared dependency orders the two (a serial run runs 'B' first): add (\"C\", \"B\") to "
                "intra_iter_deps")
