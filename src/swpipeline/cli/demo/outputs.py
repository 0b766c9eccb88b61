"""The files ``swpipeline demo`` writes: the pipelined run's trace, its timeline chart, the schedule picture.

Each path is checked before any training (``check_output_path``), so a path that cannot be
written is refused in one line at once, not after minutes of work.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from ...engine.clocked import SWPipeline
from ...observe.timeline import Timeline
from .report import SCHEDULE_PERIODS

__all__: List[str] = []


@dataclass(frozen=True)
class DemoOutputs:
    """Where ``swpipeline demo`` writes its pictures and trace ('' or None: not written)."""

    trace: Optional[str] = "out/demo_trace.json"
    chart: Optional[str] = "out/demo_timeline.png"
    schedule_chart: Optional[str] = "out/demo_schedule.png"
    chart_iterations: int = 8  # the chart shows the first iterations: the fill, then the steady state


def check_output_path(option: str, path: Optional[str], png: bool = False) -> None:
    """Refuse an output path that could not be written, before any training: ValueError naming the option.

    The path must name a file (a ``.png`` one for a picture) whose folder exists or can be made, and the
    file system must let it be created there (tried: a name too long, a read-only or special file
    system such as ``/proc`` is refused now, not after the training).
    """
    if not path:
        return
    skip = "(or '' to skip this output)"
    if path.endswith(("/", os.sep)):
        raise ValueError(f"{option} {path}: ends with '/', so it names a folder; give a file name in it, such as "
                         f"{path}{'timeline.png' if png else 'trace.json'} {skip}")
    target = Path(path)
    longest = max(target.parts, key=lambda part: len(os.fsencode(part)))
    existing = target.parent
    while not _exists(existing) and existing != existing.parent:
        existing = existing.parent
    limit = _name_max(existing)
    if len(os.fsencode(longest)) > limit:
        raise ValueError(f"{option} {path[:40]}...: a name in it is {len(os.fsencode(longest))} bytes long, and "
                         f"this file system allows at most {limit}; choose a shorter name {skip}")
    try:
        if target.is_dir():
            raise ValueError(f"{option} {path}: is a directory; give a file name {skip}")
        if png and target.suffix.lower() != ".png":
            raise ValueError(f"{option} {path}: the picture is a PNG; give a file name ending in .png {skip}")
        if not existing.is_dir():
            raise ValueError(f"{option} {path}: {existing} is a file, so no directory can be made there; choose "
                             f"another path {skip}")
        if not os.access(existing, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
            raise ValueError(f"{option} {path}: not writable; choose another path {skip}")
        _try_creating(target, existing)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ValueError(f"{option} {path}: no file can be created there ({reason}); choose another path "
                         f"{skip}") from None


def _exists(path: Path) -> bool:
    """Whether ``path`` exists (False for a path the system cannot even look up, e.g. a name too long)."""
    try:
        return path.exists()
    except OSError:
        return False


def _name_max(folder: Path) -> int:
    """The longest file name (bytes) the file system holding ``folder`` allows (255 where it cannot say)."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def _try_creating(target: Path, existing: Path) -> None:
    """Create (then remove) the file, or a scratch file in the nearest existing folder: OSError if impossible."""
    if target.parent != existing:
        with tempfile.TemporaryFile(dir=existing):
            return
    if target.exists():
        with open(target, "ab"):  # appends nothing: the file is left as it is
            return
    try:
        handle = open(target, "xb")
    except FileExistsError:  # made meanwhile by someone else: theirs to keep
        return
    handle.close()
    target.unlink()


def write_outputs(outputs: DemoOutputs, timeline: Timeline, pipe: SWPipeline) -> bool:
    """Write the trace JSON and the pictures that ``outputs`` asks for, and say where they are (or why not);
    returns whether every asked-for file was written."""
    lines, failed = [], []
    for option, path in (("--trace", outputs.trace), ("--chart", outputs.chart),
                         ("--schedule-chart", outputs.schedule_chart)):
        if not path:
            continue
        try:
            lines.append(_write_output(option, path, outputs, timeline, pipe))
        except ImportError as exc:
            lines.append(f"pictures skipped: {exc}")
            break
        except OSError as exc:
            failed.append(f"swpipeline demo: error: {option} {path}: could not be written "
                          f"({exc.strerror or exc}); the results above stand")
    if lines:
        print("\n" + "\n".join(lines))
    for line in failed:
        print(line, file=sys.stderr)
    return not failed


def _write_output(option: str, path: str, outputs: DemoOutputs, timeline: Timeline, pipe: SWPipeline) -> str:
    """Write one output; the line saying where it is."""
    if option == "--trace":
        timeline.save_chrome_trace(path)
        return f"trace: {path} (open it at https://ui.perfetto.dev or chrome://tracing)"
    if option == "--chart":
        last = min(outputs.chart_iterations, timeline.num_iterations) - 1
        timeline.save_chart(path, iterations=(0, last),
                            title=f"swpipeline demo, pipelined: iterations 0-{last} of {timeline.num_iterations} "
                                  f"on {timeline.device}")
        return f"timeline chart: {path}"
    pipe.save_schedule_chart(path, SCHEDULE_PERIODS)  # the rows of pipe.print_schedule, in its order
    return f"schedule picture: {path}"
