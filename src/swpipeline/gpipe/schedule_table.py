"""The engine's schedule tables, relabelled for GPipe: cells name micro-batches, not iterations.

``SWPipeline.format_schedule`` names the iteration a task works on in each period
(``i0``, ``i1``, ...) for an endless stream of iterations. A GPipe pass has
``chunks`` of them, and in the backward plan iteration ``r`` is micro-batch
``chunks-1-r``; these helpers rewrite each cell as ``m<micro-batch>``, or ``--`` where
the pass has no such iteration.
"""

from __future__ import annotations

import re
from typing import Callable, List, Optional, Tuple

__all__: List[str] = []

_CELL = re.compile(r"^i(\d+)$")
_MIN_CELL_WIDTH = 5


def relabel(table: str, label: Callable[[int], Optional[str]]) -> str:
    """``table`` with every cell ``i<r>`` replaced by ``label(r)`` (``--`` for None), columns re-aligned."""
    lines = table.splitlines()
    split = [_split(line) for line in lines]
    rows = [(left, cells if k < 2 else [_cell(c, label) for c in cells]) for k, (left, cells) in enumerate(split)]
    width = max([_MIN_CELL_WIDTH] + [len(c) for k, (_, cells) in enumerate(rows) if k != 1 for c in cells])
    out = []
    for k, (left, cells) in enumerate(rows):
        if k == 1:  # the rule under the header
            cells = ["-" * width] * len(cells)
        out.append((left + " ".join(c.ljust(width) for c in cells)).rstrip())
    return "\n".join(out)


def _split(line: str) -> Tuple[str, List[str]]:
    for bar in (" | ", " + "):
        at = line.find(bar)
        if at >= 0:
            return line[:at + len(bar)], line[at + len(bar):].split()
    return line, []


def _cell(cell: str, label: Callable[[int], Optional[str]]) -> str:
    match = _CELL.match(cell)
    if match is None:
        return cell
    text = label(int(match.group(1)))
    return "--" if text is None else text


def forward_label(chunks: int) -> Callable[[int], Optional[str]]:
    """Forward iteration ``r`` is micro-batch ``r``."""
    return lambda r: f"m{r}" if r < chunks else None


def backward_label(chunks: int) -> Callable[[int], Optional[str]]:
    """Backward iteration ``r`` is micro-batch ``chunks-1-r``."""
    return lambda r: f"m{chunks - 1 - r}" if r < chunks else None
