"""How a message looks on the wire: one byte buffer, a header and the tensors packed after it.

A message is a tuple of tensors (``None`` allowed: a gradient that does not exist). It
travels as one ``uint8`` buffer: a header of ``HEADER_LEN`` int64 values, then each tensor's
bytes at an offset aligned to ``ALIGN``, so the receiver's tensors are views of the buffer
(no copy). The header says what the buffer holds::

    [DATA, count, dtype, ndim, d0, d1, ..., dtype, ndim, ...]   count tensors (dtype -1: None)
    [FAILED, n] + n bytes                                       a failure: n bytes of JSON, in the header itself
    [CHANGED]                                                   a filler: the real message is announced
    [HELLO, fingerprint, n] + n bytes                           the sender's step starts: what it runs
    [DONE]                                                      the sender's step is over

A failure is one message, its text inside the header (at most ``FAILURE_BYTES``), so it lands
in whatever buffer the receiver posted for the message it replaces, and nothing more has to
travel: a rank that fails and exits at once has still said why.

A HELLO carries a fingerprint of the sender's whole configuration (schedule, microbatches,
stages, placement, skips, scaling, training or forward only, every rank's actions) and its
description in words: a receiver whose own fingerprint differs says at once what each side
runs, instead of waiting for messages that will never match.

A message's *layout* (each tensor's dtype and shape) decides its size. Both ends remember
the layout of each message of the last step, so a receiver posts a buffer of the right
size before the message arrives and the data lands directly in it (``transport.py``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, List, Optional, Sequence, Tuple

import torch

__all__: List[str] = []

HEADER_LEN = 64
HEADER_BYTES = HEADER_LEN * 8
ALIGN = 64
DATA, FAILED, DONE, HELLO, CHANGED = 0, 1, 2, 3, 4
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
ITEM_BYTES = tuple(torch.empty((), dtype=d).element_size() for d in DTYPES)
FAILURE_BYTES = HEADER_BYTES - 16  # a failure's text: the header after its two values
NO_TENSOR = -1
MAX_TENSORS = 15

Payload = Tuple[Optional[torch.Tensor], ...]
Layout = Tuple[Optional[Tuple[int, Tuple[int, ...]]], ...]  # per tensor: (dtype code, shape), or None


def layout_of(tensors: Sequence[Any]) -> Layout:
    """Each tensor's dtype code and shape (None for a missing one); anything else is refused."""
    found: List[Optional[Tuple[int, Tuple[int, ...]]]] = []
    for t in tensors:
        if t is None:
            found.append(None)
            continue
        if not isinstance(t, torch.Tensor):
            shown = f"a dict with keys {sorted(map(str, t))}" if isinstance(t, dict) else f"a {type(t).__name__}"
            raise TypeError(f"cannot send {shown} between stages: a stage's output goes to the next stage as a "
                            f"tensor or a tuple of tensors (only the last stage's may be anything); return its "
                            f"tensors as a tuple")
        if t.dtype not in DTYPES:
            raise TypeError(f"cannot send a tensor of dtype {t.dtype} between stages; send one of "
                            f"{', '.join(str(d) for d in DTYPES)}")
        found.append((DTYPES.index(t.dtype), tuple(t.shape)))
    layout = tuple(found)
    values = 2 + sum(2 + (len(e[1]) if e is not None else 0) for e in layout)
    if len(layout) > MAX_TENSORS or values > HEADER_LEN:
        raise ValueError(f"a stage's output of {len(layout)} tensors with shapes "
                         f"{[None if t is None else tuple(t.shape) for t in tensors]} does not fit one message (at "
                         f"most {MAX_TENSORS} tensors and {HEADER_LEN} header values): return fewer, flatter tensors")
    return layout


@lru_cache(maxsize=1024)
def _offsets(layout: Layout) -> Tuple[Tuple[int, ...], int]:
    """Where each tensor starts in the buffer, and the buffer's size (a step's layouts repeat: kept)."""
    at = HEADER_BYTES
    starts: List[int] = []
    for entry in layout:
        starts.append(at)
        if entry is not None:
            at += (_nbytes(entry) + ALIGN - 1) // ALIGN * ALIGN
    return tuple(starts), at


def _nbytes(entry: Tuple[int, Tuple[int, ...]]) -> int:
    code, shape = entry
    count = ITEM_BYTES[code]
    for d in shape:
        count *= d
    return count


@lru_cache(maxsize=1024)
def _header(layout: Layout) -> torch.Tensor:
    """The header of a message of ``layout``, as bytes (kept, like ``_offsets``: never written to)."""
    values = header_values(layout)
    return torch.tensor(values + [0] * (HEADER_LEN - len(values)), dtype=torch.int64).view(torch.uint8)


def packed_size(layout: Layout) -> int:
    return _offsets(layout)[1]


def header_values(layout: Layout) -> List[int]:
    values = [DATA, len(layout)]
    for entry in layout:
        values += [NO_TENSOR, 0] if entry is None else [entry[0], len(entry[1]), *entry[1]]
    return values


def marker(status: int, extra: Sequence[int] = (), size: int = HEADER_BYTES) -> torch.Tensor:
    """A buffer of ``size`` bytes holding only a header: ``[status, *extra]``."""
    buffer = torch.zeros(size, dtype=torch.uint8)
    head = buffer[:HEADER_BYTES].view(torch.int64)
    head[0] = status
    for k, value in enumerate(extra, start=1):
        head[k] = value
    return buffer


def text_marker(status: int, extra: Sequence[int], text: bytes, size: int = HEADER_BYTES) -> torch.Tensor:
    """A message of ``size`` bytes: ``[status, *extra, len(text)]``, then the text right after, all in the header.
    The failures and the HELLOs say what they say this way."""
    at = 8 * (len(extra) + 2)
    if len(text) > HEADER_BYTES - at:
        raise ValueError(f"a text of {len(text)} bytes does not fit the header's {HEADER_BYTES - at}")
    buffer = marker(status, [*extra, len(text)], size)
    if text:
        buffer[at:at + len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    return buffer


def marker_text(buffer: torch.Tensor, extra: int) -> bytes:
    """The text of a ``text_marker`` message with ``extra`` values before the text's length."""
    at = 8 * (extra + 2)
    length = int(buffer[:at].view(torch.int64)[extra + 1])
    return bytes(buffer[at:at + min(length, HEADER_BYTES - at)].cpu().tolist())


def failure_marker(text: bytes, size: int = HEADER_BYTES) -> torch.Tensor:
    """A failure message of ``size`` bytes: ``[FAILED, len(text)]`` and the text, all in the header."""
    return text_marker(FAILED, (), text, size)


HELLO_TEXT_BYTES = HEADER_BYTES - 24  # a HELLO's description: the header after its three values


def hello_marker(fingerprint: int, text: bytes) -> torch.Tensor:
    """A HELLO saying what its sender runs: ``[HELLO, fingerprint, len(text)]`` and the text (cut to fit)."""
    return text_marker(HELLO, (fingerprint,), text[:HELLO_TEXT_BYTES])


def hello_text(buffer: torch.Tensor) -> str:
    """The description a HELLO carries (``hello_marker``)."""
    return marker_text(buffer, 1).decode("utf-8", "replace")


def failure_text(buffer: torch.Tensor) -> bytes:
    """The text of a failure message (``failure_marker``)."""
    return marker_text(buffer, 0)


def pack(tensors: Payload, layout: Layout, device: torch.device) -> torch.Tensor:
    """The message's buffer: its header, then each tensor's bytes."""
    starts, size = _offsets(layout)
    buffer = torch.empty(size, dtype=torch.uint8, device=device)
    buffer[:HEADER_BYTES].copy_(_header(layout))
    for t, start, entry in zip(tensors, starts, layout):
        if t is not None and entry is not None:
            buffer[start:start + _nbytes(entry)].view(t.dtype).view(t.shape).copy_(t.detach())
    return buffer


def unpack(buffer: torch.Tensor, layout: Layout) -> Payload:
    """The message's tensors: views of ``buffer``."""
    starts, _ = _offsets(layout)
    out: List[Optional[torch.Tensor]] = []
    for start, entry in zip(starts, layout):
        if entry is None:
            out.append(None)
            continue
        code, shape = entry
        out.append(buffer[start:start + _nbytes(entry)].view(DTYPES[code]).view(shape))
    return tuple(out)


def read_header(buffer: torch.Tensor) -> List[int]:
    """The header's values (on the CPU)."""
    return [int(v) for v in buffer[:HEADER_BYTES].view(torch.int64).cpu().tolist()]


def layout_from(values: Sequence[int]) -> Layout:
    """The layout a DATA header describes."""
    found: List[Optional[Tuple[int, Tuple[int, ...]]]] = []
    at = 2
    for _ in range(values[1]):
        code, ndim = values[at], values[at + 1]
        found.append(None if code == NO_TENSOR else (code, tuple(values[at + 2:at + 2 + ndim])))
        at += 2 + ndim
    return tuple(found)
