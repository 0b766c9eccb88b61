"""Plain-text tables: the period schedule, the stage analysis, and aligned columns for any report."""

from __future__ import annotations

from typing import List, Sequence, Tuple

__all__: List[str] = []

# Minimum column widths: TorchRec's task names (InputDistStart, OptimizerStep) fit without shifting the columns.
_TASK_W, _THREAD_W, _STREAM_W, _CELL_W = 17, 7, 12, 5

ScheduleRow = Tuple[str, str, str, Sequence[str]]  # task label, thread group, stream, one cell per period


def format_period_table(rows: Sequence[ScheduleRow], num_periods: int) -> str:
    """The ``print_schedule`` table: one row per task, one column per period.

    Example (FusedSparseDist, first rows)::

        #  Task              Thread  Stream       | P0    P1    P2
        -- ----------------- ------- ------------ + ----- ----- -----
        0  EmbLookup         default emb_lookup   | --    --    i0
    """
    task_w = max([_TASK_W] + [len(r[0]) for r in rows])
    thread_w = max([_THREAD_W] + [len(r[1]) for r in rows])
    stream_w = max([_STREAM_W] + [len(r[2]) for r in rows])
    cell_w = max([_CELL_W, len(f"P{num_periods - 1}")] + [len(c) for r in rows for c in r[3]])
    idx_w = max(2, len(str(len(rows) - 1)))

    def line(idx: str, task: str, thread: str, stream: str, bar: str, cells: Sequence[str]) -> str:
        body = " ".join(f"{c:<{cell_w}}" for c in cells)
        return f"{idx:<{idx_w}} {task:<{task_w}} {thread:<{thread_w}} {stream:<{stream_w}} {bar} {body}".rstrip()

    out = [
        line("#", "Task", "Thread", "Stream", "|", [f"P{p}" for p in range(num_periods)]),
        line("-" * idx_w, "-" * task_w, "-" * thread_w, "-" * stream_w, "+", ["-" * cell_w] * num_periods),
    ]
    out += [line(str(k), *row[:3], "|", row[3]) for k, row in enumerate(rows)]
    return "\n".join(out)


def format_stage_analysis(rows: Sequence[Tuple[str, int, int, str]], chain: Sequence[Tuple[str, int]],
                          depth: int) -> str:
    """The ``print_stage_analysis`` report, then two lines saying what "LDS" and the verdict mean.

    The rule under the header is 50 dashes, or as wide as the widest row for long task names.

    Args:
        rows: (task, enqueue index, stage, type) in serial topological order.
        chain: the longest stage-decreasing dependency chain, consumer first, as (task, stage).
        depth: the pipeline depth.
    """
    task_w = max([20] + [len(r[0]) for r in rows])
    lines = [f"{pos:<4} {name:<{task_w}} {idx:<4} {stage:<6} {kind}" for pos, (name, idx, stage, kind) in
             enumerate(rows)]
    header = f"{'Pos':<4} {'Task':<{task_w}} {'Idx':<4} {'Stage':<6} Type"
    out = ["Task schedule (topological order):", header, "-" * max([50] + [len(line) for line in lines])]
    out += lines
    lds = len(chain)
    stages = ", ".join(str(s) for _, s in chain)
    out.append(f"LDS = {lds} (example: ({stages}{',' if lds == 1 else ''}))")
    out.append(f"Pipeline depth = {depth}")
    if lds == depth:
        out.append("\u2713 LDS == depth (Dilworth-optimal)")
    else:
        out.append(f"\u2717 LDS < depth: {depth - lds} stage(s) hold a batch in flight without separating a "
                   f"producer from its consumer; a depth of {lds} gives the same dependency structure")
    names = " <- ".join(n for n, _ in chain)
    out.append(f"  LDS: the longest chain of dependencies, consumer first, in which each task is at a later stage "
               f"than the task it needs (here {names}); its tasks need one stage each, so the depth is at least "
               f"the LDS")
    if lds == depth:
        out.append("  Dilworth-optimal: the depth equals the LDS, so every stage boundary separates a producer from "
                   "a consumer that needs its result")
    return "\n".join(out)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> List[str]:
    """A plain-text table's lines: the first ``left`` columns left-aligned, the others right-aligned."""
    widths = [max(len(c) for c in column) for column in zip(headers, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if k < left else c.rjust(w)
                         for k, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]
