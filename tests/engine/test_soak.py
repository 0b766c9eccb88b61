"""Long runs with several thread groups: every dependency holds in every iteration, memory stays bounded.

The 3,000-iteration soak is marked ``slow`` (``python -m pytest -m slow`` runs it); the default run
checks the same things over 300 iterations.
"""

from __future__ import annotations

import gc
import random
import threading
import weakref
from typing import Any, List

import pytest

from engine_helpers import ExecLog, check_dependencies, make_plan, swp_threads
from swpipeline import IterContext, SimulatedDevice, SWPipeline


# Plans here put several thread groups on one stream on purpose (the turns are what is tested).
pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")


def jitter(seed: int) -> Any:
    rng = random.Random(seed)
    lock = threading.Lock()

    def work(ctx: IterContext) -> None:
        with lock:
            spins = rng.randrange(0, 200)
        for _ in range(spins):  # a little uneven CPU work so threads interleave differently
            pass
    return work


@pytest.mark.parametrize("iters", [300, pytest.param(3000, marks=pytest.mark.slow)])
def test_soak_dependencies_hold_and_memory_is_bounded(iters: int) -> None:
    log = ExecLog()
    live: "weakref.WeakSet[IterContext]" = weakref.WeakSet()
    peak = [0]
    threads_seen = set()

    def track(ctx: IterContext) -> None:
        live.add(ctx)
        peak[0] = max(peak[0], len(live))
        threads_seen.add(threading.active_count())

    spec = {
        "Load": (0, "copy", "io"), "Decode": (0, "copy", "io"),
        "DistStart": (1, "dist", "comm"), "DistWait": (1, "dist", "comm"),
        "Lookup": (2, "emb", "emb"), "Forward": (2, None, "compute"),
        "Backward": (2, None, "compute"), "Step": (2, None, "compute"),
    }
    work = {name: jitter(k) for k, name in enumerate(spec)}
    work["Load"] = track
    plan = make_plan(log, spec,
                     intra=[("Decode", "Load"), ("DistStart", "Decode"), ("DistWait", "DistStart"),
                            ("Lookup", "DistWait"), ("Forward", "Lookup"), ("Backward", "Forward"),
                            ("Step", "Backward")],
                     inter=[("Lookup", "Backward"), ("DistStart", "DistWait"), ("Load", "Decode")],
                     work=work)
    pipe = SWPipeline(plan, device="cpu")
    base_threads = threading.active_count()
    pipe.run(range(iters))
    assert check_dependencies(log, plan, iters) == iters * 7 + (iters - 1) * 3
    for task in plan.task_names:  # every task ran every iteration once, in order
        assert [i for t, i in log.starts() if t == task] == list(range(iters))
    # Contexts alive at once: the depth, plus the one a worker may still hold while moving on.
    assert pipe.depth <= peak[0] <= pipe.depth + 1
    # one worker per thread group, no more; run() runs the last stage's group on this thread
    assert max(threads_seen) == base_threads + 3
    gc.collect()
    assert len(live) == 0 and swp_threads() == []


def test_soak_on_the_simulated_device() -> None:
    sim = SimulatedDevice()
    log = ExecLog()
    spec = {"A": (0, "s0", "g0"), "B": (1, "s1", "g1"), "C": (1, "s0", "g2"), "D": (2, None, "g1")}
    plan = make_plan(log, spec, intra=[("B", "A"), ("C", "A"), ("D", "B"), ("D", "C")],
                     inter=[("A", "B"), ("C", "D"), ("B", "B")])
    pipe = SWPipeline(plan, device=sim)
    n = 1000
    pipe.run(range(n))
    assert check_dependencies(log, plan, n) == n * 4 + (n - 1) * 3
    launches = sim.launches()
    for (task, it), where in launches.items():
        producers: List[Any] = [(d, it) for d in plan.intra[task]]
        producers += [(d, it - back) for d, back in plan.inter[task] if it >= back]
        for producer in producers:
            assert sim.happens_before(launches[producer], where)
