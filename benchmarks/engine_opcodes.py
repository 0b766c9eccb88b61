"""The engines' own work per iteration, counted in Python bytecode instructions: a figure load cannot move.

What is counted
    Every bytecode instruction the interpreter runs during ``pipe.run(range(n))``, on the
    calling thread and on the worker threads apart (``sys.settrace`` with opcode events,
    in every thread), for n = 100 and n = 600 iterations; the difference divided by 500 is
    the count per iteration in the steady state (starting and joining the threads cancel
    out). The task functions are no-ops, so nearly all of it is the engine's: what each
    thread runs between two tasks. Plans:

    * ``one group``, ``three groups``: the 8-task plan of ``overhead.py`` with every task in
      one thread group, or in its three thread groups on their own streams;
    * ``chain``: the 12-task chain of ``vs_handwritten.py`` (6 tasks on the "load" worker,
      6 on the calling thread), with no-op tasks.

    Both engines run every plan, as ``overhead.py`` and ``vs_handwritten.py`` run them
    (``SWPipeline(plan).run``, ``DataFlowPipeline(plan, max_depth=3).run``).

How to read it
    Wall time per instruction varies with the load (about 5-10 ns on this project's
    machine), the count does not: two versions of the engine compare exactly, e.g.
    ``PYTHONPATH=<checkout of another commit>/src python benchmarks/engine_opcodes.py``
    against ``python benchmarks/engine_opcodes.py``. A count with worker threads can move
    by a few instructions between runs (how often a thread finds a signal already set).
    What runs inside C (a builtin, ``map``, ``zip``, a lock) counts as the one instruction
    that calls it, so the count is not time: building a period's units with
    ``list(zip(repeat(p), slots, map(get, ...)))`` instead of a comprehension took 11% off
    the one-group count and made it about 7% slower. Time a change with ``overhead.py`` too.
    Tracing makes the runs some 50x slower; the script takes about 6 s.
"""

from __future__ import annotations

import argparse
import sys
import threading
import warnings
from types import FrameType
from typing import Any, Callable, List, Optional, Tuple

import swpipeline as swp
from _common import format_table, machine_line

import overhead
import vs_handwritten

Tracer = Callable[[FrameType, str, Any], Optional[Callable[..., Any]]]


def _counting() -> Tuple[Tracer, List[int]]:
    """A trace function counting opcodes into ``counts``: [calling thread, other threads]."""
    counts = [0, 0]
    main = threading.main_thread()

    def trace(frame: FrameType, event: str, arg: Any) -> Tracer:
        frame.f_trace_opcodes = True
        if event == "opcode":
            counts[threading.current_thread() is not main] += 1
        return trace

    return trace, counts


def opcodes(pipe: Any, iterations: int) -> Tuple[int, int]:
    """Opcodes run by the calling thread and by the workers during ``pipe.run(range(iterations))``."""
    trace, counts = _counting()
    threading.settrace(trace)
    sys.settrace(trace)
    try:
        pipe.run(range(iterations))
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
    return counts[0], counts[1]


def per_iteration(pipe: Any, short: int = 100, long: int = 600) -> Tuple[float, float]:
    """Opcodes per iteration in the steady state, (calling thread, workers)."""
    pipe.run(range(20))  # warm-up: every code path once
    (caller_a, workers_a), (caller_b, workers_b) = opcodes(pipe, short), opcodes(pipe, long)
    return (caller_b - caller_a) / (long - short), (workers_b - workers_a) / (long - short)


def plans() -> List[Tuple[str, swp.PipelinePlan]]:
    return [("one group", overhead.build_plan(*overhead.CONFIGS["one-group"][:2])),
            ("three groups", overhead.build_plan(*overhead.CONFIGS["three-groups"][:2])),
            ("chain", vs_handwritten.build_plan([overhead.noop] * 12, vs_handwritten.STAGES_3))]


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    warnings.simplefilter("ignore", swp.SharedStreamWarning)
    print(f"Python opcodes per iteration run by the engines, no-op tasks (swpipeline from {swp.__file__})")
    print(machine_line())
    print()
    rows = []
    for name, plan in plans():
        for engine, pipe in (("SWPipeline", swp.SWPipeline(plan, device="cpu")),
                             ("DataFlow(3)", swp.DataFlowPipeline(plan, max_depth=3, device="cpu"))):
            caller, workers = per_iteration(pipe)
            tasks = len(plan.task_names)
            rows.append([name, engine, str(tasks), f"{caller:.0f}", f"{workers:.0f}",
                         f"{(caller + workers) / tasks:.0f}"])
    print(format_table(["plan", "engine", "tasks", "calling thread", "workers", "per task"], rows, left=2))


if __name__ == "__main__":
    main()
