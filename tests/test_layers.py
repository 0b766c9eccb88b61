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
checking (under ``if TYPE_CHECKING:``) are not counted: they load nothing at run time.
The engine never imports the tools above it: the analysis lends it a race check and the
attributes tasks use through ``engine.hooks`` (it registers itself when imported).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "swpipeline"
LAYERS: List[Tuple[str, ...]] = [("errors", "scoped", "version"), ("plan",),
                                 ("devices", "observe", "shortcut", "training"), ("engine",), ("analysis",),
                                 ("tuning",), ("torchrec", "gpipe", "embcache"), ("cli",)]
LAYER_OF: Dict[str, int] = {part: k for k, parts in enumerate(LAYERS) for part in parts}


def part_of(module: str) -> Optional[str]:
    """``swpipeline.engine.run`` -> ``engine``; the package itself -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, absolute module) of every import of the package made when ``path`` runs."""
    tree = ast.parse(path.read_text())
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    type_only = set()
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
                yield node.lineno, target
                for alias in node.names:  # "from . import blocks": the module imported is the name
                    if (PACKAGE.parent / (target + "." + alias.name).replace(".", "/")).with_suffix(".py").exists():
                        yield node.lineno, f"{target}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("swpipeline"):
                    yield node.lineno, alias.name


def modules() -> List[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py")


def test_every_module_sits_in_a_layer() -> None:
    unplaced = sorted({part_of(module_name(p)) for p in modules()} - set(LAYER_OF))
    assert unplaced == [], f"modules or folders in no layer of tests/test_layers.py: {unplaced}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_layer_above_its_own_or_a_peer(path: Path) -> None:
    mine = part_of(module_name(path))
    assert mine is not None
    wrong = []
    for line, target in runtime_imports(path):
        theirs = part_of(target)
        if theirs is None:
            wrong.append(f"line {line}: imports the package's face `{target}` (import from the module instead)")
        elif theirs != mine and LAYER_OF[theirs] >= LAYER_OF[mine]:
            how = "a peer" if LAYER_OF[theirs] == LAYER_OF[mine] else "a layer above"
            wrong.append(f"line {line}: {mine}/ imports {how}, {target}")
    assert wrong == [], f"{path.relative_to(PACKAGE)}:\n" + "\n".join(wrong)


def test_the_check_sees_a_layer_violation(tmp_path: Path) -> None:
    # The test above must be able to fail: an engine module importing the analysis is caught.
    fake = PACKAGE / "engine" / "run.py"
    found = [t for _, t in runtime_imports(fake)]
    assert all(LAYER_OF[part_of(t) or "engine"] <= LAYER_OF["engine"] for t in found)
    source = tmp_path / "probe.py"
    source.write_text("from ..analysis.races import RaceChecker\n")
    tree = ast.parse(source.read_text())
    node = tree.body[0]
    assert isinstance(node, ast.ImportFrom) and node.level == 2 and node.module == "analysis.races"
    assert LAYER_OF["analysis"] > LAYER_OF["engine"]
