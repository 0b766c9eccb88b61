"""From the compute actions of every rank to the messages between them, checked complete first.

A stage's forward output goes to the next stage and, in training, the gradient of that
output comes back: one *message* each, from the producing action to the consuming one
(``0F2 -> 1F2``, ``1B2 -> 0B2``; with a skip connection, ``0F2 -> 3F2`` too). Where both
stages live on one rank the value is handed over in memory; otherwise the message goes
over the *channel* from the producing rank to the consuming one. A channel carries its
messages in the order the producing rank makes them, and both ends know that order from
the configuration, so the sender's and the receiver's sequences always agree.

Before any message is derived every stage's work is checked complete: each ``(stage,
microbatch)`` has one forward and, in training, one backward (``B``, or ``I`` then
``W``) after it, on the rank that holds the stage. A missing or repeated action is an
error naming the rank, the stage, the microbatch and the fix. A value handed over in
memory must be made before the action that takes it, on its one rank (else that rank
would wait for itself: ``ScheduleHangError``); what waits across ranks is ``check.py``'s
to prove.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, NamedTuple, Sequence, Tuple

from .actions import BACKWARD_KINDS, BWD, FWD, BWD_I, BWD_W, Action, Kind, RankOrders
from .errors import ScheduleHangError
from .placement import LOOP, Placement, rank_of, rule

__all__: List[str] = []

Skip = Tuple[int, int]  # (from stage, to stage): the later stage also receives the earlier one's forward output


class Message(NamedTuple):
    """One value from one stage's action to another's: activations (``F``) or their gradient (``B``)."""

    kind: str  # "F" (activations, to a later stage) or "B" (the gradient of those, back)
    src_stage: int
    dst_stage: int
    microbatch: int
    src_rank: int
    dst_rank: int
    producer: Action
    consumer: Action

    @property
    def skip(self) -> bool:
        """Whether it travels over a skip connection (stages not adjacent)."""
        return abs(self.dst_stage - self.src_stage) != 1

    @property
    def send_name(self) -> str:
        """The send action's name: ``0SEND_F2`` (``0SEND_F2@3`` over a skip connection to stage 3)."""
        kind = Kind.SEND_F if self.kind == "F" else Kind.SEND_B
        return str(Action(self.src_stage, kind, self.microbatch)) + (f"@{self.dst_stage}" if self.skip else "")

    @property
    def recv_name(self) -> str:
        """The receive action's name: ``1RECV_F2`` (``3RECV_F2@0`` over a skip connection from stage 0)."""
        kind = Kind.RECV_F if self.kind == "F" else Kind.RECV_B
        return str(Action(self.dst_stage, kind, self.microbatch)) + (f"@{self.src_stage}" if self.skip else "")

    def describe(self) -> str:
        what = "activations" if self.kind == "F" else "input gradient"
        return (f"the {what} of stage {self.src_stage}, microbatch {self.microbatch}, for stage {self.dst_stage} "
                f"(rank {self.src_rank} -> rank {self.dst_rank})")


@dataclass
class RankWork:
    """What one rank does in a step: its compute actions, and the messages it sends and receives."""

    rank: int
    compute: List[Action]
    sends: Dict[int, List[Message]] = field(default_factory=dict)  # peer -> messages in channel order
    recvs: Dict[int, List[Message]] = field(default_factory=dict)  # peer -> messages in channel order
    local: List[Message] = field(default_factory=list)  # handed over in memory (both stages on this rank)
    peers: List[int] = field(default_factory=list)  # every rank it exchanges messages with, either way


@dataclass
class PipelineWork:
    """Every rank's work: what every rank knows about the whole pipeline from the configuration."""

    num_ranks: int
    num_stages: int
    n_microbatches: int
    backward: bool
    ranks: Dict[int, RankWork]
    skips: Tuple[Skip, ...] = ()
    placement: Placement = LOOP  # placement.py

    def rank_of(self, stage: int) -> int:
        return rank_of(stage, self.num_ranks, self.placement)


def derive(orders: RankOrders, num_ranks: int, num_stages: int, n_microbatches: int, backward: bool,
           skips: Sequence[Skip] = (), placement: Placement = LOOP) -> PipelineWork:
    """Check every stage's work complete, then derive each rank's messages (see the module docstring).

    Raises:
        ValueError: an action on the wrong rank, out of range, missing, repeated or out of order.
    """
    _check_complete(orders, num_ranks, num_stages, n_microbatches, backward, placement)
    position = {(rank, action): k for rank, actions in orders.items() for k, action in enumerate(actions)}
    finder = _Finder(orders)
    messages: List[Message] = []
    for stage in range(num_stages):
        targets = ([stage + 1] if stage + 1 < num_stages else []) + sorted(t for s, t in skips if s == stage)
        for dst in targets:
            for m in range(n_microbatches):
                messages.append(_message("F", stage, dst, m, num_ranks, finder, placement))
                if backward:
                    messages.append(_message("B", dst, stage, m, num_ranks, finder, placement))
    ranks = {rank: RankWork(rank, list(actions)) for rank, actions in orders.items()}
    for rank in range(num_ranks):
        ranks.setdefault(rank, RankWork(rank, []))
    for msg in messages:
        if msg.src_rank == msg.dst_rank:
            _check_handed_over(msg, position)
            ranks[msg.src_rank].local.append(msg)
            continue
        ranks[msg.src_rank].sends.setdefault(msg.dst_rank, []).append(msg)
        ranks[msg.dst_rank].recvs.setdefault(msg.src_rank, []).append(msg)
    for work in ranks.values():
        for channel in list(work.sends.values()) + list(work.recvs.values()):
            # the producing rank's order; two messages of one action: by the consumer's stage
            channel.sort(key=lambda msg: (position[(msg.src_rank, msg.producer)], msg.dst_stage))
        work.peers = sorted(set(work.sends) | set(work.recvs))
    return PipelineWork(num_ranks, num_stages, n_microbatches, backward, ranks, tuple(skips), placement)


def _check_handed_over(msg: Message, position: Mapping[Tuple[int, Action], int]) -> None:
    """A value handed over in memory (both stages on one rank) is made before the action that takes it.

    Raises:
        ScheduleHangError: the rank runs the consumer first: it would wait for its own later action.
    """
    rank = msg.src_rank
    made, taken = position[(rank, msg.producer)], position[(rank, msg.consumer)]
    if taken < made:
        what = "activations" if msg.kind == "F" else "input gradient"
        raise ScheduleHangError(
            f"the schedule would hang: rank {rank} runs {msg.consumer} (step {taken}) before {msg.producer} (step "
            f"{made}), which makes the {what} it takes (stages {msg.src_stage} and {msg.dst_stage} both live on rank "
            f"{rank}, which hands them over in memory): move {msg.consumer} after {msg.producer}",
            [(rank, str(msg.consumer)), (rank, str(msg.producer))])


class _Finder:
    """Which action produces or consumes a stage's value for a microbatch (B, or I where the backward is split)."""

    def __init__(self, orders: RankOrders) -> None:
        self.kinds: Dict[Tuple[int, int], Kind] = {}
        for actions in orders.values():
            for action in actions:
                if action.kind in (BWD, BWD_I):
                    self.kinds[(action.stage, action.microbatch)] = action.kind

    def backward(self, stage: int, microbatch: int) -> Action:
        return Action(stage, self.kinds.get((stage, microbatch), BWD), microbatch)


def _message(kind: str, src: int, dst: int, m: int, num_ranks: int, finder: _Finder,
             placement: Placement) -> Message:
    if kind == "F":
        producer, consumer = Action(src, FWD, m), Action(dst, FWD, m)
    else:
        producer, consumer = finder.backward(src, m), finder.backward(dst, m)
    return Message(kind, src, dst, m, rank_of(src, num_ranks, placement), rank_of(dst, num_ranks, placement), producer,
                   consumer)


def _check_complete(orders: RankOrders, num_ranks: int, num_stages: int, n_microbatches: int, backward: bool,
                    placement: Placement) -> None:
    seen: Dict[Tuple[int, Kind, int], int] = {}
    for rank in sorted(orders):
        if not 0 <= rank < num_ranks:
            raise ValueError(f"actions: rank {rank} is not in the pipeline's ranks 0..{num_ranks - 1}")
        for k, action in enumerate(orders[rank]):
            _check_action(rank, k, action, num_ranks, num_stages, n_microbatches, backward, placement)
            key = (action.stage, action.kind, action.microbatch)
            if key in seen:
                raise ValueError(f"actions: rank {rank} runs {action} twice (steps {seen[key]} and {k}); each stage "
                                 f"runs each action once per microbatch: remove one")
            seen[key] = k
            if action.kind in BACKWARD_KINDS and (action.stage, FWD, action.microbatch) not in seen:
                raise ValueError(f"actions: rank {rank} runs {action} (step {k}) before "
                                 f"{Action(action.stage, FWD, action.microbatch)}; a backward needs its forward: "
                                 f"move it after the forward")
            if action.kind is BWD_W and (action.stage, BWD_I, action.microbatch) not in seen:
                raise ValueError(f"actions: rank {rank} runs {action} (step {k}) before "
                                 f"{Action(action.stage, BWD_I, action.microbatch)}; the weight gradient (W) needs the "
                                 f"input gradient (I) first: move it after the I")
    for stage in range(num_stages):
        rank = rank_of(stage, num_ranks, placement)
        for m in range(n_microbatches):
            needed = [FWD]
            if backward:
                split = (stage, BWD_I, m) in seen or (stage, BWD_W, m) in seen
                needed += [BWD_I, BWD_W] if split else [BWD]
                if split and (stage, BWD, m) in seen:
                    raise ValueError(f"actions: rank {rank} runs {Action(stage, BWD, m)} and also splits it into I and "
                                     f"W; run either B, or I and W, once")
            missing = [str(Action(stage, kind, m)) for kind in needed if (stage, kind, m) not in seen]
            if missing:
                raise ValueError(f"actions: rank {rank} never runs {', '.join(missing)} (stage {stage}, microbatch "
                                 f"{m}); every stage runs a forward{' and a backward' if backward else ''} of every "
                                 f"microbatch: add {' and '.join(missing)} to rank {rank}'s list")


def _check_action(rank: int, k: int, action: Action, num_ranks: int, num_stages: int, n_microbatches: int,
                  backward: bool, placement: Placement) -> None:
    where = f"actions: rank {rank}, step {k}: {action}"
    if not action.is_compute:
        raise ValueError(f"{where} is a communication action; list only compute actions (F, B, I, W): the sends "
                         f"and receives are derived from them")
    if not 0 <= action.stage < num_stages:
        raise ValueError(f"{where} names stage {action.stage}; the stages are 0..{num_stages - 1}")
    home = rank_of(action.stage, num_ranks, placement)
    if home != rank:
        raise ValueError(f"{where} belongs to stage {action.stage}, which lives on rank {home} "
                         f"({rule(num_ranks, placement)}): move it to rank {home}'s list")
    if not 0 <= action.microbatch < n_microbatches:
        raise ValueError(f"{where} names microbatch {action.microbatch}; the microbatches are 0..{n_microbatches - 1}")
    if not backward and action.kind is not FWD:
        raise ValueError(f"{where} is a backward, but the schedule has no loss_fn (forward only): give loss_fn or "
                         f"list only forwards")


def messages_of(work: PipelineWork, rank: int) -> Mapping[str, Message]:
    """Every message a rank sends or receives, by its send and its receive names (for error messages)."""
    found: Dict[str, Message] = {}
    mine = work.ranks[rank]
    for channel in list(mine.sends.values()) + list(mine.recvs.values()):
        for msg in channel:
            found[msg.send_name] = msg
            found[msg.recv_name] = msg
    return found
