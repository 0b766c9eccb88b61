"""Stopping the runs nobody stopped: at interpreter exit, and when their pipeline is garbage-collected.

Worker threads are daemon threads, so they never keep the interpreter alive; but a
daemon thread still inside torch code when the interpreter finalizes aborts the
process ("terminate called without an active exception"). So, as concurrent.futures
does for its executors:

* a hook that runs when the interpreter starts shutting down, before it joins threads
  and finalizes (``threading._register_atexit``, else ``atexit``), abandons every run
  still in flight and joins its workers (each within its own join budget, at most
  ``EXIT_JOIN_S``). Runs are registered while they run and leave the registry when they
  stop: no weakref callback is involved, because Python code run while an object is
  freed swallows a Ctrl-C that lands in it ("Exception ignored in ...");
* a pipeline that is garbage-collected has its run abandoned by its own workers, which
  hold a weak reference to it whose callback only queues a note for them (see
  ``worker.Worker.watch``): nothing is joined, and no Python code runs in the collector.

Worker threads reference their run, never the pipeline, so a pipeline nobody refers
to can be collected while its workers wait for work.
"""

from __future__ import annotations

import atexit
import threading
from typing import Dict, List, Protocol

__all__: List[str] = []

EXIT_JOIN_S = 5.0


class Stoppable(Protocol):
    """What the registry needs of a run (``run.Run``)."""

    @property
    def active(self) -> bool: ...

    def threads_alive(self) -> bool: ...

    def stop_at_exit(self, join_timeout: float) -> None:
        """Abandon the run and join its workers within ``join_timeout``."""


_live: Dict[int, Stoppable] = {}  # id -> run, from its start until it stopped


def track(run: Stoppable) -> None:
    """Stop ``run`` at interpreter exit if it is still running then (``forget`` it once it stopped)."""
    for key, old in list(_live.items()):  # runs abandoned without a join (garbage-collected pipelines)
        if not old.active and not old.threads_alive():
            _live.pop(key, None)
    _live[id(run)] = run


def forget(run: Stoppable) -> None:
    _live.pop(id(run), None)


def _stop_all_at_exit() -> None:
    for run in list(_live.values()):
        if run.active:
            try:
                run.stop_at_exit(EXIT_JOIN_S)
            except Exception:  # nothing may stop the interpreter from exiting
                pass


_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_stop_all_at_exit)
else:  # pragma: no cover - Pythons without the hook
    atexit.register(_stop_all_at_exit)
