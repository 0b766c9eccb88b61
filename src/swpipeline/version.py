"""The package version (one place: the package, the command line and the build read it)."""

from typing import List

__all__: List[str] = []

__version__ = "0.1.0"
