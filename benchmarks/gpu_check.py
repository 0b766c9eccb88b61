"""Every GPU check of the project in one command, with one summary table: run it first on a machine with a GPU.

    python benchmarks/gpu_check.py [--out DIR] [--budget-s 510]

The steps run in this order, the most telling first, each bounded in time (a step
that overruns is stopped and reported, and the next one starts), all within
``--budget-s`` seconds (8.5 minutes by default, so a 15-minute GPU lease leaves room
to fix something and run it again):

1. ``python -m pytest -m cuda``: one test per GPU hazard, GPipe on the GPU;
2. ``swpipeline demo --device cuda``: the demo's training loop on the GPU (losses
   bitwise equal to the serial run, and the speedup);
3. ``benchmarks/gpu_overlap.py``: a 64 MiB copy hidden behind compute, both engines
   against the serial loop and a hand-written two-stream loop;
4. ``benchmarks/gpu_apps.py``: GPipe and the embedding cache on the GPU, each
   checked against its reference, with their step times;
5. ``benchmarks/pp_vs_pipelining.py --device cuda``: swpipeline.pp with every stage on
   the GPU, two gloo ranks sharing it (NCCL refuses two ranks on one GPU, and gloo carries
   only CPU tensors, so torch's stages cannot run there), then one rank holding every
   stage, next to torch.distributed.pipelining; each schedule's ms/step and whether its
   gradients equal the one-process model's on the GPU, bit for bit.

With ``--suite SECONDS`` the whole test suite runs after them, for at most that long (beyond
the budget), each test named as it ends, so that a run stopped by its time limit still says
which tests failed.

It writes DIR/gpu_check.log (every step's whole output), DIR/summary.md (the table
it prints at the end) and DIR/readme_section.md, the GPU figures as measured. Back on
a machine with the checkout, ``python benchmarks/gpu_check.py --update-readme
DIR/readme_section.md`` puts that section into docs/gpu.md, between its ``gpu-check``
markers.

On a machine whose torch is older than the package asks for (a GPU image with its own
torch), the package is imported from ``src/`` (PYTHONPATH), as the tests are.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- gpu-check: begin -->", "<!-- gpu-check: end -->"
GPU_PAGE = ROOT / "docs" / "gpu.md"  # the page whose marked block holds the latest GPU figures


@dataclass
class Step:
    name: str
    argv: List[str]
    timeout_s: float
    figures: Callable[[str], str]  # the output -> the figures worth a line of the summary


@dataclass
class Outcome:
    step: Step
    status: str  # "ok", "FAILED (exit N)", "TIMED OUT", "skipped"
    seconds: float
    output: str

    @property
    def figures(self) -> str:
        try:
            return self.step.figures(self.output)
        except Exception as exc:  # a summary line must never hide the outcome
            return f"(figures unreadable: {type(exc).__name__})"


def pytest_figures(output: str) -> str:
    """``14 passed, 2 skipped`` from pytest's last line, and the tests that failed by name (a run stopped by its
    time limit prints no summary, but ``-v`` has named each test as it ended)."""
    found = re.findall(r"(\d+ (?:passed|failed|skipped|errors?|deselected))", output.strip().splitlines()[-1]
                       if output.strip() else "")
    counts = ", ".join(f for f in found if not f.endswith("deselected")) or "no test summary"
    failed = sorted(set(re.findall(r"^(\S+::\S+) (?:FAILED|ERROR)", output, re.M))
                    | set(re.findall(r"(?:^|\] )(?:FAILED|ERROR) (\S+::\S+)", output, re.M)))  # (xdist: "[gw0] [ 1%] ")
    return counts + (f"; failed: {', '.join(failed)}" if failed else "")


def demo_figures(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines()]
    keep = [ln for ln in lines if re.search(r"bitwise|speedup|\d+\.\d+x", ln)]
    return "; ".join(keep[-3:]) or "no result line"


def table_rows(output: str, first_cells: Sequence[str]) -> List[List[str]]:
    """The rows of a plain-text table printed by a benchmark whose first cell is one of ``first_cells``."""
    rows = []
    for line in output.splitlines():
        for name in first_cells:
            if line.startswith(name + " ") or line == name:
                rows.append([name] + line[len(name):].split())
    return rows


def overlap_figures(output: str) -> str:
    rows = table_rows(output, ["serial", "SWPipeline", "DataFlowPipeline(3)", "hand-written"])
    return "; ".join(f"{r[0]} {r[1]} ms/it, {r[3]}, copy hidden {r[4]}" for r in rows if len(r) >= 5) or "no table"


def apps_figures(output: str) -> str:
    keep = [ln.strip() for ln in output.splitlines() if ln.startswith(("GPipe", "embcache"))]
    return "; ".join(keep) or "no result line"


PP_STEPS = ("pp_vs_pipelining.py --device cuda", "pp_vs_pipelining.py --device cuda --ranks 1")


def pp_rows(output: str) -> List[Dict[str, str]]:
    """Each row of pp_vs_pipelining.py's tables: model, ranks, the one-process ms/step, schedule, library, ms/step,
    speed against torch's (empty where torch did not run) and whether it was exact."""
    rows, head = [], None
    for line in output.splitlines():
        found = re.match(r"(\w+): (\d+) \w+ ranks? on \w+, .*one thread: ([\d.]+) ms/step", line)
        if found:
            head = {"model": found.group(1), "ranks": found.group(2), "single": found.group(3)}
            continue
        cells = line.split()  # an empty "vs torch" cell (torch not run) leaves one cell fewer
        if head and len(cells) >= 9 and cells[1] in ("torch", "swpipeline") and cells[-1] in ("yes", "NO"):
            rows.append(dict(head, schedule=cells[0], library=cells[1], ms=cells[2], exact=cells[-1],
                             versus=cells[8] if len(cells) == 10 else ""))
    return rows


def pp_figures(output: str) -> str:
    """How many schedules were exact, and their speed against torch's where it ran (the times: the table)."""
    rows = pp_rows(output)
    if not rows:
        return "no table"
    ours = [r for r in rows if r["library"] == "swpipeline"]
    text = f"exact: {sum(r['exact'] == 'yes' for r in ours)} of {len(ours)} (model, schedule)"
    versus = [float(r["versus"]) for r in ours if r["versus"]]
    if versus:
        text += f"; {min(versus):.2f}-{max(versus):.2f}x torch's speed"
    return text + "; ms/step in the table below"


def pp_table(outcomes: Sequence[Outcome]) -> str:
    """The pp steps' ms/step side by side: two ranks sharing the GPU, one rank holding every stage."""
    by_key: Dict[Tuple[str, str], Dict[str, str]] = {}
    for outcome in outcomes:
        if outcome.step.name in PP_STEPS:
            for r in pp_rows(outcome.output):
                if r["library"] == "swpipeline":
                    entry = by_key.setdefault((r["model"], r["schedule"]), {"single": r["single"]})
                    entry[r["ranks"]] = f"{r['ms']}" + ("" if r["exact"] == "yes" else " (NOT exact)")
    if not by_key:
        return ""
    lines = ["| model | schedule | one process, ms/step | 2 ranks sharing the GPU | 1 rank holding every stage |",
             "|---|---|---|---|---|"]
    lines += [f"| {model} | {schedule} | {e['single']} | {e.get('2', '')} | {e.get('1', '')} |"
              for (model, schedule), e in by_key.items()]
    return ("\n\n`pp_vs_pipelining.py --device cuda` (swpipeline.pp, 8 microbatches, ms/step; every result equal "
            "to the one-process model's on the GPU, bit for bit, unless marked):\n\n" + "\n".join(lines))


def steps(python: str) -> List[Step]:
    bench = ROOT / "benchmarks"
    pp = [python, str(bench / "pp_vs_pipelining.py"), "--device", "cuda", "--models", "tiny", "mlp", "transformer",
          "--rounds", "3", "--steps", "5", "--libraries", "swpipeline"]  # torch's cannot run on one GPU (docs/gpu.md)
    return [
        Step("pytest -m cuda", [python, "-m", "pytest", "-m", "cuda", "-v", "-rfE", "-p", "no:cacheprovider"], 200,
             pytest_figures),
        Step("swpipeline demo --device cuda", [python, "-m", "swpipeline.cli", "demo", "--device", "cuda",
                                               "--chart", "", "--schedule-chart", "", "--trace", ""], 90,
             demo_figures),
        Step("gpu_overlap.py", [python, str(bench / "gpu_overlap.py"), "--iters", "100"], 90, overlap_figures),
        Step("gpu_apps.py", [python, str(bench / "gpu_apps.py")], 100, apps_figures),
        Step("pp_vs_pipelining.py --device cuda", pp, 75, pp_figures),
        Step("pp_vs_pipelining.py --device cuda --ranks 1", pp + ["--ranks", "1"], 75, pp_figures),
    ]


def suite_step(python: str, timeout_s: float) -> Step:
    """The whole test suite on the GPU's machine (``--suite``), its workers one per core but two, each test named
    as it ends (so a run stopped by the time limit still says which failed)."""
    workers = max(1, (os.cpu_count() or 2) - 2)
    return Step("pytest (the whole suite)", [python, "-m", "pytest", "-n", str(workers), "-v", "-rfE", "-p",
                                             "no:cacheprovider", "--deselect", "tests/test_docs_site.py"],
                timeout_s, pytest_figures)


def environment() -> dict[str, str]:
    """This process's environment, with src/ on the path when the installed package is not this checkout's."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_step(step: Step, left_s: float, env: dict[str, str]) -> Outcome:
    if left_s < 10:
        return Outcome(step, "skipped", 0.0, "(no time left in the budget)")
    start = time.perf_counter()
    try:
        proc = subprocess.run(step.argv, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=min(step.timeout_s, left_s), start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return Outcome(step, "TIMED OUT", time.perf_counter() - start, out)
    output = proc.stdout + ("\n" + proc.stderr if proc.stderr.strip() else "")
    status = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
    return Outcome(step, status, time.perf_counter() - start, output)


def summary(outcomes: Sequence[Outcome], gpu: str, torch_version: str) -> str:
    lines = [f"GPU: {gpu}; torch {torch_version}; Python {platform.python_version()}; "
             f"{datetime.date.today().isoformat()}", "",
             "| check | result | seconds | figures |", "|---|---|---|---|"]
    lines += [f"| `{o.step.name}` | {o.status} | {o.seconds:.0f} | {o.figures} |" for o in outcomes]
    return "\n".join(lines)


def readme_section(outcomes: Sequence[Outcome], gpu: str, torch_version: str) -> str:
    """The GPU figures for docs/gpu.md's marked block, as this run measured them."""
    head = (f"**Measured on an {gpu}** (torch {torch_version}, Python {platform.python_version()}, "
            f"{datetime.date.today().isoformat()}; `python benchmarks/gpu_check.py`, which runs every check "
            f"below in one command):")
    rows = ["| check | result | figures |", "|---|---|---|"]
    rows += [f"| `{o.step.name}` | {o.status} | {o.figures} |" for o in outcomes]
    overlap = next((o for o in outcomes if o.step.name == "gpu_overlap.py"), None)
    table = ""
    if overlap is not None:
        found = table_rows(overlap.output, ["serial", "SWPipeline", "DataFlowPipeline(3)", "hand-written"])
        if found:
            table = ("\n\n`gpu_overlap.py` (64 MiB pinned copy + 8 matmuls of 2048 per iteration, 100 iterations, "
                     "GPU time per iteration):\n\n| method | ms/iter | speedup | copy hidden | peak MiB |\n"
                     "|---|---|---|---|---|\n"
                     + "\n".join(f"| {r[0]} | {r[1]} | {r[3]} | {r[4]} | {r[5]} |" for r in found if len(r) >= 6))
    return "\n".join([head, "", *rows]) + table + pp_table(outcomes) + "\n"


def update_readme(section_file: Path, readme: Path = GPU_PAGE) -> None:
    """Put ``section_file``'s text between the gpu-check markers of ``readme`` (docs/gpu.md)."""
    text = readme.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text or text.index(BEGIN) > text.index(END):
        raise SystemExit(f"gpu_check: {readme} has no {BEGIN} ... {END} block to replace")
    section = section_file.read_text(encoding="utf-8").strip()
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    readme.write_text(f"{before}{BEGIN}\n{section}\n{END}{after}", encoding="utf-8")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "out/gpu_check", help="where the logs go")
    parser.add_argument("--budget-s", type=float, default=510.0, help="stop starting steps after this many seconds")
    parser.add_argument("--suite", type=float, default=0.0, metavar="SECONDS",
                        help="then run the whole test suite too, for at most SECONDS (outside --budget-s)")
    parser.add_argument("--update-readme", metavar="SECTION_MD", default=None,
                        help="put a readme_section.md from a GPU run into docs/gpu.md, and do nothing else")
    args = parser.parse_args(argv)
    if args.update_readme is not None:
        update_readme(Path(args.update_readme))
        print(f"{GPU_PAGE.relative_to(ROOT)}: the GPU section now holds {args.update_readme}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False); run it on a machine with one")
        return 2
    gpu = torch.cuda.get_device_name()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env, deadline = environment(), time.perf_counter() + args.budget_s
    outcomes = []
    with open(out / "gpu_check.log", "w", encoding="utf-8") as log:
        suite = [suite_step(sys.executable, args.suite)] if args.suite else []
        for step in steps(sys.executable) + suite:
            print(f"gpu_check: {step.name} ...", flush=True)
            outcome = run_step(step, step.timeout_s if step in suite else deadline - time.perf_counter(), env)
            outcomes.append(outcome)
            log.write(f"===== {step.name}: {outcome.status}, {outcome.seconds:.0f} s\n{outcome.output}\n")
            log.flush()
            print(f"gpu_check: {step.name}: {outcome.status} in {outcome.seconds:.0f} s", flush=True)
    table = summary(outcomes, gpu, torch.__version__)
    (out / "summary.md").write_text(table + "\n", encoding="utf-8")
    (out / "readme_section.md").write_text(readme_section(outcomes, gpu, torch.__version__), encoding="utf-8")
    print("\n" + table)
    return 0 if all(o.status == "ok" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
