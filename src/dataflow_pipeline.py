"""The seed's import path: ``from dataflow_pipeline import DataFlowPipeline``.

A thin alias of the :mod:`swpipeline` package.
"""

from swpipeline import *  # noqa: F401,F403
from swpipeline import __all__ as __all__  # noqa: F401
