"""Which torch build `pip install torch==<pin>` gives from each index: a dry run, nothing installed.

    python tools/check_torch_build.py

The pin is requirements-dev.txt's. Three dry runs (``pip install --dry-run``, into no environment):

1. PyPI, with pip's configuration files and find-links left out: what a machine elsewhere gets;
2. PyTorch's CPU index (the README's command for the CPU build), configuration left out the same way;
3. pip as configured on this machine: what the Quickstart's commands get here.

For each it prints one line: the torch release it would install, whether that is the CUDA build (it brings
NVIDIA's CUDA packages or triton) or the CPU build, how many packages and how much it would download, or why
that index could not answer. Exit status: 0 when the CPU index gives the CPU build, 1 when it gives anything
else, 2 when it cannot be reached from here (the other lines still print).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
PYPI = "https://pypi.org/simple"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CUDA_PREFIXES = ("nvidia-", "nvidia_", "cuda-", "cuda_", "triton")
TIMEOUT_S = 600  # PyPI's CUDA build is about 2.7 GB of wheels, which pip fetches to read their metadata


def torch_pin(requirements: Path = ROOT / "requirements-dev.txt") -> str:
    """The release in the requirements file's ``torch==`` line."""
    for line in requirements.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"torch==([0-9][0-9a-z.+]*)\s*(#.*)?", line.strip())
        if match:
            return match.group(1)
    raise SystemExit(f"check_torch_build: {requirements} has no torch==... line")


def cpu_command(pin: str) -> str:
    """The README's command for the CPU build of torch ``pin``."""
    return f"pip install torch=={pin} --index-url {CPU_INDEX}"


@dataclass(frozen=True)
class DryRun:
    """What one ``pip install --dry-run`` would do: the packages (name -> version), the MB it downloads."""

    packages: Dict[str, str]
    download_mb: float
    error: Optional[str] = None

    @property
    def torch(self) -> Optional[str]:
        return self.packages.get("torch")

    @property
    def cuda_packages(self) -> List[str]:
        return sorted(n for n in self.packages if n.lower().startswith(CUDA_PREFIXES))

    def describe(self) -> str:
        """One line: which build, how many packages, how much to download; or why there is no answer."""
        if self.torch is None:
            return f"no answer: {self.error or 'pip would not install torch'}"
        build = (f"the CUDA build ({len(self.cuda_packages)} CUDA packages: {', '.join(self.cuda_packages[:4])}, ...)"
                 if self.cuda_packages else "the CPU build (no CUDA package)")
        size = f", {self.download_mb / 1000:.1f} GB to download" if self.download_mb >= 100 else ""
        return f"torch {self.torch}: {build}; {len(self.packages)} packages{size}"


def parse(output: str, returncode: int) -> DryRun:
    """Read pip's dry-run output: its "Would install" line and its "Downloading NAME (SIZE)" lines."""
    would = re.search(r"^Would install (.+)$", output, re.MULTILINE)
    packages: Dict[str, str] = {}
    if would is not None:
        for item in would.group(1).split():
            name, _, version = item.rpartition("-")
            packages[name] = version
    units = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}
    download = sum(float(n) * units[u] for n, u in re.findall(r"^\s*Downloading \S+ \(([0-9.]+) (kB|MB|GB)\)",
                                                                output, re.MULTILINE))
    error = None
    if returncode != 0 or would is None:
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        reasons = [line for line in lines if line.startswith("ERROR")]
        error = (reasons[-1] if reasons else (lines[-1] if lines else f"pip exited with {returncode}"))[:200]
    return DryRun(packages, download, error)


def reachable(index: str) -> Optional[str]:
    """None if ``index`` answers for torch, else why not (pip's own output does not tell a missing release from
    an index it cannot reach)."""
    try:
        with urllib.request.urlopen(f"{index}/torch/", timeout=30):
            return None
    except (OSError, ValueError) as exc:
        return f"{index} cannot be reached from here ({getattr(exc, 'reason', exc)})"


def dry_run(pin: str, index: Optional[str]) -> DryRun:
    """``pip install --dry-run torch==pin`` from ``index`` alone (None: pip as configured on this machine)."""
    args = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-cache-dir",
            "--retries", "0", "--timeout", "30", f"torch=={pin}"]
    env = dict(os.environ)
    if index is not None:
        args += ["--index-url", index]
        env["PIP_CONFIG_FILE"] = os.devnull  # no configuration file: no local wheels, no extra index, no cap
        for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX"):
            env.pop(name, None)
    try:
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return DryRun({}, 0.0, f"pip did not answer within {TIMEOUT_S} s")
    result = parse(proc.stdout + proc.stderr, proc.returncode)
    if result.torch is None and index is not None:
        why = reachable(index)
        if why is not None:
            return DryRun({}, 0.0, why)
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    pin = torch_pin()
    print(f"torch=={pin} (requirements-dev.txt's pin), pip install --dry-run, Python "
          f"{sys.version_info.major}.{sys.version_info.minor} on {sys.platform}:")
    results = {}
    for label, index in (("PyPI", PYPI), ("PyTorch's CPU index", CPU_INDEX), ("pip as configured here", None)):
        results[label] = dry_run(pin, index)
        where = f" ({index})" if index else ""
        print(f"  {label}{where}: {results[label].describe()}", flush=True)
    cpu = results["PyTorch's CPU index"]
    if cpu.torch is None:
        print(f"the CPU index could not be checked from here; on a machine that reaches it, run: {cpu_command(pin)}")
        return 2
    return 0 if not cpu.cuda_packages else 1


if __name__ == "__main__":
    sys.exit(main())
