"""Messages between ranks over ``torch.distributed`` point-to-point operations, and failures sent in their place.

A message is a tuple of tensors (``None`` allowed: a gradient that does not exist). It
travels as a fixed-size header, then one operation per tensor; the receiver learns the
shapes from the header, so nothing about shapes is agreed in advance. Message ``k`` of the
channel from rank ``a`` to rank ``b`` uses the tags ``k * PARTS + part`` (part 0 the
header), so a receive can only ever match the message it is meant for.

A header says what follows::

    [DATA, count, dtype, ndim, d0, d1, ..., dtype, ndim, ...]     count tensors
    [FAILED, n]                                                   n bytes: the first failure, as JSON
    [HELLO] / [DONE]                                              the sender's step starts / is over

Failures. When a rank's step fails (a task raised, a message said another rank failed,
a receive timed out), ``fail`` sends the failure on every channel in place of the next
message and sends nothing more in this step. Whoever waits for that message gets the
failure, fails in turn and passes it on, so the first failure reaches every rank that
waits, directly or through others, for the rank it happened on, and each of them raises
``PipelineRankError`` naming that rank, stage, microbatch and the original exception.
Sends are only posted (``isend``); their completion is awaited at the end of a
successful step, after every peer's ``DONE`` showed it received everything.

Silence. A rank waits ``timeout`` seconds for a peer's ``HELLO`` (the peer never started
its step) and twice that for any later message (it started, then stopped sending: it may
itself be waiting for a silent rank, whose neighbours report it first). When a deadline
passes, the watchdog (``watchdog.py``) sends the failure, naming the silent rank, to every
rank while the connections still work, and the receive fails a little later.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ..errors import PipelineAborted
from .errors import PipelineRankError, RankTimeoutError
from .watchdog import Watchdog

__all__: List[str] = []

logger = logging.getLogger("swpipeline.pp")

HEADER_LEN = 64
PARTS = 32  # tags per message: the header and up to 31 tensors
DATA, FAILED, DONE, HELLO = 0, 1, 2, 3
GRACE_S = 3.0  # how long a receive outlives its deadline (the failure is being sent meanwhile)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
NO_TENSOR = -1

Payload = Tuple[Optional[torch.Tensor], ...]


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

    def encode(self) -> bytes:
        return json.dumps(self._asdict()).encode()

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
    """The tag of a part of message ``index`` (part 0: the header)."""
    return index * PARTS + part


def encode_header(tensors: Payload) -> torch.Tensor:
    """The DATA header describing ``tensors`` (see the module docstring)."""
    values = [DATA, len(tensors)]
    for t in tensors:
        if t is None:
            values += [NO_TENSOR, 0]
            continue
        if t.dtype not in DTYPES:
            raise TypeError(f"cannot send a tensor of dtype {t.dtype} between stages; send one of "
                            f"{', '.join(str(d) for d in DTYPES)}")
        values += [DTYPES.index(t.dtype), t.dim(), *t.shape]
    if len(values) > HEADER_LEN or len(tensors) >= PARTS:
        raise ValueError(f"a stage's output of {len(tensors)} tensors with shapes "
                         f"{[None if t is None else tuple(t.shape) for t in tensors]} does not fit one message "
                         f"(at most {PARTS - 1} tensors and {HEADER_LEN} header values): return fewer, flatter tensors")
    return torch.tensor(values + [0] * (HEADER_LEN - len(values)), dtype=torch.int64)


class _Outbox:
    """The sending end of one channel in one step: the next message's position, and whether it is closed."""

    def __init__(self) -> None:
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
        self.rank = rank
        self.device = device
        self.timeout_s = timeout
        self._lock = threading.Lock()
        self._outboxes: Dict[int, _Outbox] = {}
        self._works: List[Any] = []  # posted data sends (and the tensors they read), awaited at the end of the step
        self._markers: List[Any] = []  # posted HELLO and DONE sends: never awaited (see finish_step)
        self._watchdog = Watchdog(f"swpipeline-pp-watchdog-rank{rank}")
        self.failure: Optional[Failure] = None

    # -- the step's life cycle ------------------------------------------------------------------

    def start_step(self, peers: Sequence[int]) -> None:
        with self._lock:
            self._outboxes = {peer: _Outbox() for peer in peers}
            self._works, self._markers = [], []
            self.failure = None

    def finish_step(self) -> None:
        """Wait for every data send posted in the step: each peer's DONE showed it received them all.

        The DONE sends themselves are not awaited: a peer receives ours last, and may fail before it does.
        """
        works, self._works = self._works, []
        limit = datetime.timedelta(seconds=2 * self.timeout_s + GRACE_S)
        for work, _ in works:
            work.wait(limit)

    # -- sending ----------------------------------------------------------------------------------

    def send(self, peer: int, index: int, tensors: Payload) -> None:
        """Post message ``index`` of the channel to ``peer`` (nothing, once the step failed)."""
        header = encode_header(tensors)
        with self._lock:
            box = self._outboxes[peer]
            if box.closed:
                return
            self._works.append(self._post(header, peer, tag(index, 0)))
            for part, t in enumerate(tensors, start=1):
                if t is not None:
                    self._works.append(self._post(t.detach().to(self.device).contiguous(), peer, tag(index, part)))
            box.next_index = index + 1

    def send_marker(self, peer: int, index: int, status: int) -> None:
        """Post a HELLO or a DONE as message ``index`` of the channel to ``peer``."""
        header = torch.zeros(HEADER_LEN, dtype=torch.int64)
        header[0] = status
        with self._lock:
            box = self._outboxes[peer]
            if not box.closed:
                self._markers.append(self._post(header, peer, tag(index, 0)))
                box.next_index = index + 1

    def fail(self, failure: Failure) -> Failure:
        """Send the step's first failure on every open channel in place of its next message; returns the first one.

        Nothing more is sent in this step. Called again (a later failure), it only returns the first.
        """
        with self._lock:
            if self.failure is not None:
                return self.failure
            self.failure = failure
            text = torch.frombuffer(bytearray(failure.encode()), dtype=torch.uint8)
            for peer, box in self._outboxes.items():
                if box.closed:
                    continue
                box.closed = True
                header = torch.zeros(HEADER_LEN, dtype=torch.int64)
                header[0], header[1] = FAILED, text.numel()
                try:
                    self._markers.append(self._post(header, peer, tag(box.next_index, 0)))
                    self._markers.append(self._post(text, peer, tag(box.next_index, 1)))
                except Exception as exc:  # a peer already gone: the others must still hear of it
                    logger.warning("swpipeline.pp: could not tell rank %s of the failure: %s", peer, exc)
            return failure

    def _post(self, tensor: torch.Tensor, peer: int, message_tag: int) -> Tuple[Any, torch.Tensor]:
        tensor = tensor.to(self.device)
        return dist.isend(tensor, group=self.group, group_dst=peer, tag=message_tag), tensor

    # -- receiving --------------------------------------------------------------------------------

    def recv(self, peer: int, index: int, what: str) -> Payload:
        """Message ``index`` of the channel from ``peer``; ``what`` describes it for errors.

        Raises:
            PipelineRankError: the peer sent its step's failure instead, or closed the connection.
            RankTimeoutError: nothing came in time (see the module docstring).
        """
        header = self._receive_header(peer, index, what, 2 * self.timeout_s)
        if int(header[0]) != DATA:
            raise self._protocol_error(peer, what, int(header[0]))
        count = int(header[1])
        out: List[Optional[torch.Tensor]] = []
        at = 2
        for part in range(1, count + 1):
            code, ndim = int(header[at]), int(header[at + 1])
            shape = [int(d) for d in header[at + 2:at + 2 + ndim]]
            at += 2 + ndim
            if code == NO_TENSOR:
                out.append(None)
                continue
            buffer = torch.empty(shape, dtype=DTYPES[code], device=self.device)
            self._wait(dist.irecv(buffer, group=self.group, group_src=peer, tag=tag(index, part)), peer, what, None)
            out.append(buffer)
        return tuple(out)

    def recv_marker(self, peer: int, index: int, status: int) -> None:
        """Wait for the peer's HELLO (its step started) or DONE (it is over), or its failure."""
        what = f"rank {peer}'s {'start' if status == HELLO else 'end'} of step"
        seconds = self.timeout_s if status == HELLO else 2 * self.timeout_s
        found = int(self._receive_header(peer, index, what, seconds)[0])
        if found != status:
            raise self._protocol_error(peer, what, found)

    def _receive_header(self, peer: int, index: int, what: str, seconds: float) -> torch.Tensor:
        header = torch.empty(HEADER_LEN, dtype=torch.int64, device=self.device)
        self._wait(dist.irecv(header, group=self.group, group_src=peer, tag=tag(index, 0)), peer, what, seconds)
        header = header.cpu()
        if int(header[0]) == FAILED:
            text = torch.empty(int(header[1]), dtype=torch.uint8, device=self.device)
            self._wait(dist.irecv(text, group=self.group, group_src=peer, tag=tag(index, 1)), peer, what, None)
            if self.failure is not None:  # this rank failed already: the failure coming back, nothing new
                raise PipelineAborted("the step failed")
            raise Failure.decode(bytes(text.cpu().tolist())).error_for(self.rank)
        return header

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
            first = str(exc).splitlines()[0][:300]
            raise PipelineRankError(
                f"rank {self.rank} lost rank {peer} while waiting for {what}: {first} (rank {peer} probably failed "
                f"or exited: its own output says why)", rank=peer, stage=None, microbatch=None, action=None,
                error=first) from None
        finally:
            if token is not None:
                self._watchdog.done(token)
        if self.failure is silent:  # it came, but after the deadline: the others were told already
            raise silent.error_for(self.rank)

    def _report_silent(self, silent: Failure) -> None:
        """The watchdog found a wait past its deadline: tell every rank while the connections still work."""
        self.fail(silent)

    def _protocol_error(self, peer: int, what: str, status: int) -> RuntimeError:
        return RuntimeError(f"rank {self.rank} expected {what} from rank {peer} but got a message of kind {status}: "
                            f"the two ranks run different schedules (every rank must build the same schedule with "
                            f"the same n_microbatches and stages)")
