"""A schedule as data: one action is one stage's work on one microbatch, written ``1F3``.

An :class:`Action` names a stage, a kind and a microbatch. Its string form is the
stage, the kind's letters and the microbatch (``0F2``: stage 0 runs the forward of
microbatch 2; ``3B0``, ``1I4``, ``1W4``; ``2SEND_F1``, ``3RECV_F1``), and
``Action.parse`` reads it back, so a schedule can be written, stored and printed as
text. The compute kinds are what a user writes; the send and receive actions are
derived from them (``comms.py``), never written by hand::

    F       forward of the microbatch
    B       full backward: the gradients of the stage's inputs and of its parameters
    I, W    the backward split in two (zero bubble): I the inputs' gradients, which the
            previous stage waits for; W the parameters' gradients, which nobody waits for
    SEND_F / RECV_F, SEND_B / RECV_B    activations forward, gradients backward
"""

from __future__ import annotations

import enum
import re
from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Union

__all__: List[str] = []


class Kind(str, enum.Enum):
    """What an action does (its letters in the string form)."""

    FORWARD = "F"
    BACKWARD = "B"
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"

    def __str__(self) -> str:
        return self.value


FWD, BWD, BWD_I, BWD_W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT
COMPUTE = frozenset({FWD, BWD, BWD_I, BWD_W})
BACKWARD_KINDS = frozenset({BWD, BWD_I, BWD_W})
_PATTERN = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)$")


class Action(NamedTuple):
    """One stage's work on one microbatch: ``Action(1, Kind.FORWARD, 3)``, written ``1F3``."""

    stage: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    def __repr__(self) -> str:
        return f"Action({str(self)!r})"

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE

    @classmethod
    def parse(cls, text: str) -> "Action":
        """The action a string names (``"1F3"``); the inverse of ``str(action)``.

        Raises:
            ValueError: the text is not ``<stage><kind><microbatch>``.
        """
        if not isinstance(text, str):
            raise TypeError(f"an action is written as a str such as '1F3', got {type(text).__name__} {text!r}")
        match = _PATTERN.match(text.strip())
        if match is None:
            kinds = ", ".join(k.value for k in Kind)
            raise ValueError(f"cannot read the action {text!r}: write <stage><kind><microbatch>, e.g. '1F3' (stage 1, "
                             f"forward, microbatch 3); the kinds are {kinds}")
        stage, kind, microbatch = match.groups()
        return cls(int(stage), Kind(kind), int(microbatch))


ActionLike = Union[Action, str]
_TORCH_KINDS = {"FULL_BACKWARD": Kind.BACKWARD}  # torch's names for an action's kind that differ from ours
RankOrders = Dict[int, List[Action]]  # rank -> its compute actions, in the order it runs them


def as_action(item: object, where: str) -> Action:
    """An Action from an Action, its string form, or torch.distributed.pipelining's own action object (a custom
    schedule written for torch); ``where`` names the place in an error."""
    if isinstance(item, Action):
        return Action(item.stage, Kind(item.kind), item.microbatch)
    if isinstance(item, str):
        try:
            return Action.parse(item)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    stage, kind = getattr(item, "stage_index", None), getattr(item, "computation_type", None)
    if isinstance(stage, int) and kind is not None:
        name = getattr(kind, "name", str(kind))
        ours = _TORCH_KINDS.get(name) or Kind.__members__.get(name)
        microbatch = getattr(item, "microbatch_index", None)
        if ours is None or not isinstance(microbatch, int):
            raise ValueError(f"{where}: torch's action {item!r} ({name}) has no counterpart here: write the compute "
                             f"actions F, B, I and W (the sends and receives are derived from them; a stage's "
                             f"sharding is its own module's)")
        return Action(stage, ours, microbatch)
    raise TypeError(f"{where}: an action is an Action or its string form such as '1F3', got "
                    f"{type(item).__name__} {item!r}")


def parse_orders(orders: Mapping[int, Iterable[Optional[ActionLike]]], compute_only: bool = False) -> RankOrders:
    """``{rank: [actions]}`` as Actions; ``None`` entries (idle steps, as torch writes them) are dropped, torch's
    overlapped pair of actions read as its two actions, and, with ``compute_only``, the sends and receives dropped
    (they are derived from the compute actions).

    Raises:
        TypeError, ValueError: a rank is not an int, or an action cannot be read.
    """
    if not isinstance(orders, Mapping):
        raise TypeError(f"actions must map each rank to its list of actions, e.g. {{0: ['0F0', '0B0']}}, got "
                        f"{type(orders).__name__}")
    parsed: RankOrders = {}
    for rank, items in orders.items():
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"actions: the keys are ranks (ints), got {rank!r}")
        if isinstance(items, str):
            items = items.split()
        actions = []
        for k, item in enumerate(items):
            for part in getattr(item, "sub_actions", None) or [item]:
                if part is not None:
                    actions.append(as_action(part, f"actions[{rank}][{k}]"))
        parsed[rank] = [a for a in actions if a.is_compute or not compute_only]
    return parsed


def format_orders(orders: Mapping[int, Sequence[Optional[object]]], title: str = "") -> str:
    """Ranks side by side: a column per rank, a row per step, an empty cell for an idle step."""
    ranks = sorted(orders)
    steps = max((len(orders[r]) for r in ranks), default=0)
    digits = len(str(max(steps - 1, 0)))
    label_width = len("step ") + digits
    cells = [[str(orders[r][k]) if k < len(orders[r]) and orders[r][k] is not None else "" for r in ranks]
             for k in range(steps)]
    widths = [max([len(f"rank {r}")] + [len(row[c]) for row in cells]) for c, r in enumerate(ranks)]
    lines = [title] if title else []
    lines.append(" " * (label_width + 2) + "  ".join(f"{'rank ' + str(r):<{w}}" for r, w in zip(ranks, widths)))
    for k, row in enumerate(cells):
        lines.append(f"step {k:>{digits}}: " + "  ".join(f"{c:<{w}}" for c, w in zip(row, widths)))
    return "\n".join(line.rstrip() for line in lines)
