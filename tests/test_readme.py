"""The README a newcomer reads first: short, its two set-up commands honest, its links and figures traceable.

The example's printed output is checked in tests/test_examples.py, the torch dry run's parsing in
tests/test_check_torch_build.py, the GPU figures' page in tests/test_gpu_check.py.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def readme() -> str:
    return README.read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The text under ``## heading``, up to the next ``## `` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def code_blocks(text: str, language: str) -> List[str]:
    """The fenced blocks of ``text`` opened with ```` ```language ```` (an empty language: a bare fence)."""
    blocks, current, opened = [], [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if opened is None:
                opened, current = line[3:].strip(), []
            else:
                if opened == language:
                    blocks.append("\n".join(current) + "\n")
                opened = None
        elif opened is not None:
            current.append(line)
    return blocks


def commands(block: str) -> List[str]:
    """The commands of a shell block: each non-empty line without its trailing comment."""
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()]


def torch_pin() -> str:
    pins = re.findall(r"^torch==(\S+)", (ROOT / "requirements-dev.txt").read_text(), re.MULTILINE)
    assert len(pins) == 1, f"requirements-dev.txt pins torch {len(pins)} times"
    return pins[0]


def test_the_readme_is_short() -> None:
    assert len(readme().splitlines()) < 250


def test_the_quickstart_is_two_commands_the_light_demo_and_the_tests() -> None:
    blocks = code_blocks(section(readme(), "Quickstart"), "bash")
    assert blocks, "the Quickstart has no bash block"
    demo, tests = commands(blocks[0])  # exactly two
    assert demo == f'pip install torch=={torch_pin()} -e ".[plot]" && swpipeline demo'
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert [tests] == ci, ".ci/run must run exactly the README's test command"
    assert tests.endswith("&& python -m pytest") and "-r requirements-dev.txt" in tests


def test_the_light_install_is_the_package_torch_and_matplotlib() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert [re.split(r"[<>=!~ ]", d)[0] for d in project["dependencies"]] == ["torch"]
    assert [re.split(r"[<>=!~ ]", d)[0] for d in project["optional-dependencies"]["plot"]] == ["matplotlib"]


def test_every_command_pins_the_torch_the_tests_run_on() -> None:
    pin = torch_pin()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bounds = re.fullmatch(r"torch>=([\d.]+),<([\d.]+)", project["dependencies"][0])
    assert bounds is not None, project["dependencies"]

    def release(text: str) -> Tuple[int, ...]:
        return tuple(int(p) for p in text.split("."))

    assert release(bounds.group(1)) <= release(pin) < release(bounds.group(2))
    for page in (README, ROOT / "docs" / "install.md", ROOT / "docs" / "index.md"):
        text = page.read_text(encoding="utf-8")
        found = set(re.findall(r"pip install torch==(\S+?)[\s\"]", text))
        assert found == {pin}, f"{page.name} pins torch {sorted(found)}, requirements-dev.txt {pin}"
        assert f"pip install torch=={pin} --index-url {CPU_INDEX}" in text, f"{page.name} lacks the CPU command"


def test_the_cpu_build_command_comes_before_the_quickstart() -> None:
    text = readme()
    cpu = text.index(f"pip install torch=={torch_pin()} --index-url {CPU_INDEX}")
    assert cpu < text.index("\n## Quickstart\n")
    install = section(text, "Install")
    for words in ("PyPI, on Linux", "the CUDA build", "python tools/check_torch_build.py"):
        assert words in install


def test_the_readme_links_the_documentation_home_and_every_link_resolves() -> None:
    text = readme()
    assert "(docs/index.md)" in text
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if target.startswith(("http://", "https://")):
            continue
        assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"


def test_the_readme_speaks_no_design_words() -> None:
    # The words a newcomer has no use for before running anything: they belong to docs/design.md.
    lowered = readme().lower()
    for word in ("two-phase", "period clock", "hand-out", "lane", "turns", "units", "corollar", "seed",
                 "api reference"):
        assert word not in lowered, f"README.md says {word!r}"


def test_every_measured_figure_names_its_command() -> None:
    rows = [line for line in section(readme(), "Measured").splitlines() if line.startswith("| ")][2:]
    assert 4 <= len(rows) <= 8, "one short table"
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert re.fullmatch(r"`(python |swpipeline )[^`]+`", cells[-1]), f"no command in: {row}"
    # docs/measured.md repeats the table, each row with the section that has the whole story.
    page = (ROOT / "docs" / "measured.md").read_text(encoding="utf-8")
    for row in rows:
        assert any(line.startswith(row.rstrip() + " [") for line in page.splitlines()), f"not on measured.md: {row}"


def test_the_demo_output_shown_is_the_demos_format() -> None:
    block = next(b for b in code_blocks(section(readme(), "Quickstart"), "") if b.startswith("mode "))
    lines = block.splitlines()
    assert lines[:2] == ["mode        time (s)   ms/iter  speedup", "---------- --------- --------- --------"]
    serial, pipelined = (float(lines[k].split()[1]) for k in (2, 3))
    assert lines[4] == (f"speedup = serial {serial:.3f} s / pipelined {pipelined:.3f} s: both runs train the same "
                        f"200 batches from the same initial weights on this machine, one after the other")
    assert lines[3].endswith(f"{serial / pipelined:.2f}x")
    assert lines[-1].startswith("losses equal: yes (all 200 iterations bitwise equal")


# Every section the README had before it was cut to a newcomer's page, and the page that now holds it.
MOVED = {
    "install.md": ["## Installing it as a library", "## Running the tests", "pip wheel --no-deps . -w dist"],
    "first_plan.md": ["## One plan, one answer", "Every task needs its own name.", "`SharedStreamWarning`",
                      "`it = pipe.fill_pipeline(loader)`"],
    "tour.md": ["## Is my plan right?", "## Staleness: forward, backward and the step on different stages",
                "## Choosing a plan", "## Measuring what each task costs", "## See what overlaps",
                "## TorchRec's pipelines as plans", "## GPipe", "## The embedding cache"],
    "failures.md": ["# When things go wrong", "**Ctrl-C**"],
    "gpu.md": ["# On a GPU", "**Autocast's weight cache is shared by every thread.**"],
    "demo.md": ["# The demo", "**The speedup\ndepends on the machine more than on the engine.**"],
    "measured.md": ["## Speed goals", "## Engine overhead", "## Efficiency", "## Jitter",
                    "## Against a hand-written pipeline", "## Memory", "## Staleness placements",
                    "## Simulator accuracy", "## Profiler accuracy", "## Against TorchRec",
                    "## GPipe and the embedding cache"],
}


def test_what_left_the_readme_has_a_page() -> None:
    for page, texts in MOVED.items():
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        missing = [t for t in texts if t not in text]
        assert not missing, f"docs/{page} lacks {missing}"
