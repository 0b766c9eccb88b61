"""Pictures of a run: the timeline as a Gantt chart, and the period schedule as a coloured table.

Both are PNGs drawn with matplotlib's object API on an Agg canvas (no pyplot, no
global backend switch, safe in any thread). matplotlib is imported only when a
picture is drawn, so ``import swpipeline`` never needs it (``pip install
swpipeline[plot]``). Iteration ``i`` has the same colour in both pictures::

    thread swp-prep   [P i3][P i4][P i5]...          one row per thread group: task spans,
    thread swp-main   //wait//[F i1][B i1][O i1]...  dependency waits hatched
    stream prep       [P i3][P i4][P i5]...          one row per stream (device times where recorded)
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from .tables import ScheduleRow
    from .records import PathLike, TaskRecord, TimelineData as Timeline

__all__: List[str] = []

_DPI = 110
_WAIT_HATCH = "////"


def _matplotlib() -> Tuple[Any, Any, Any]:
    """matplotlib's Figure, Agg canvas and colormaps, or an ImportError that says how to install it."""
    try:
        from matplotlib import colormaps
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("swpipeline charts need matplotlib: pip install 'swpipeline[plot]' "
                          "(or pip install matplotlib)") from exc
    return Figure, FigureCanvasAgg, colormaps


_ITERATION_HATCHES = ("", "..", "xx", "oo")  # none of them looks like the dependency wait's "////"


def iteration_style(iteration: int) -> Tuple[int, str]:
    """How an iteration is drawn: (tab10 colour index, hatch); 40 distinct styles, then they repeat.

    Ten colours alone would draw iterations 0 and 10 alike; the hatch tells each run of ten apart.
    """
    return iteration % 10, _ITERATION_HATCHES[(iteration // 10) % len(_ITERATION_HATCHES)]


def _iteration_fill(colormaps: Any, iteration: int) -> Tuple[Any, Optional[str]]:
    """An iteration's fill colour and hatch (None: plain), as matplotlib takes them."""
    index, hatch = iteration_style(iteration)
    return colormaps["tab10"](index), hatch or None


def legend_entries(iterations: Sequence[int]) -> List[Tuple[int, str]]:
    """One (iteration, label) per style among ``iterations``, in order: the label names every shown
    iteration drawn that way (``"i3"``, or ``"i3, i43"`` when the styles repeat), at most three and "…"."""
    by_style: Dict[Tuple[int, str], List[int]] = {}
    for i in iterations:
        by_style.setdefault(iteration_style(i), []).append(i)
    entries = []
    for members in by_style.values():
        names = ", ".join(f"i{i}" for i in members[:3])
        entries.append((members[0], names + (", …" if len(members) > 3 else "")))
    return entries


def _save(figure: Any, canvas_type: Any, path: "PathLike") -> None:
    """Write the picture at exactly ``path``: a PNG, or the format its suffix names (``.svg``, ``.pdf``)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    canvas_type(figure)
    figure.savefig(target, dpi=_DPI, format=None if target.suffix else "png")  # no suffix: not renamed to .png


# -- the Gantt chart -------------------------------------------------------------------------------


def _window(timeline: "Timeline", iterations: Optional[Tuple[int, int]]) -> Tuple[float, float]:
    """The time span (seconds) to draw: from the start of the run (0) to the end of the chosen iterations, or,
    for a window of later iterations, from their first start."""
    chosen = timeline.records
    if iterations is not None:
        first, last = iterations
        if first > last:
            raise ValueError(f"iterations: first {first} is after last {last}; pass (first, last) with first <= last")
        chosen = tuple(r for r in timeline.records if first <= r.iteration <= last)
        if not chosen:
            raise ValueError(f"iterations {iterations}: no recorded task ran on them "
                             f"(the timeline has iterations 0..{timeline.num_iterations - 1})")
    if not chosen:
        return 0.0, max(timeline.wall, 1e-6)
    end = max(r.cpu_end for r in chosen)
    if iterations is None or iterations[0] <= min(r.iteration for r in timeline.records):
        return 0.0, end  # the run's first iteration: the axis starts where the run did
    return min(min(r.ready, r.cpu_start) for r in chosen), end


def _bar_label(task: str, iteration: int, room_chars: float) -> Optional[str]:
    """The longest label that fits in ``room_chars``: ``Forward i3``, ``F i3`` (capitals), ``i3``, or None."""
    capitals = "".join(c for c in task if c.isupper() or c.isdigit()) or task[:1]
    for label in (f"{task} i{iteration}", f"{capitals} i{iteration}", f"i{iteration}"):
        if len(label) + 1 <= room_chars:
            return label
    return None


def save_gantt(timeline: "Timeline", path: "PathLike", *, iterations: Optional[Tuple[int, int]] = None,
               title: Optional[str] = None) -> None:
    """Draw ``timeline`` as a Gantt chart PNG: one row per thread group and per stream.

    Task spans are coloured by iteration and labelled (abbreviated task name and
    iteration) where they are wide enough; dependency waits are hatched. The time axis
    starts at 0, the start of the run; with ``iterations=(first, last)`` it ends with the
    last of those iterations, and a window of later iterations starts at their first start.
    """
    _, canvas_type, _ = _matplotlib()
    _save(gantt_figure(timeline, iterations=iterations, title=title), canvas_type, path)


def gantt_figure(timeline: "Timeline", *, iterations: Optional[Tuple[int, int]] = None,
                 title: Optional[str] = None) -> Any:
    """The matplotlib Figure ``save_gantt`` writes (laid out, on an Agg canvas)."""
    figure_type, canvas_type, colormaps = _matplotlib()
    lo, hi = _window(timeline, iterations)
    span = max(hi - lo, 1e-9)
    visible = [r for r in timeline.records if r.cpu_end >= lo and min(r.ready, r.cpu_start) <= hi]
    lanes = [("thread", g) for g in timeline.thread_groups] + [("stream", s) for s in timeline.streams]
    width_in = 13.0
    figure = figure_type(figsize=(width_in, 1.3 + 0.42 * len(lanes)), dpi=_DPI, layout="constrained")
    canvas_type(figure)
    ax = figure.add_subplot()
    chars_per_ms = width_in * 0.8 * 72 / 4.0 / (span * 1e3)  # ~4 points per character at font size 7
    for row, (kind, lane) in enumerate(lanes):
        on_lane = [r for r in visible if (r.thread_group if kind == "thread" else r.stream) == lane]
        _draw_lane(ax, row, kind, on_lane, chars_per_ms, colormaps)
    ax.set_yticks(range(len(lanes)), [f"thread {timeline.thread_label(lane)}" if kind == "thread" else
                                      f"stream {lane}" for kind, lane in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlim(lo * 1e3, hi * 1e3)
    ax.set_xlabel("ms since the run started")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    if len(timeline.thread_groups) and len(timeline.streams):
        ax.axhline(len(timeline.thread_groups) - 0.5, color="0.5", linewidth=0.8)
    what = f"iterations {iterations[0]}-{iterations[1]}" if iterations else f"{timeline.num_iterations} iterations"
    ax.set_title(title or f"{timeline.engine} on {timeline.device}: {what}", loc="left")
    _legend(figure, ax, sorted({r.iteration for r in visible}), colormaps, timeline.has_device_times)
    return figure


def _draw_lane(ax: Any, row: int, kind: str, records: Sequence["TaskRecord"], chars_per_ms: float,
               colormaps: Any) -> None:
    """One row of the Gantt chart: its task bars (and, for a thread, its hatched waits)."""
    for record in records:
        color, hatch = _iteration_fill(colormaps, record.iteration)
        if kind == "thread":
            for wait in record.waits:
                ax.barh(row, (wait.end - wait.start) * 1e3, left=wait.start * 1e3, height=0.5,
                        color="white", edgecolor=color, hatch=_WAIT_HATCH, linewidth=0.6)
        start, end = record.cpu_start, record.cpu_end
        if kind == "stream" and record.device_start is not None and record.device_end is not None:
            start, end = record.device_start, record.device_end
        width_ms = (end - start) * 1e3
        ax.barh(row, width_ms, left=start * 1e3, height=0.72, color=color, edgecolor="black", linewidth=0.4,
                hatch=hatch)
        label = _bar_label(record.task, record.iteration, width_ms * chars_per_ms)
        if label is not None:
            ax.text(start * 1e3 + width_ms / 2, row, label, ha="center", va="center", fontsize=7, clip_on=True)


def _legend(figure: Any, ax: Any, iterations: Sequence[int], colormaps: Any, device_times: bool) -> None:
    """The legend right of the plot, in as many columns as it takes to stay within the plot's height."""
    from matplotlib.patches import Patch

    handles = []
    for i, label in legend_entries(iterations):
        color, hatch = _iteration_fill(colormaps, i)
        handles.append(Patch(facecolor=color, hatch=hatch, edgecolor="black", linewidth=0.4, label=label))
    handles.append(Patch(facecolor="white", edgecolor="0.3", hatch=_WAIT_HATCH, label="dependency wait"))
    figure.canvas.draw()  # lay out the plot alone, to see how many entries one column can hold
    row_px = 7 * 1.6 * figure.dpi / 72  # an entry at font size 7 and its spacing
    fit = max(1, int(ax.get_window_extent().height / row_px) - (1 if device_times else 0))
    for columns in range(-(-len(handles) // fit), len(handles) + 1):
        legend = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, ncols=columns,
                           title="device times on streams" if device_times else None, title_fontsize=7,
                           frameon=False)
        with warnings.catch_warnings():  # a layout tried on the way may not fit; the one kept does
            warnings.simplefilter("ignore", UserWarning)
            figure.canvas.draw()
        if legend.get_window_extent().height <= ax.get_window_extent().height + 1:
            return


# -- the period table ------------------------------------------------------------------------------


def save_period_table(rows: Sequence["ScheduleRow"], path: "PathLike", *, title: Optional[str] = None) -> None:
    """Draw a ``print_schedule`` table as a PNG: one row per task, one column per period.

    A cell ``iN`` is filled with iteration N's colour; ``--`` (nothing to do yet)
    stays blank; ``.`` (a shortcut task replaying its cache) is hatched grey.
    """
    figure_type, canvas_type, colormaps = _matplotlib()
    num_periods = len(rows[0][3]) if rows else 0
    headers = ["Task", "Thread", "Stream"]
    text_widths = [max([len(h)] + [len(r[k]) for r in rows]) + 2 for k, h in enumerate(headers)]
    cell_width = max([4] + [len(c) + 2 for r in rows for c in r[3]] + [len(f"P{num_periods - 1}") + 2])
    lefts: List[float] = [0.0]
    for w in text_widths + [cell_width] * num_periods:
        lefts.append(lefts[-1] + w)
    total = lefts[-1]
    width_in = max(0.085 * total + 0.4, 0.075 * len(title or "") + 0.4)  # the title fits too (font size 10)
    figure = figure_type(figsize=(width_in, 0.3 * (len(rows) + 1) + (0.5 if title else 0.2)), layout="constrained")
    ax = figure.add_subplot()
    ax.set_xlim(0, total)
    ax.set_ylim(len(rows) + 1, 0)
    ax.axis("off")
    period_headers = [f"P{p}" for p in range(num_periods)]
    for col, text in enumerate(headers + period_headers):
        ax.text(lefts[col] + (0.5 if col < 3 else cell_width / 2), 0.5, text, va="center",
                ha="left" if col < 3 else "center", fontsize=9, fontweight="bold")
    ax.axhline(1, color="black", linewidth=0.8)
    for k, (task, thread, stream, cells) in enumerate(rows):
        y = k + 1
        for col, text in enumerate((task, thread, stream)):
            ax.text(lefts[col] + 0.5, y + 0.5, text, va="center", ha="left", fontsize=9)
        for p, cell in enumerate(cells):
            _draw_cell(ax, lefts[3 + p], y, cell_width, cell, colormaps)
    ax.axvline(lefts[3] - 0.3, color="black", linewidth=0.8)
    if title:
        ax.set_title(title, loc="left", fontsize=10)
    _save(figure, canvas_type, path)


def _draw_cell(ax: Any, left: float, y: int, width: float, cell: str, colormaps: Any) -> None:
    from matplotlib.patches import Rectangle

    box: Dict[str, Any] = {"xy": (left + 0.15, y + 0.1), "width": width - 0.3, "height": 0.8, "linewidth": 0.4}
    if cell.startswith("i") and cell[1:].isdigit():
        color, hatch = _iteration_fill(colormaps, int(cell[1:]))
        ax.add_patch(Rectangle(**box, facecolor=color, hatch=hatch, edgecolor="black"))
        ax.text(left + width / 2, y + 0.5, cell, va="center", ha="center", fontsize=9)
    elif cell == ".":
        ax.add_patch(Rectangle(**box, facecolor="0.9", edgecolor="0.5", hatch=".."))
    else:
        ax.text(left + width / 2, y + 0.5, cell, va="center", ha="center", fontsize=9, color="0.6")
