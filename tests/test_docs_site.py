"""The documentation site: mkdocs builds it in strict mode, and its API reference covers the public API.

One strict build (a few seconds) serves every test here. Strict mode turns every warning into a failure:
a broken link or anchor in docs/, a docstring griffe cannot parse, a ``::: name`` that does not resolve.
"""

from __future__ import annotations

import ast
import html
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import pytest

import swpipeline

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 300

# Each concept's reference page (docs/reference/<page>.md) and objects it must document.
REFERENCE_PAGES: Dict[str, List[str]] = {
    "plans": ["PipelinePlan", "PipelineTask", "TaskSchedule", "IterContext"],
    "engines": ["SWPipeline", "DataFlowPipeline", "SWPipeline.run", "SWPipeline.run_serial"],
    "step_by_step": ["SWPipeline.fill_pipeline", "SWPipeline.progress", "SWPipeline.advance", "SWPipeline.drain",
                     "SWPipeline.abandon", "SWPipeline.last_context"],
    "failures": ["PipelineTimeoutError", "DependencyTimeoutError", "SequencerTimeoutError", "ProgressTimeoutError",
                 "FreedAttributeError"],
    "tracing": ["SWPipeline.stats", "SWPipeline.timeline", "SWPipeline.tracing", "SWPipeline.save_schedule_chart",
                "Timeline", "RunStats", "TaskStats", "TaskRecord", "DependencyWait"],
    "shortcut": ["SWPipeline.enable_shortcut", "DeclaredIO", "TaskProfiler", "ProfileResult"],
    "checking": ["analyze", "PlanAnalysis", "infer_deps", "RaceChecker", "RaceError"],
    "training": ["WeightVersions", "VersionStats"],
    "choosing": ["simulate", "SimResult", "TaskCosts", "TaskCost", "autoplan", "search_plan", "PlanSearch",
                 "calibrate", "EngineOverheads"],
    "devices": ["Device", "CPUDevice", "TorchDevice", "SimulatedDevice"],
    "torchrec": ["torchrec"],
    "gpipe": ["gpipe"],
    "embcache": ["embcache"],
}
SUBPACKAGES = ("torchrec", "gpipe", "embcache")
GUIDES = ("design", "observability", "torchrec", "is_my_plan_right", "choosing_a_plan", "staleness", "gpipe",
          "embcache")
# The newcomer's pages, which hold what the README had before it was cut short; the home page links each.
GETTING_STARTED = ("install", "demo", "first_plan", "tour", "failures", "gpu", "measured")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = [m for m in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python") if not _installed(m)]
    if missing:
        pytest.fail(f"the documentation tools are not installed ({', '.join(missing)}): "
                    f"pip install -r requirements-dev.txt", pytrace=False)
    out = tmp_path_factory.mktemp("site")
    try:
        proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                              cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        output = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        pytest.fail(f"mkdocs build did not finish within {BUILD_TIMEOUT_S} s:\n{output}", pytrace=False)
    assert proc.returncode == 0, (f"`python -m mkdocs build --strict` failed (exit {proc.returncode}); "
                                  f"its output:\n{proc.stderr}\n{proc.stdout}")
    return out


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package is missing
        return False


def _page(site: Path, path: str) -> str:
    page = site / path / "index.html"
    assert page.is_file(), f"the built site has no page {path}/ (is docs/{path}.md in mkdocs.yml's nav?)"
    return page.read_text(encoding="utf-8")


def _documented(page: str) -> Set[str]:
    """The objects a built page documents: mkdocstrings gives each one's heading its full path as id."""
    return {html.unescape(m) for m in re.findall(r'<h\d id="(swpipeline\.[^"]+)"', page)}


def _subpackage_all(name: str) -> List[str]:
    """A subpackage's ``__all__``, read from its source (importing swpipeline.torchrec needs TorchRec)."""
    tree = ast.parse((ROOT / "src" / "swpipeline" / name / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            names = ast.literal_eval(value)
            assert isinstance(names, list)
            return [str(n) for n in names]
    raise AssertionError(f"swpipeline.{name} has no __all__")


def test_every_reference_concept_has_a_page(site: Path) -> None:
    home = _page(site, ".")
    for name, objects in REFERENCE_PAGES.items():
        documented = _documented(_page(site, f"reference/{name}"))
        missing = [o for o in objects if f"swpipeline.{o}" not in documented]
        assert not missing, f"reference/{name}: no documentation of {missing}"
        assert f'href="reference/{name}/"' in home, f"the home page does not link to reference/{name}/"
    for guide in GUIDES:
        _page(site, guide)
    for page in GETTING_STARTED:
        _page(site, page)
        assert f'href="{page}/"' in home, f"the home page does not link to {page}/"


def test_every_public_name_is_in_the_reference(site: Path) -> None:
    documented = set().union(*(_documented(_page(site, f"reference/{name}")) for name in REFERENCE_PAGES))
    missing = [name for name in swpipeline.__all__ if f"swpipeline.{name}" not in documented]
    assert not missing, (f"swpipeline.__all__ names missing from the API reference: {missing}; add a "
                         f"`::: swpipeline.NAME` line to the page of docs/reference/ for its concept")
    for package in SUBPACKAGES:
        missing = [n for n in _subpackage_all(package) if f"swpipeline.{package}.{n}" not in documented]
        assert not missing, f"swpipeline.{package}.__all__ names missing from reference/{package}: {missing}"


def test_written_pages_stand_alone() -> None:
    # The pages written for the site explain the rules themselves, without pointing at working notes.
    pages = [ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "reference").glob("*.md"))]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for word in ("seed", "corollar", "api reference document", "shared/"):
            assert word not in text.lower(), f"{page.relative_to(ROOT)} mentions {word!r}"


def test_getting_started_pages_stand_alone() -> None:
    # They speak to a newcomer: the rules themselves, not where they were written down first.
    for name in GETTING_STARTED:
        text = (ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8").lower()
        for word in ("seeds/", "seed file", "corollar", "the api reference", "shared/"):
            assert word not in text, f"docs/{name}.md mentions {word!r}"


def _internal_modules() -> Set[str]:
    """Module names inside the package that the reference does not document (everything but the subpackages)."""
    package = ROOT / "src" / "swpipeline"
    found = {p.stem for p in package.rglob("*.py") if p.stem != "__init__"}
    found |= {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    words = {"plan", "schedule", "timeline", "device", "stats", "records", "modes", "errors", "cache", "table",
             "tasks", "stages", "streams", "cells", "plans", "feed", "pipeline", "partition", "randomness",
             "costs", "model", "config", "data", "job", "runs", "report", "outputs", "command", "prepare", "steps",
             "batches", "optim", "blocks", "compat", "variants"}
    return found - set(SUBPACKAGES) - words  # module names that are also everyday words of the docstrings


def test_reference_pages_never_send_the_reader_to_internal_modules(site: Path) -> None:
    # A docstring on the site that says "see ordering.longest_stage_chain" or "see checkpoint.py" points at
    # code the reference does not show: say the rule itself instead.
    internal = _internal_modules()
    for name in REFERENCE_PAGES:
        text = html.unescape(re.sub(r"<[^>]+>", " ", _page(site, f"reference/{name}")))
        text = re.sub(r"\s+", " ", text)
        files = sorted(set(re.findall(r"\b\w+\.py\b", text)))
        assert not files, f"reference/{name} names source files: {files}"
        dotted = sorted({m for m, ext in re.findall(r"\b([a-z_]+)\.([a-z_]+)\b", text)
                         if m in internal and ext not in ("json", "png", "html", "md", "txt", "csv")})
        assert not dotted, f"reference/{name} names internal modules: {dotted}"
