"""A run is made whole from narrow parts that do not know each other, and one part owns the data iterator; the engine's
modules import each other without a circle, type-only imports included.

The story: a run used to get its hand-out, data source and modes attached after it was made; the hand-out read six
of the run's attributes, the run reached the hand-out through ``getattr(self, "handout", None)``, ``handout.py`` and
``run.py`` imported each other (type-only), and the data iterator was held in three places (the run, the hand-out
and a held step), so letting go of it meant finding them all.
"""

from __future__ import annotations

import ast
import gc
from pathlib import Path
from typing import Any, Dict, List, Set

import pytest

from swpipeline import DataFlowPipeline, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule

ENGINE = Path(__file__).resolve().parents[2] / "src" / "swpipeline" / "engine"


def noop(ctx: object) -> None:
    return None


def two_groups() -> PipelinePlan:
    a, b = PipelineTask("A", noop), PipelineTask("B", noop)
    return PipelinePlan({a: TaskSchedule(stage=0, thread_group="a", stream="a"),
                         b: TaskSchedule(stage=1, thread_group="b", stream="b")}, intra_iter_deps=[(b, a)])


def engine_imports(path: Path) -> Set[str]:
    """The engine modules ``path`` imports, at run time or for type checking alone."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found |= {alias.name for alias in node.names}
    return {name for name in found if (ENGINE / f"{name}.py").exists()}


def test_the_engine_modules_import_each_other_without_a_circle() -> None:
    graph: Dict[str, Set[str]] = {p.stem: engine_imports(p) for p in ENGINE.glob("*.py")}
    circles: List[List[str]] = []
    done: Set[str] = set()

    def visit(module: str, path: List[str]) -> None:  # depth first; an import back into the path is a circle
        for target in sorted(graph[module]):
            if target in path:
                circles.append(path[path.index(target):] + [target])
            elif target not in done:
                visit(target, path + [target])
        done.add(module)

    for module in sorted(graph):
        visit(module, [module])
    assert circles == []


@pytest.mark.parametrize("part", ["handout", "feed", "crew", "run_state"])
def test_no_part_of_a_run_knows_the_run(part: str) -> None:
    assert "run" not in engine_imports(ENGINE / f"{part}.py")


@pytest.mark.parametrize("engine", ["clocked", "dataflow"])
def test_the_data_iterator_has_one_owner(engine: str) -> None:
    pipe: Any = SWPipeline(two_groups(), device="cpu") if engine == "clocked" else \
        DataFlowPipeline(two_groups(), max_depth=2, device="cpu")
    with pipe:  # (abandoned if an assertion fails)
        first = pipe.fill_pipeline(range(10))
        later = iter(range(100, 110))
        pipe.progress(first)
        pipe.progress(later, advance=False)  # a held step: advance() draws from the iterator it was given
        run = pipe._run
        check_owners(run, first, later)
        pipe.advance()
        assert pipe.contexts_in_flight()[-1].batch == 100  # drawn from the later iterator, by advance()
    assert run.feed.source is None and run.feed.contexts == {}  # let go of when the run stopped


def check_owners(run: Any, first: Any, later: Any) -> None:
    """Of the engine's objects, only the feed holds the iterator it draws from, and nothing holds the one before."""
    for it, owners in ((first, []), (later, [run.feed])):
        assert [r for r in gc.get_referrers(it) if type(r).__module__.startswith("swpipeline")] == owners
