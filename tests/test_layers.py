"""The package's layers, as folders: a module imports only its own folder and the layers below it.

The layers, lowest first (each folder's ``__init__`` says what it may import)::

    errors.py, scoped.py, version.py  leaves: import nothing of the package
    plan/                             the plan model, its orderings, a task's own random generator
    devices/  observe/  shortcut/     streams and events; what a run leaves to look at; task shortcut;
    training/                         weight versions, used inside tasks (a peer of the three above)
    engine/                           running a plan: the schedule, the release rules, threads, the pipelines
    analysis/                         checking a plan against what its tasks touch
    tuning/                           the tuning: simulate, measure and search plans from measured costs
    torchrec/  gpipe/  embcache/      applications built on the engine
    cli/                              the command line, and the demo it runs (cli/demo/)

Folders on one line are peers: they do not import each other. Imports made only for type
checking (under ``if TYPE_CHECKING:``) are not counted: they load nothing at run time. No
module imports itself back through others, type-only imports included (no import circle).
The engine never imports the tools above it: the analysis lends it a race check and the
attributes tasks use through ``engine.hooks`` (it registers itself when imported).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "swpipeline"
LAYERS: List[Tuple[str, ...]] = [("errors", "scoped", "version"), ("plan",),
                                 ("devices", "observe", "shortcut", "training"), ("engine",), ("analysis",),
                                 ("tuning",), ("torchrec", "gpipe", "embcache", "pp"), ("cli",)]
LAYER_OF: Dict[str, int] = {part: k for k, parts in enumerate(LAYERS) for part in parts}


def part_of(module: str) -> Optional[str]:
    """``swpipeline.engine.run`` -> ``engine``; the package itself -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """Whether ``name`` (``swpipeline.engine.run``) is a module or a subpackage of the package."""
    where = PACKAGE.parent / name.replace(".", "/")
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def imports_in(source: str, module: str, is_package: bool,
               type_only_too: bool = False) -> Iterator[Tuple[int, str, bool]]:
    """(line, absolute module, whether a submodule named in ``from X import name``) of every import of the package
    in ``source``, the text of ``module``; imports made only for type checking only with ``type_only_too``."""
    tree = ast.parse(source)
    package = module if is_package else module.rsplit(".", 1)[0]
    type_only = set()
    if not type_only_too:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                type_only |= {id(n) for child in node.body for n in ast.walk(child)}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("swpipeline"):
                yield node.lineno, target, False
                for alias in node.names:  # "from . import blocks": the module imported is the name
                    if is_module(f"{target}.{alias.name}"):
                        yield node.lineno, f"{target}.{alias.name}", True
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("swpipeline"):
                    yield node.lineno, alias.name, False


def runtime_imports(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, absolute module) of every import of the package made when ``path`` runs."""
    for line, target, _ in imports_in(path.read_text(), module_name(path), path.name == "__init__.py"):
        yield line, target


def layer_violations(module: str, imports: Iterable[Tuple[int, str]]) -> List[str]:
    """Each import of ``module`` that reaches the package's face, a peer folder or a layer above its own."""
    mine = part_of(module)
    assert mine is not None
    wrong = []
    for line, target in imports:
        theirs = part_of(target)
        if theirs is None:
            wrong.append(f"line {line}: imports the package's face `{target}` (import from the module instead)")
        elif theirs != mine and LAYER_OF[theirs] >= LAYER_OF[mine]:
            how = "a peer" if LAYER_OF[theirs] == LAYER_OF[mine] else "a layer above"
            wrong.append(f"line {line}: {mine}/ imports {how}, {target}")
    return wrong


def import_graph() -> Dict[str, Set[str]]:
    """Module -> the package's modules it imports, type-only imports included. ``from X import sub`` is an import
    of the submodule alone (its package is being imported already, as the parent of the importing module)."""
    graph: Dict[str, Set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        found = list(imports_in(path.read_text(), module, path.name == "__init__.py", type_only_too=True))
        subs = {(line, target.rsplit(".", 1)[0]) for line, target, sub in found if sub}
        graph[module] = {target for line, target, sub in found if sub or (line, target) not in subs} - {module}
    return graph


def circles(graph: Mapping[str, Set[str]]) -> List[List[str]]:
    """Every import circle a depth-first walk of ``graph`` meets, each as the path that closes it."""
    found: List[List[str]] = []
    done: Set[str] = set()

    def visit(module: str, path: List[str]) -> None:
        for target in sorted(graph.get(module, ())):
            if target in path:
                found.append(path[path.index(target):] + [target])
            elif target not in done:
                visit(target, path + [target])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    return found


def modules() -> List[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py")


def test_every_module_sits_in_a_layer() -> None:
    unplaced = sorted({part_of(module_name(p)) for p in modules()} - set(LAYER_OF))
    assert unplaced == [], f"modules or folders in no layer of tests/test_layers.py: {unplaced}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_layer_above_its_own_or_a_peer(path: Path) -> None:
    wrong = layer_violations(module_name(path), runtime_imports(path))
    assert wrong == [], f"{path.relative_to(PACKAGE)}:\n" + "\n".join(wrong)


def test_the_check_sees_a_layer_violation(tmp_path: Path) -> None:
    # The test above must be able to fail: a probe file read as if it were engine/probe.py, importing the analysis
    # (a layer above), the torch-free leaves and the plan (below), a peer of devices/ from training/ and, only for
    # type checking, the analysis again (not counted).
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\n"
                      "from ..analysis.races import RaceChecker\n"
                      "from ..errors import ScheduleError\n"
                      "from ..plan import ordering\n"
                      "import swpipeline\n"
                      "if TYPE_CHECKING:\n"
                      "    from ..tuning.costs import TaskCosts\n")
    module = "swpipeline.engine.probe"
    found = [(line, target) for line, target, _ in imports_in(source.read_text(), module, is_package=False)]
    assert layer_violations(module, found) == [
        "line 2: engine/ imports a layer above, swpipeline.analysis.races",
        "line 5: imports the package's face `swpipeline` (import from the module instead)"]
    peer = [(line, target) for line, target, _ in imports_in("from ..devices import device\n",
                                                             "swpipeline.training.probe", is_package=False)]
    assert layer_violations("swpipeline.training.probe", peer) == [
        "line 1: training/ imports a peer, swpipeline.devices",
        "line 1: training/ imports a peer, swpipeline.devices.device"]


def test_no_import_circle_in_the_package_type_only_imports_included() -> None:
    assert circles(import_graph()) == []


def test_the_circle_check_sees_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    graph = import_graph()
    assert "swpipeline.engine.run" in graph["swpipeline.engine.pipeline"]  # it sees the real imports
    assert "swpipeline.engine" not in graph["swpipeline.engine.handout"]  # "from . import paper": the module only
