"""Messages between ranks over ``torch.distributed`` point-to-point operations, and failures sent in their place.

A message is one buffer (``wire.py``). Message ``k`` of the channel from rank ``a`` to rank
``b`` uses the tags ``TAG_BASE + k * PARTS + part``, so a receive only ever matches the
message it is meant for. The parts::

    FAST      the message, in the layout it had last step: the receiver posted a buffer of that size
              at the start of the step, so it lands there directly
    ANNOUNCE  a header alone: a HELLO or DONE, a failure, or the layout of a message that is new or
              changed shape (the receiver cannot know its size; after a FAST filler saying CHANGED)
    SLOW      the message after its ANNOUNCE

So a step whose shapes are those of the step before sends every message once, into a
buffer posted before it arrived; only the first step (and a change of shape) pays a second
round trip.

Failures. When a rank's step fails (a task raised, a message said another rank failed,
a receive timed out), ``fail`` sends the failure on every channel in place of every message
not sent yet (the peer may wait for any of them: its receives are taken where they are
needed) and sends nothing more in this step. A failure is one message, its text inside the
header (``wire.py``), sent with the tag of the message it replaces: where the receiver has
posted that receive already, it lands at once, so a rank that fails and exits straight away
has still told its peers (when the text came as a second message, a peer that had the header
waited for a text that never came, its sender gone). Whoever waits for that message gets the
failure, fails in turn and passes it on, so the first failure reaches every rank that
waits, directly or through others, for the rank it happened on, and each of them raises
``PipelineRankError`` naming that rank, stage, microbatch and the original exception.
Sends are only posted (``isend``); their completion is awaited at the end of a
successful step, after every peer's ``DONE`` showed it received everything but our
``DONE``, which it receives next. A send's handle is kept until it completes: dropping a
pending send cancels it.

Silence. A rank waits ``timeout`` seconds for a peer's ``HELLO`` (the peer never started
its step) and twice that for any later message (it started, then stopped sending: it may
itself be waiting for a silent rank, whose neighbours report it first). When a deadline
passes, the watchdog (``watchdog.py``) sends the failure, naming the silent rank, to every
rank while the connections still work, and the receive fails a little later.
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import threading
import time
from typing import Any, Dict, List, Mapping, NamedTuple, NoReturn, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ..errors import PipelineAborted
from .errors import PipelineRankError, RankTimeoutError, ScheduleMismatchError
from .watchdog import Watchdog
from .wire import (CHANGED, DATA, FAILED, FAILURE_BYTES, HEADER_BYTES, HELLO, Layout, Payload, failure_marker,
                   failure_text, hello_marker, hello_text, layout_from, layout_of, marker, pack, packed_size,
                   read_header, unpack)

__all__: List[str] = []

logger = logging.getLogger("swpipeline.pp")

PARTS = 3
FAST, ANNOUNCE, SLOW = 0, 1, 2
GRACE_S = 3.0  # how long a receive outlives its deadline (the failure is being sent meanwhile)
TAG_BASE = 1 << 20  # our tags start here: other users of the group (torch's own schedules use 0) never meet them


class Failure(NamedTuple):
    """The first failure of a step, as every rank reports it."""

    rank: int
    stage: Optional[int]
    microbatch: Optional[int]
    action: Optional[str]
    error: str  # "ValueError: ..."; for a silent rank, who waited for what
    silent: bool = False  # the rank never answered (a timeout), rather than raised

    def where(self) -> str:
        if self.action is None:
            return f"rank {self.rank}"
        return f"rank {self.rank} (stage {self.stage}, microbatch {self.microbatch}, action {self.action})"

    def encode(self, limit: int = FAILURE_BYTES) -> bytes:
        """As JSON of at most ``limit`` bytes (the error's text cut short to fit)."""
        error = self.error
        while True:
            data = json.dumps(self._replace(error=error)._asdict()).encode()
            if len(data) <= limit or not error:
                return data
            error = error[:max(len(error) - (len(data) - limit) - 3, 0)] + "..." if len(error) > 3 else ""

    @classmethod
    def decode(cls, data: bytes) -> "Failure":
        return cls(**json.loads(data.decode()))

    def error_for(self, me: int) -> PipelineRankError:
        """The error this rank raises for the failure."""
        kind = RankTimeoutError if self.silent else PipelineRankError
        if self.silent:
            text = (f"rank {self.rank} never answered: {self.error}; rank {me} stopped its step because of it (rank "
                    f"{self.rank} is stuck, much slower, or gone; raise the schedule's timeout= if it is only slow)")
        else:
            text = (f"{self.where()} failed with {self.error}; rank {me} stopped its step because of it (the failing "
                    f"rank's own error and traceback say more)")
        return kind(text, rank=self.rank, stage=self.stage, microbatch=self.microbatch, action=self.action,
                    error=self.error)


def describe_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 2000 else text[:1997] + "..."


def tag(index: int, part: int) -> int:
    """The tag of one part of message ``index`` (see the module docstring)."""
    return TAG_BASE + index * PARTS + part


_DIRECTIONS: Dict[Any, Tuple[Any, Any]] = {}  # a pipeline's process group -> its (up, down) groups
# Let go of them as the interpreter starts to exit, as torch.distributed's own registry does with
# destroy_process_group(): held here until the interpreter's last teardown, about one exit in 12 of a
# process that had destroyed its process groups aborted there ("terminate called without an active
# exception", 4 of 50 runs; 0 of 90 with them let go first).
atexit.register(_DIRECTIONS.clear)


def direction_groups(group: Any) -> Tuple[Any, Any]:
    """Two process groups over the ranks of ``group``: one carries the messages to higher ranks, the other those to
    lower ranks, so that every connection carries messages one way only.

    On gloo, two ranks sending each other a message at the same moment over one connection each
    wait, now and then, milliseconds for the other; one way per connection, they never do (about
    one send in 20 stalled over a millisecond in a test of 1,000 crossing messages; none after).
    Made once per pipeline group, by its ranks only (every rank builds its schedules in one order),
    and kept until the interpreter exits.
    """
    key = group if group is not None else dist.group.WORLD
    if key not in _DIRECTIONS:
        ranks = dist.get_process_group_ranks(key)
        _DIRECTIONS[key] = (dist.new_group(ranks, use_local_synchronization=True),
                            dist.new_group(ranks, use_local_synchronization=True))
    return _DIRECTIONS[key]


class Config(NamedTuple):
    """What a rank runs, as its HELLOs say it: a fingerprint of the whole configuration, and that in words."""

    fingerprint: int  # nonzero
    text: str


class _Outbox:
    """The sending end of one channel in one step: how many messages it carries, the next one's position, and
    whether it is closed."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.next_index = 0
        self.closed = False


class Transport:
    """One rank's point-to-point messages in one process group (see the module docstring).

    Args:
        group: the process group (None: the default one); ranks are ranks in it.
        rank: this rank in ``group``.
        device: where message buffers live (the stage's device on NCCL, the CPU on gloo).
        timeout: seconds to wait for a peer's HELLO (twice that for a later message) before failing.
    """

    def __init__(self, group: Any, rank: int, device: torch.device, timeout: float) -> None:
        self.group = group
        self._up, self._down = direction_groups(group)
        self.rank = rank
        self.device = device
        self.timeout_s = timeout
        self._lock = threading.Lock()
        self._outboxes: Dict[int, _Outbox] = {}
        self._works: List[Tuple[Any, torch.Tensor, int]] = []  # posted sends, awaited at the end of the step
        self._abandoned: List[Any] = []  # handles of failed steps: never awaited, never dropped (see the docstring)
        self._sent: Dict[Tuple[Any, int, int], Layout] = {}  # (mode, peer, index) -> layout sent last time
        self._got: Dict[Tuple[Any, int, int], Layout] = {}  # (mode, peer, index) -> layout received last time
        self._posted: Dict[Tuple[int, int], Tuple[Any, torch.Tensor]] = {}  # (peer, index) -> receive posted early
        self._headers: Dict[Tuple[int, int], Tuple[Any, torch.Tensor]] = {}  # ... of a HELLO or DONE (its header)
        self._mode: Any = None
        self._watchdog = Watchdog(f"swpipeline-pp-watchdog-rank{rank}")
        self.failure: Optional[Failure] = None
        self._config: Optional[Config] = None  # what this rank runs in the current step (start_step)
        self._hello = marker(HELLO)  # the HELLO that says it

    # -- the step's life cycle ------------------------------------------------------------------

    def start_step(self, channels: Mapping[int, int], mode: Any, config: Optional[Config] = None,
                   markers: Sequence[Tuple[int, int]] = ()) -> None:
        """A new step of kind ``mode`` (its messages' layouts are remembered per kind), sending ``channels[q]``
        messages to each peer ``q``: post every receive whose layout is known from the last step of that kind,
        and the receive of each ``(peer, index)`` in ``markers`` (the peers' HELLOs and DONEs: a message whose
        receive is posted after it came pays a round trip of gloo's more, milliseconds at a step's end).
        ``config``: what this rank runs, said in its HELLOs and compared with each peer's."""
        with self._lock:
            if config != self._config:  # the HELLO saying it, made once (read only: posted to every peer)
                self._hello = marker(HELLO) if config is None else hello_marker(config.fingerprint,
                                                                                 config.text.encode())
            self._config = config
            self._outboxes = {peer: _Outbox(count) for peer, count in channels.items()}
            self._abandoned += self._works + list(self._posted.values()) + list(self._headers.values())
            self._works, self._posted, self._headers, self._mode = [], {}, {}, mode
            self.failure = None
            for (kind, peer, index), layout in self._got.items():
                if kind == mode:
                    buffer = torch.empty(packed_size(layout), dtype=torch.uint8, device=self.device)
                    work = self._irecv(buffer, peer, tag(index, FAST))
                    self._posted[(peer, index)] = (work, buffer)
            for peer, index in markers:
                header = torch.empty(HEADER_BYTES, dtype=torch.uint8, device=self.device)
                self._headers[(peer, index)] = (self._irecv(header, peer, tag(index, ANNOUNCE)), header)

    def finish_step(self) -> None:
        """Wait for every send posted in the step: each peer's DONE showed it received all but our DONE, which it
        takes last."""
        for work, _, peer in self._works:
            self._wait(work, peer, f"rank {peer} to take this rank's end of step", None)
        self._works = []

    # -- sending ----------------------------------------------------------------------------------

    def send(self, peer: int, index: int, tensors: Payload) -> None:
        """Post message ``index`` of the channel to ``peer`` (nothing, once the step failed)."""
        layout = layout_of(tensors)
        key = (self._mode, peer, index)
        with self._lock:
            box = self._outboxes[peer]
            if box.closed:
                return
            expected = self._sent.get(key)
            if expected == layout:
                self._post(pack(tensors, layout, self.device), peer, tag(index, FAST))
            else:
                if expected is not None:  # the receiver waits for the old layout's size: tell it what changed
                    self._post(marker(CHANGED, size=packed_size(expected)), peer, tag(index, FAST))
                self._post(pack((), layout, self.device)[:HEADER_BYTES].clone(), peer, tag(index, ANNOUNCE))
                self._post(pack(tensors, layout, self.device), peer, tag(index, SLOW))
                self._sent[key] = layout
            box.next_index = index + 1

    def send_marker(self, peer: int, index: int, status: int) -> None:
        """Post a HELLO (with what this rank runs) or a DONE as message ``index`` of the channel to ``peer``."""
        with self._lock:
            box = self._outboxes[peer]
            if not box.closed:
                self._post(self._hello if status == HELLO else marker(status), peer, tag(index, ANNOUNCE))
                box.next_index = index + 1

    def fail(self, failure: Failure) -> Failure:
        """Send the step's first failure on every open channel in place of every message not sent yet; returns the
        first one.

        Nothing more is sent in this step. Called again (a later failure), it only returns the first.
        """
        with self._lock:
            if self.failure is not None:
                return self.failure
            self.failure = failure
            text = failure.encode()
            for peer, box in self._outboxes.items():
                if box.closed:
                    continue
                box.closed = True
                try:
                    for index in range(box.next_index, box.count):
                        self._post_failure(peer, index, text)
                except Exception as exc:  # a peer already gone: the others must still hear of it
                    logger.warning("swpipeline.pp: could not tell rank %s of the failure: %s", peer, exc)
            return failure

    def _post_failure(self, peer: int, index: int, text: bytes) -> None:
        """The failure as message ``index``, where the receiver waits for it: in a buffer of the layout it expects,
        or as a header. Called under the lock."""
        expected = self._sent.get((self._mode, peer, index))
        if expected is not None:
            self._post(failure_marker(text, packed_size(expected)), peer, tag(index, FAST))
        else:
            self._post(failure_marker(text), peer, tag(index, ANNOUNCE))

    def one_way_ms(self, peer: int, trips: int = 20) -> float:
        """Half the median round trip of a small message to ``peer`` and back (``peer`` runs it too)."""
        probe = torch.zeros(HEADER_BYTES // 8, dtype=torch.int64, device=self.device)
        trips_ms: List[float] = []
        for _ in range(trips):
            start = time.perf_counter()
            if self.rank < peer:
                dist.send(probe, group=self._to(peer), group_dst=peer, tag=TAG_BASE - 1)
                dist.recv(probe, group=self._from(peer), group_src=peer, tag=TAG_BASE - 1)
            else:
                dist.recv(probe, group=self._from(peer), group_src=peer, tag=TAG_BASE - 1)
                dist.send(probe, group=self._to(peer), group_dst=peer, tag=TAG_BASE - 1)
            trips_ms.append((time.perf_counter() - start) * 1e3)
        return sorted(trips_ms)[len(trips_ms) // 2] / 2

    def _from(self, peer: int) -> Any:
        return self._down if peer > self.rank else self._up

    def _to(self, peer: int) -> Any:
        """The process group of messages from this rank to ``peer`` (one per direction: see direction_groups)."""
        return self._up if peer > self.rank else self._down

    def _irecv(self, buffer: torch.Tensor, peer: int, message_tag: int) -> Any:
        return dist.irecv(buffer, group=self._from(peer), group_src=peer, tag=message_tag)

    def _post(self, tensor: torch.Tensor, peer: int, message_tag: int) -> None:
        """Post one send; its handle is kept (dropping a pending send cancels it). Called under the lock."""
        tensor = tensor.to(self.device)
        try:
            work = dist.isend(tensor, group=self._to(peer), group_dst=peer, tag=message_tag)
        except RuntimeError as exc:  # the connection is closed: the peer exited (not this rank's own failure)
            raise self._lost(peer, "sending to it", exc) from None
        self._works.append((work, tensor, peer))

    # -- receiving --------------------------------------------------------------------------------

    def recv(self, peer: int, index: int, what: str) -> Payload:
        """Message ``index`` of the channel from ``peer``; ``what`` describes it for errors.

        Raises:
            PipelineRankError: the peer sent its step's failure instead, or closed the connection.
            RankTimeoutError: nothing came in time (see the module docstring).
        """
        key = (self._mode, peer, index)
        expected = self._got.get(key)
        if expected is not None:
            with self._lock:
                posted = self._posted.pop((peer, index), None)
            if posted is None:
                buffer = torch.empty(packed_size(expected), dtype=torch.uint8, device=self.device)
                posted = (self._irecv(buffer, peer, tag(index, FAST)), buffer)
            work, buffer = posted
            self._wait(work, peer, what, 2 * self.timeout_s)
            values = read_header(buffer)
            if values[0] == DATA:
                return unpack(buffer, expected)
            if values[0] == FAILED:
                self._raise_failure(buffer)
            if values[0] != CHANGED:
                raise self._protocol_error(peer, what, values[0])
        values = self._receive_header(peer, index, what, None if expected is not None else 2 * self.timeout_s)[0]
        if values[0] != DATA:
            raise self._protocol_error(peer, what, values[0])
        layout = layout_from(values)
        buffer = torch.empty(packed_size(layout), dtype=torch.uint8, device=self.device)
        self._wait(self._irecv(buffer, peer, tag(index, SLOW)), peer, what, None)
        self._got[key] = layout
        return unpack(buffer, layout)

    def recv_marker(self, peer: int, index: int, status: int) -> None:
        """Wait for the peer's HELLO (its step started) or DONE (it is over), or its failure."""
        what = f"rank {peer}'s {'start' if status == HELLO else 'end'} of step"
        seconds = self.timeout_s if status == HELLO else 2 * self.timeout_s
        values, header = self._receive_header(peer, index, what, seconds)
        if values[0] != status:
            raise self._protocol_error(peer, what, values[0])
        config = self._config
        if status == HELLO and config is not None and values[1] and values[1] != config.fingerprint:
            raise ScheduleMismatchError(
                f"rank {peer} runs {hello_text(header)}; rank {self.rank} runs {config.text}: every rank of a "
                f"pipeline must build the same schedule (its class, n_microbatches, stages, placement, skips and "
                f"scale_grads) and call the same step() or eval()")

    def _receive_header(self, peer: int, index: int, what: str,
                        seconds: Optional[float]) -> Tuple[List[int], torch.Tensor]:
        with self._lock:
            posted = self._headers.pop((peer, index), None)
        if posted is None:
            header = torch.empty(HEADER_BYTES, dtype=torch.uint8, device=self.device)
            posted = (self._irecv(header, peer, tag(index, ANNOUNCE)), header)
        work, header = posted
        self._wait(work, peer, what, seconds)
        values = read_header(header)
        if values[0] == FAILED:
            self._raise_failure(header)
        return values, header

    def _raise_failure(self, buffer: torch.Tensor) -> NoReturn:
        """Raise the failure that ``buffer`` (a failure message) carries."""
        if self.failure is not None:  # this rank failed already: the failure coming back, nothing new
            raise PipelineAborted("the step failed")
        raise Failure.decode(failure_text(buffer)).error_for(self.rank)

    def _wait(self, work: Any, peer: int, what: str, seconds: Optional[float]) -> None:
        """Wait for a receive; with ``seconds``, report the peer as silent once they pass (see the module docstring)."""
        limit = 2 * self.timeout_s if seconds is None else seconds
        silent = Failure(peer, None, None, None, f"rank {self.rank} waited {limit:g} s for {what} and rank {peer} "
                                                 f"never sent it", silent=True)
        token = None
        if seconds is not None:
            token = self._watchdog.watch(limit, lambda: self._report_silent(silent))
        try:
            work.wait(datetime.timedelta(seconds=limit + GRACE_S))
        except RuntimeError as exc:
            if self.failure is silent or "timed out" in str(exc).lower() or "timeout" in str(exc).lower():
                raise self.fail(silent).error_for(self.rank) from None
            raise self._lost(peer, f"waiting for {what}", exc) from None
        finally:
            if token is not None:
                self._watchdog.done(token)
        if self.failure is silent:  # it came, but after the deadline: the others were told already
            raise silent.error_for(self.rank)

    def _lost(self, peer: int, doing: str, exc: BaseException) -> PipelineRankError:
        """The connection to ``peer`` broke: the peer exited (or its process group is gone)."""
        first = str(exc).splitlines()[0][:300]
        return PipelineRankError(f"rank {self.rank} lost rank {peer} while {doing}: {first} (rank {peer} probably "
                                 f"failed or exited: its own output says why)", rank=peer, stage=None, microbatch=None,
                                 action=None, error=first)

    def _report_silent(self, silent: Failure) -> None:
        """The watchdog found a wait past its deadline: tell every rank while the connections still work."""
        self.fail(silent)

    def _protocol_error(self, peer: int, what: str, status: int) -> RuntimeError:
        return RuntimeError(f"rank {self.rank} expected {what} from rank {peer} but got a message of kind {status}: "
                            f"the two ranks run different schedules (every rank must build the same schedule with "
                            f"the same n_microbatches and stages)")
