"""Suite-wide checks: no test may leave a pipeline thread behind (as concurrent.futures' tests check).

A test that deliberately strands a worker (a task that outlives the join timeout) must
release it and join it before it ends; everything else must leave no ``swp-`` thread at
all, the moment it returns. The check runs after every test, in every module.
"""

from __future__ import annotations

import threading
from typing import Iterator

import pytest

from engine_helpers import MakePipe
from swpipeline import DataFlowPipeline, SWPipeline


def _pipeline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("swp-") and t.is_alive()]


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
