"""TaskProfiler: how much of a serial iteration each task really costs.

For each task T, the *exposed* time is what a serial iteration saves when T is
shortcut (replayed from its cache instead of run)::

    exposed(T) = max(0, median over rounds of (baseline - iteration time with T shortcut))

It counts what T costs on the critical path of one iteration, including what it
makes the device wait for, and excludes what overlaps with other work anyway.

Each timed block runs ``num_measure`` iterations between two device
synchronizations, so the figure includes device time without syncing per
iteration. Every shortcut block is measured right after a baseline block and the
two are subtracted: on a steady machine this equals ``median baseline - median
shortcut``; when the machine's speed drifts (other processes, clocks), the paired
difference cancels the drift that separate medians would report as cost.
``baseline_s`` is the median of all baseline blocks.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set

if TYPE_CHECKING:
    from ..engine.pipeline import _PipelineBase

__all__: List[str] = []


@dataclass(frozen=True)
class ProfileResult:
    """The outcome of ``TaskProfiler.profile``.

    Attributes:
        baseline_s: median wall-clock seconds of one serial iteration.
        exposed_s: task name -> exposed seconds: what a serial iteration saves when
            that task is shortcut (median of paired differences, floored at 0).
    """

    baseline_s: float
    exposed_s: Dict[str, float] = field(default_factory=dict)

    def format_report(self) -> str:
        """The report as text: baseline, then each task's exposed time and share, then the sum."""
        rule = f"{'-' * 24} {'-' * 10} {'-' * 12}"
        lines = [f"Baseline serial iteration: {self.baseline_s * 1e3:.3f} ms", "",
                 f"{'Task':<24} {'Exposed':>10} {'% baseline':>12}", rule]
        for name, seconds in self.exposed_s.items():
            lines.append(f"{name:<24} {seconds * 1e3:>8.3f}ms {self._share(seconds):>11.1f}%")
        total = sum(self.exposed_s.values())
        lines += [rule, f"{'SUM':<24} {total * 1e3:>8.3f}ms {self._share(total):>11.1f}%"]
        return "\n".join(lines)

    def print_report(self) -> None:
        """Print ``format_report()``."""
        print(self.format_report())

    def _share(self, seconds: float) -> float:
        return 100.0 * seconds / self.baseline_s if self.baseline_s > 0 else 0.0


class TaskProfiler:
    """Measures every task's exposed time on a pipeline's serial path, using task shortcut.

    Args:
        pipe: an SWPipeline or DataFlowPipeline (not running: no fill_pipeline() in progress).
    """

    def __init__(self, pipe: "_PipelineBase") -> None:
        from ..engine.pipeline import _PipelineBase

        if not isinstance(pipe, _PipelineBase):
            raise TypeError(f"TaskProfiler needs an SWPipeline or DataFlowPipeline, got {type(pipe).__name__}")
        self.pipe = pipe

    def profile(self, batch: Any, num_warmup: int = 3, num_measure: int = 10, num_rounds: int = 3,
                skip_tasks: Optional[Set[str]] = None) -> ProfileResult:
        """Profile one representative batch.

        Args:
            batch: a representative batch.
            num_warmup: serial iterations run before measuring.
            num_measure: iterations per timed round.
            num_rounds: rounds per measurement; the median round counts.
            skip_tasks: tasks not to shortcut on their own (e.g. a backward that needs its forward).

        Raises:
            ValueError: a count below 1, or an unknown name in ``skip_tasks``.
        """
        for arg, value in (("num_warmup", num_warmup), ("num_measure", num_measure), ("num_rounds", num_rounds)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if arg == "num_warmup" else 1):
                raise ValueError(f"{arg} must be an int >= {0 if arg == 'num_warmup' else 1}, got {value!r}")
        skip = set(skip_tasks or ())
        unknown = skip - set(self.pipe.plan.task_names)
        if unknown:
            raise ValueError(f"skip_tasks: unknown task(s) {sorted(unknown)} (known: {self.pipe.plan.task_names})")
        pipe = self.pipe
        with pipe.without_shortcuts():  # refuses while iterations are in flight
            for k in range(num_warmup):
                pipe.run_one_serial_iter(batch, k)
            names = [name for name in pipe.serial_order if name not in skip]
            baselines: List[float] = []
            savings: Dict[str, List[float]] = {name: [] for name in names}
            for _ in range(num_rounds):
                for name in names:  # each shortcut block right after its own baseline block
                    baselines.append(self._timed_round(batch, num_measure))
                    pipe.enable_shortcut(name)
                    pipe.run_one_serial_iter(batch, 0)  # caching run, not timed
                    savings[name].append(baselines[-1] - self._timed_round(batch, num_measure))
                    pipe.disable_shortcut(name)
                if not names:
                    baselines.append(self._timed_round(batch, num_measure))
        exposed = {name: max(0.0, statistics.median(savings[name])) for name in names}
        return ProfileResult(statistics.median(baselines), exposed)

    def profile_many(self, batches: Sequence[Any], **kwargs: Any) -> List[ProfileResult]:
        """``profile`` each batch in turn (same keyword arguments)."""
        return [self.profile(batch, **kwargs) for batch in batches]

    def _timed_round(self, batch: Any, num_measure: int) -> float:
        """Seconds per iteration over ``num_measure`` serial iterations, between two device syncs."""
        self.pipe.device.synchronize()
        start = time.perf_counter()
        for k in range(num_measure):
            self.pipe.run_one_serial_iter(batch, k)
        self.pipe.device.synchronize()
        return (time.perf_counter() - start) / num_measure
