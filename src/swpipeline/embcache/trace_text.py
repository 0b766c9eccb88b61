"""A traced run as text: one row per stage, one column per time slice, each mark the batch it worked on.

::

    compute swap   prep      |   6          7          8
    swap           swap      |    5555555    6666666    7777777
    fwd/bwd/update default   | 444444444444 55555555555 66666666666

The swap of batch i+1 (row "swap") sits under the training of batch i (row
"fwd/bwd/update"): that is the overlap the pipeline exists for. Made from the
engine's ``Timeline`` (``EmbCacheTrainPipeline.tracing()``); times are the task
functions' CPU spans.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from ..observe.records import TaskRecord, TimelineData
from .stages import stage_labels

__all__: List[str] = []

_STAGE_OF: Dict[str, str] = {task: label for label, tasks in stage_labels(True) for task in tasks}
_TRAIN = "forward/backward/update"


def format_trace(timeline: TimelineData, first: int, last: int, width: int = 96) -> str:
    """The stretch of ``timeline`` in which batches ``first`` .. ``last`` trained, as text.

    Args:
        timeline: a traced run of an EmbCacheTrainPipeline.
        first, last: the batches whose training spans the window (inclusive).
        width: columns of the time axis.

    Raises:
        ValueError: no batch in ``first`` .. ``last`` trained in this run, or ``width`` < 10.
    """
    if width < 10:
        raise ValueError(f"width must be >= 10 columns, got {width}")
    train = [r for r in timeline.records if _STAGE_OF.get(r.task) == _TRAIN and first <= r.iteration <= last]
    if not train:
        raise ValueError(f"no batch in {first}..{last} trained in this run; pick batches between 0 and "
                         f"{timeline.num_iterations - 1}")
    start, end = min(r.cpu_start for r in train), max(r.cpu_end for r in train)
    step = (end - start) / width if end > start else 1.0
    lanes = _lanes(timeline.records, start, end)
    label_width = max(len(label) for label, _ in lanes)
    group_width = max(len(group) for _, group in lanes)
    lines = [f"batches {first}..{last}: {(end - start) * 1e3:.2f} ms, one column = {step * 1e3:.3f} ms; "
             f"each mark is the number (mod 10) of the batch the stage works on"]
    for (label, group), records in lanes.items():
        cells = [_mark(records, start + k * step, start + (k + 1) * step) for k in range(width)]
        lines.append(f"{label.ljust(label_width)} {group.ljust(group_width)} |{''.join(cells).rstrip()}")
    return "\n".join(lines)


def _lanes(records: Sequence[TaskRecord], start: float, end: float) -> Dict[Tuple[str, str], List[TaskRecord]]:
    """The records overlapping [start, end], by (stage label, thread group), in stage order."""
    order = {label: k for k, (label, _) in enumerate(stage_labels(True))}
    lanes: Dict[Tuple[str, str], List[TaskRecord]] = {}
    for record in records:
        label = _STAGE_OF.get(record.task)
        if label is not None and record.cpu_end >= start and record.cpu_start <= end:
            lanes.setdefault((label, record.thread_group), []).append(record)
    return dict(sorted(lanes.items(), key=lambda item: order[item[0][0]]))


def _mark(records: Sequence[TaskRecord], begin: float, end: float) -> str:
    """The batch number (mod 10) of the latest-started record running in [begin, end), or a blank.

    Any overlap counts, so a task shorter than a column still shows.
    """
    found: Optional[TaskRecord] = None
    for record in records:
        if record.cpu_start < end and record.cpu_end > begin and (found is None or record.cpu_start > found.cpu_start):
            found = record
    return " " if found is None else str(found.iteration % 10)
