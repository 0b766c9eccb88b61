"""Suite-wide checks: no test may leave a pipeline thread behind (as concurrent.futures' tests check).

A test that deliberately strands a worker (a task that outlives the join timeout) must
release it and join it before it ends; everything else must leave no ``swp-`` thread at
all, the moment it returns. The check runs after every test, in every module.

Tests marked ``slow`` are skipped unless a ``-m`` expression picks the tests to run
(``python -m pytest -m slow`` runs only them).

A suite started in the background by a shell without job control inherits SIGINT ignored,
and so would every process its tests start (Python leaves an ignored SIGINT ignored): the
Ctrl-C tests would find their signal lost. The suite makes it live again, once.
"""

from __future__ import annotations

import signal
import threading
from typing import Iterator, List

import pytest

from engine_helpers import MakePipe
from swpipeline import DataFlowPipeline, SWPipeline


if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _pipeline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("swp-") and t.is_alive()]


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if config.getoption("markexpr"):
        return
    skip_slow = pytest.mark.skip(reason="slow: python -m pytest -m slow runs the slow tests")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip_slow)


@pytest.fixture(autouse=True)
def no_thread_leaks() -> Iterator[None]:
    before = set(_pipeline_threads())
    yield
    leaked = [t.name for t in _pipeline_threads() if t not in before]
    assert not leaked, f"pipeline threads still alive after the test: {leaked}"


@pytest.fixture(params=["SWPipeline", "DataFlowPipeline"])
def make_pipe(request: pytest.FixtureRequest) -> MakePipe:
    """Both engines, with the same depth (3) for the SparseDist-like plans of the engine tests."""
    if request.param == "SWPipeline":
        return SWPipeline
    return lambda plan, **kw: DataFlowPipeline(plan, max_depth=3, **kw)
