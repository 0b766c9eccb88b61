"""Importing TorchRec, with one clear sentence when it is missing or does not load with the installed torch.

TorchRec's kernels come from fbgemm-gpu, a native library built against one torch release:
with any other torch, loading it fails deep inside TorchRec's import with an undefined C++
symbol. The releases known to work together are listed here and in the ``[torchrec]`` extra.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from types import ModuleType
from typing import Dict, List, Optional

__all__: List[str] = []

# fbgemm-gpu(-cpu) release (major.minor) -> the torch release (major.minor) it is built against
FBGEMM_TORCH: Dict[str, str] = {"1.8": "2.13"}
INSTALL = 'pip install "swpipeline[torchrec]" && pip install --no-deps torchrec==1.8.0'


def _version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def mismatch_message(torch_version: str, fbgemm: Optional[str], detail: str) -> str:
    """The sentence for a TorchRec that fails to load its native kernels under ``torch_version``."""
    wants = FBGEMM_TORCH.get(_minor(fbgemm)) if fbgemm is not None else None
    if fbgemm is None or wants == _minor(torch_version):
        return (f"swpipeline.torchrec: TorchRec failed to load its native kernels with torch {torch_version} "
                f"({detail}); TorchRec 1.8.0 needs fbgemm-gpu-cpu 1.8.0 and torch 2.13: {INSTALL}")
    built_for = f"torch {wants}" if wants else "another torch release"
    fix = (f"install torch {wants} (pip install 'torch=={wants}.*')" if wants
           else "install the fbgemm-gpu-cpu release built for it")
    return (f"swpipeline.torchrec: fbgemm-gpu-cpu {fbgemm} is built for {built_for}, but torch {torch_version} is "
            f"installed, so TorchRec cannot load its kernels ({detail}); {fix}, or: {INSTALL}")


def import_torchrec() -> ModuleType:
    """``import torchrec``, or an ImportError in one sentence saying what to install."""
    try:
        return importlib.import_module("torchrec")
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "torchrec":
            raise ImportError(f"swpipeline.torchrec needs TorchRec: {INSTALL}") from exc
        raise ImportError(f"swpipeline.torchrec: TorchRec needs {exc.name!r}, which is not installed: "
                          f"{INSTALL}") from exc
    except (OSError, ImportError) as exc:  # fbgemm's library built for another torch: an undefined symbol
        import torch

        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        detail = detail if len(detail) <= 120 else detail[:117] + "..."
        fbgemm = _version("fbgemm-gpu-cpu") or _version("fbgemm-gpu")
        raise ImportError(mismatch_message(torch.__version__, fbgemm, detail)) from exc
