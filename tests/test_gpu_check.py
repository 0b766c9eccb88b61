"""The one-command GPU check: its steps, its summary, the README section it writes, and its CPU twin."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402

OVERLAP_OUTPUT = """python 3.12.3, torch 2.11.0, 16 CPUs
GPU: NVIDIA H100 80GB HBM3, 100 iterations, copy 64 MiB per iteration
copy alone 2.700 ms/iter, compute alone 9.100 ms/iter
method               ms/iter (GPU)  ms/iter (wall)  speedup  copy hidden  peak MiB
-------------------  -------------  --------------  -------  -----------  --------
serial                      12.450          12.500    1.00x           0%       480
SWPipeline                  11.250          11.300    1.11x          98%       704
DataFlowPipeline(3)         11.240          11.290    1.11x          99%       896
hand-written                11.230          11.280    1.11x         100%       640
"""


def outcome(name: str, status: str, output: str) -> gpu_check.Outcome:
    step = next(s for s in gpu_check.steps(sys.executable) if s.name == name)
    return gpu_check.Outcome(step, status, 12.0, output)


def test_the_steps_run_the_cuda_tests_first_and_fit_the_budget() -> None:
    names = [s.name for s in gpu_check.steps(sys.executable)]
    assert names == ["pytest -m cuda", "swpipeline demo --device cuda", "gpu_overlap.py", "gpu_apps.py",
                     "pp_vs_pipelining.py --device cuda", "pp_vs_pipelining.py --device cuda --ranks 1"]
    assert sum(s.timeout_s for s in gpu_check.steps(sys.executable)) <= 11 * 60


def test_the_summary_reads_each_steps_figures() -> None:
    outcomes = [outcome("pytest -m cuda", "ok", "....\n16 passed, 3 deselected in 40.1s"),
                outcome("gpu_overlap.py", "ok", OVERLAP_OUTPUT),
                outcome("gpu_apps.py", "FAILED (exit 1)", "GPipe checkpoint=never: equal to torchgpipe: NO\n")]
    text = gpu_check.summary(outcomes, "NVIDIA H100 80GB HBM3", "2.11.0")
    lines = text.splitlines()
    assert lines[2:] == [
        "| check | result | seconds | figures |", "|---|---|---|---|",
        "| `pytest -m cuda` | ok | 12 | 16 passed |",
        "| `gpu_overlap.py` | ok | 12 | serial 12.450 ms/it, 1.00x, copy hidden 0%; SWPipeline 11.250 ms/it, 1.11x, "
        "copy hidden 98%; DataFlowPipeline(3) 11.240 ms/it, 1.11x, copy hidden 99%; hand-written 11.230 ms/it, "
        "1.11x, copy hidden 100% |",
        "| `gpu_apps.py` | FAILED (exit 1) | 12 | GPipe checkpoint=never: equal to torchgpipe: NO |"]
    section = gpu_check.readme_section(outcomes, "NVIDIA H100 80GB HBM3", "2.11.0")
    assert section.startswith("**Measured on an NVIDIA H100 80GB HBM3** (torch 2.11.0")
    assert "| SWPipeline | 11.250 | 1.11x | 98% | 704 |" in section


PP_OUTPUT = """python 3.12.3, torch 2.11.0, 16 CPUs
1 ranks on 16 cores: the ranks share them (one intra-op thread each); every stage on NVIDIA H200, shared by the ranks

mlp: 1 gloo rank on cuda, 8 microbatches; one process, one thread: 3.1 ms/step
schedule         library     ms/step  min  bubble  µs/action  ideal  peak act. MB per rank  vs torch  exact  simulated
---------------  ----------  -------  ---  ------  ---------  -----  ---------------------  --------  -----  ---------
GPipe            torch           4.1  4.0     22%         56     0%                   0.08      1.00    yes
GPipe            swpipeline      3.5  3.5      8%         18     0%                   0.08      1.17    yes
"""


def test_the_pp_steps_read_exactness_and_speed_and_make_one_table() -> None:
    assert gpu_check.pp_figures(PP_OUTPUT) == ("exact: 1 of 1 (model, schedule); 1.17-1.17x torch's speed; "
                                               "ms/step in the table below")
    two = PP_OUTPUT.replace("1 gloo rank on", "2 gloo ranks on").replace("1.17    yes", "        NO")
    two = "\n".join(line for line in two.splitlines() if "torch " not in line)
    assert gpu_check.pp_figures(two) == "exact: 0 of 1 (model, schedule); ms/step in the table below"
    outcomes = [outcome("pp_vs_pipelining.py --device cuda", "ok", two),
                outcome("pp_vs_pipelining.py --device cuda --ranks 1", "ok", PP_OUTPUT)]
    section = gpu_check.readme_section(outcomes, "NVIDIA H200", "2.11.0")
    assert section.splitlines()[-3:] == [
        "| model | schedule | one process, ms/step | 2 ranks sharing the GPU | 1 rank holding every stage |",
        "|---|---|---|---|---|", "| mlp | GPipe | 3.1 | 3.5 (NOT exact) | 3.5 |"]


def test_a_suite_stopped_by_its_time_limit_still_names_the_tests_that_failed() -> None:
    stopped = ("tests/a/test_x.py::test_one PASSED                [ 10%]\n"
               "tests/a/test_x.py::test_two FAILED                [ 20%]\n"
               "tests/b/test_y.py::test_three[cuda] ERROR         [ 30%]\n"
               "tests/b/test_y.py::test_four PASSED\n"
               "[gw3] [ 40%] FAILED tests/c/test_z.py::test_five \n")
    assert gpu_check.pytest_figures(stopped) == ("no test summary; failed: tests/a/test_x.py::test_two, "
                                                 "tests/b/test_y.py::test_three[cuda], tests/c/test_z.py::test_five")
    ended = stopped + ("\n=== short test summary info ===\nFAILED tests/a/test_x.py::test_two - AssertionError\n"
                       "ERROR tests/b/test_y.py::test_three[cuda] - RuntimeError\n2 passed, 1 failed, 1 error in 3.0s")
    assert gpu_check.pytest_figures(ended) == ("2 passed, 1 failed, 1 error; failed: tests/a/test_x.py::test_two, "
                                               "tests/b/test_y.py::test_three[cuda], tests/c/test_z.py::test_five")
    step = gpu_check.suite_step(sys.executable, 300)
    assert (step.timeout_s, step.argv[1:3]) == (300, ["-m", "pytest"])
    assert {"-v", "-rfE", "-n"} <= set(step.argv)
    assert "-v" in next(s for s in gpu_check.steps(sys.executable) if s.name == "pytest -m cuda").argv


def test_update_readme_replaces_only_the_marked_block(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{gpu_check.BEGIN}\nold figures\n{gpu_check.END}\n## Next\n")
    section = tmp_path / "readme_section.md"
    section.write_text("**Measured on an X**\n\n| a |\n")
    gpu_check.update_readme(section, readme)
    assert readme.read_text() == f"intro\n{gpu_check.BEGIN}\n**Measured on an X**\n\n| a |\n{gpu_check.END}\n## Next\n"
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="has no <!-- gpu-check: begin -->"):
        gpu_check.update_readme(section, readme)


def test_the_gpu_page_has_the_block_and_is_where_update_readme_writes(tmp_path: Path) -> None:
    # The GPU figures live on docs/gpu.md (the README keeps one row of them and links there).
    page = ROOT / "docs" / "gpu.md"
    assert gpu_check.GPU_PAGE == page
    text = page.read_text()
    assert text.count(gpu_check.BEGIN) == 1 and text.index(gpu_check.BEGIN) < text.index(gpu_check.END)
    assert "**Measured on an NVIDIA H200**" in text[text.index(gpu_check.BEGIN):text.index(gpu_check.END)]
    assert gpu_check.BEGIN not in (ROOT / "README.md").read_text()
    section = tmp_path / "readme_section.md"
    section.write_text("**Measured on an X**\n")
    copy = tmp_path / "gpu.md"
    copy.write_text(text)
    gpu_check.update_readme(section, copy)  # the default target is GPU_PAGE
    assert "**Measured on an X**" in copy.read_text() and "NVIDIA H200" not in copy.read_text().split(
        gpu_check.BEGIN)[1].split(gpu_check.END)[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU it would run every check")
def test_without_a_gpu_it_says_so_and_runs_nothing(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout.strip() == ("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False); run it on a "
                                   "machine with one")
    assert list(tmp_path.iterdir()) == []


def test_gpu_apps_checks_pass_on_the_cpu() -> None:
    # The CPU twin of gpu_apps.py's checks, at small sizes: GPipe against torchgpipe, the cache against the table.
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_apps.py"), "--device", "cpu", "--small"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT / "benchmarks")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [line for line in proc.stdout.splitlines() if line.startswith(("GPipe", "embcache"))]
    assert len(results) == 4 and all("NO" not in line for line in results)
    assert [line.split(":")[0] for line in results] == ["GPipe checkpoint=never", "GPipe checkpoint=except_last",
                                                         "GPipe checkpoint=always", "embcache"]
