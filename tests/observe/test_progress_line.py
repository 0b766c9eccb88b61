"""``run(verbose=True)``'s progress: a redrawn line on a terminal, plain lines in a log file (a fake clock)."""

from __future__ import annotations

import io
from typing import List

from swpipeline.observe.progress_line import ProgressLine


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def drive(bar: ProgressLine, clock: FakeClock, steps: int, seconds_per_step: float) -> None:
    for _ in range(steps):
        clock.now += seconds_per_step
        bar.step()
    bar.close()


def test_a_log_file_gets_a_plain_line_every_tenth_and_no_carriage_return() -> None:
    log, clock = io.StringIO(), FakeClock()
    drive(ProgressLine("SWPipeline", 20, stream=log, clock=clock), clock, 20, 0.5)
    assert "\r" not in log.getvalue()
    assert log.getvalue().splitlines() == [f"SWPipeline: {k}/20 iterations, 500.000 ms/iter" for k in range(2, 21, 2)]


def test_a_log_file_ends_with_the_final_count_when_the_run_stops_early() -> None:
    log, clock = io.StringIO(), FakeClock()
    drive(ProgressLine("SWPipeline (serial)", 100, stream=log, clock=clock), clock, 25, 0.002)
    assert log.getvalue().splitlines() == ["SWPipeline (serial): 10/100 iterations, 2.000 ms/iter",
                                           "SWPipeline (serial): 20/100 iterations, 2.000 ms/iter",
                                           "SWPipeline (serial): 25/100 iterations, 2.000 ms/iter"]


def test_without_a_total_a_log_file_gets_a_line_every_ten_seconds() -> None:
    log, clock = io.StringIO(), FakeClock()
    drive(ProgressLine("DataFlowPipeline", None, stream=log, clock=clock), clock, 9, 3.0)
    assert log.getvalue().splitlines() == ["DataFlowPipeline: 4 iterations, 3000.000 ms/iter",
                                           "DataFlowPipeline: 8 iterations, 3000.000 ms/iter",
                                           "DataFlowPipeline: 9 iterations, 3000.000 ms/iter"]


def test_an_empty_run_still_says_so_once() -> None:
    log, clock = io.StringIO(), FakeClock()
    drive(ProgressLine("SWPipeline", 0, stream=log, clock=clock), clock, 0, 1.0)
    assert log.getvalue() == "SWPipeline: 0/0 iterations, 0.000 ms/iter\n"


def test_a_terminal_gets_one_line_redrawn_in_place() -> None:
    tty, clock = Terminal(), FakeClock()
    drive(ProgressLine("SWPipeline", 3, stream=tty, clock=clock), clock, 3, 0.25)
    draws: List[str] = tty.getvalue().split("\r")
    assert draws == ["", "SWPipeline: 1/3 iterations, 250.000 ms/iter",
                     "SWPipeline: 2/3 iterations, 250.000 ms/iter",
                     "SWPipeline: 3/3 iterations, 250.000 ms/iter",
                     "SWPipeline: 3/3 iterations, 250.000 ms/iter\n"]
    assert tty.getvalue().count("\n") == 1
