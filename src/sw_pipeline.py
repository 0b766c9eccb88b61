"""An alias import path: ``from sw_pipeline import SWPipeline, PipelinePlan, ...``.

The same names as the :mod:`swpipeline` package, for code written against that path.
"""

from swpipeline import *  # noqa: F401,F403
from swpipeline import __all__ as __all__  # noqa: F401
