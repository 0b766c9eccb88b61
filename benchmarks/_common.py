"""Helpers shared by the benchmark scripts: summary statistics, plain-text tables, two gloo ranks.

Not part of the package; the scripts import it as ``_common`` (they run as
``python benchmarks/<name>.py``, which puts this folder on ``sys.path``).
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

__all__: List[str] = []

Row = Sequence[str]


def sleeper(seconds: float) -> Callable[[Any], None]:
    """A task body that sleeps ``seconds`` (it releases the GIL, like a kernel or I/O would)."""

    def body(ctx: Any) -> None:
        time.sleep(seconds)

    return body


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


BUSY_LOAD_PER_CPU = 0.3  # a 1-minute load average above this share of the CPUs makes timings untrustworthy


def load_average() -> Optional[float]:
    """The 1-minute load average (None where the system does not report one)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def machine_line() -> str:
    """One line describing where the numbers were taken, with the load (and a warning when it is high)."""
    cpus = os.cpu_count() or 1
    load = load_average()
    load_text = "load n/a" if load is None else f"load {load:.2f}"
    line = (f"python {platform.python_version()}, torch {torch.__version__}, {cpus} CPUs, "
            f"torch threads {torch.get_num_threads()}, {platform.machine()}, {load_text} (1 min)")
    if load is not None and load > BUSY_LOAD_PER_CPU * cpus:
        line += (f"\nWARNING: the machine is busy (load {load:.2f} on {cpus} CPUs, before this benchmark "
                 f"started): timings below are not trustworthy; rerun on a quiet machine")
    return line


def yes_no(ok: bool) -> str:
    return "yes" if ok else "NO"


def on_two_ranks(rank_main: Callable[..., None], arg: Any, timeout: float) -> Dict[int, Any]:
    """Run ``rank_main(rank, 2, port, arg, out)`` on two spawned processes (gloo on 127.0.0.1, a free port); each
    puts ``(rank, result)`` on ``out``. Returns ``{rank: result}``."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, 2, port, arg, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=timeout) for _ in procs)
    for p in procs:
        p.join()
    return results
