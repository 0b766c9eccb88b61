"""One rank's step as units on thread groups: what its plan runs and what the cross-rank check proves.

A rank runs its step on one thread, the caller's, as one FIFO of units::

    compute      the rank's compute actions in its schedule's order, each preceded by the receives of
                 what it needs and followed by the sends of what it made, a HELLO to each peer first,
                 the peer's HELLO just before the first receive from it, the DONEs last:
                 HELLO0>1 0F0 0SEND_F0 0F1 0SEND_F1 HELLO1>0 0RECV_B0 0B0 ... DONE0>1 DONE1>0

Every receive of the step is posted when the step starts (``transport.py``), so a message
lands in its buffer whenever it arrives, while the rank computes; the receive *unit* only
takes it, just before the action that needs it, on a stream of its own (``recv{q}``). A send
only posts its message and never blocks, so it runs as soon as its value exists, on a stream
of its own (``send{q}``): on a GPU both overlap the compute. No other thread takes part, so no
hand-off between threads is paid per message, and none is started per step.

A unit also waits for its dependencies on the same rank: a forward for the receive of
its input (or, where the previous stage is on this rank, for that stage's forward), a
backward for its forward and the receive of its output's gradient, ``W`` for its ``I``, a
send for the action that made its value. Each rank's first message on a channel is a
``HELLO``, sent as its step starts, saying what the rank runs; it is taken, and compared with
what this rank runs, just before the first receive from that peer, so nothing a peer running
another schedule sent is ever used. Its last is a ``DONE``, sent once the rank's whole step is
done but its own DONE receives, which come last: a rank whose step returns knows that each rank
it talks to finished too. A rank that never starts its step is found out by the first receive
that waits for it (``timeout`` seconds for its HELLO); the watchdog (``watchdog.py``) then tells
every rank. A rank that fails sends its error in place of the next message instead
(``transport.py``).

Across ranks a receive waits for its send (a send never waits: it is posted). ``plan_of_rank.py``
turns the units into the rank's ``PipelinePlan``; ``check.py`` proves all ranks' units together.
The same lists serve both, so the check proves what runs.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

from .actions import BACKWARD_KINDS, BWD, FWD, BWD_I, BWD_W, Action
from .comms import Message, PipelineWork

__all__: List[str] = []

COMPUTE = "compute"
ChannelKey = Tuple[int, int, int]  # (sending rank, receiving rank, position on that channel)


def send_stream(peer: int) -> str:
    return f"send{peer}"


def recv_stream(peer: int) -> str:
    return f"recv{peer}"


class Unit(NamedTuple):
    """One unit of a rank's step (a task of its plan)."""

    name: str
    group: str
    stream: str
    deps: Tuple[str, ...]  # units of the same rank it waits for (besides the one before it in its group)
    action: Optional[Action] = None  # a compute unit's action
    message: Optional[Message] = None  # a send's or receive's message (None for DONE)
    channel: Optional[ChannelKey] = None  # a send's or receive's place: its partner has the same key
    peer: int = -1  # the rank at the other end (sends and receives)
    marker: str = ""  # "hello" or "done" for the first and last message of a channel
    role: str = "compute"  # "compute", "send" or "recv"


RankUnits = Dict[str, List[Unit]]  # thread group -> its units, in order


def done_name(src: int, dst: int) -> str:
    return f"DONE{src}>{dst}"


def hello_name(src: int, dst: int) -> str:
    return f"HELLO{src}>{dst}"


def units_of_rank(work: PipelineWork, rank: int) -> RankUnits:
    """The rank's units per thread group, in the order each group runs them (see the module docstring)."""
    mine = work.ranks[rank]
    received: Dict[Action, List[str]] = {}
    for channel in mine.recvs.values():
        for msg in channel:
            received.setdefault(msg.consumer, []).append(msg.recv_name)
    local: Dict[Action, List[str]] = {}
    for msg in mine.local:
        local.setdefault(msg.consumer, []).append(str(msg.producer))
    sends: Dict[str, List[Unit]] = {}  # producer -> the sends of what it made, in channel order
    for peer in mine.peers:  # message k of a channel is its (k + 1)th: the HELLO comes first
        for k, msg in enumerate(mine.sends.get(peer, [])):
            sends.setdefault(str(msg.producer), []).append(
                Unit(msg.send_name, COMPUTE, send_stream(peer), (str(msg.producer),), message=msg,
                     channel=(rank, peer, k + 1), peer=peer, role="send"))
    compute = [Unit(hello_name(rank, peer), COMPUTE, send_stream(peer), (), channel=(rank, peer, 0), peer=peer,
                    marker="hello", role="send") for peer in mine.peers]
    recvs: Dict[Action, List[Unit]] = {}  # consumer -> the receives of what it needs
    for peer in mine.peers:
        for k, msg in enumerate(mine.recvs.get(peer, [])):
            recvs.setdefault(msg.consumer, []).append(
                Unit(msg.recv_name, COMPUTE, recv_stream(peer), (), message=msg, channel=(peer, rank, k + 1), peer=peer,
                     role="recv"))
    for action in mine.compute:
        compute += sorted(recvs.get(action, []), key=lambda u: (u.peer, u.channel))
        compute.append(Unit(str(action), COMPUTE, COMPUTE, _compute_deps(action, received, local), action=action))
        compute += sorted(sends.get(str(action), []), key=lambda u: (u.peer, u.channel))
    hellos = {peer: Unit(hello_name(peer, rank), COMPUTE, recv_stream(peer), (), channel=(peer, rank, 0), peer=peer,
                         marker="hello", role="recv") for peer in mine.peers}
    ordered: List[Unit] = []
    for unit in compute:  # a peer's HELLO is taken just before the first receive from it
        if unit.role == "recv" and unit.peer in hellos:
            ordered.append(hellos.pop(unit.peer))
        ordered.append(unit)
    ordered += hellos.values()  # the peers this rank receives nothing from but their HELLO and DONE
    for peer in mine.peers:
        sent = len(mine.sends.get(peer, [])) + 1
        ordered.append(Unit(done_name(rank, peer), COMPUTE, send_stream(peer), (), channel=(rank, peer, sent),
                            peer=peer, marker="done", role="send"))
    for peer in mine.peers:
        got = len(work.ranks[peer].sends.get(rank, [])) + 1
        ordered.append(Unit(done_name(peer, rank), COMPUTE, recv_stream(peer), (), channel=(peer, rank, got),
                            peer=peer, marker="done", role="recv"))
    return {COMPUTE: ordered}


def _compute_deps(action: Action, received: Dict[Action, List[str]],
                  local: Dict[Action, List[str]]) -> Tuple[str, ...]:
    deps: List[str] = []
    if action.kind in BACKWARD_KINDS:
        deps.append(str(Action(action.stage, FWD, action.microbatch)))
    if action.kind is BWD_W:
        deps.append(str(Action(action.stage, BWD_I, action.microbatch)))
    if action.kind in (FWD, BWD, BWD_I):
        deps += received.get(action, []) + local.get(action, [])
    return tuple(deps)
