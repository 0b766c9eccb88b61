"""Helpers shared by the benchmark scripts: summary statistics and plain-text tables.

Not part of the package; the scripts import it as ``_common`` (they run as
``python benchmarks/<name>.py``, which puts this folder on ``sys.path``).
"""

from __future__ import annotations

import os
import platform
import statistics
from typing import List, Sequence, Tuple

import torch

__all__: List[str] = []

Row = Sequence[str]


def median_and_min(values: Sequence[float]) -> Tuple[float, float]:
    """The median and the minimum of a non-empty sequence."""
    return statistics.median(values), min(values)


def format_table(headers: Row, rows: Sequence[Row], left: int = 1) -> str:
    """A plain-text table: the first ``left`` columns left-aligned, the others right-aligned."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]

    def line(cells: Row) -> str:
        parts = [str(c).ljust(w) if k < left else str(c).rjust(w) for k, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def machine_line() -> str:
    """One line describing where the numbers were taken."""
    return (f"python {platform.python_version()}, torch {torch.__version__}, "
            f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, {platform.machine()}")


def yes_no(ok: bool) -> str:
    return "yes" if ok else "NO"
