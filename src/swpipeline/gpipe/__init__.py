"""swpipeline.gpipe: GPipe's micro-batch pipeline parallelism as two plans on the swpipeline engine.

::

    from swpipeline.gpipe import GPipe

    model = GPipe(nn.Sequential(...), balance=[2, 2], devices=["cpu", "cpu"], chunks=8)
    loss_fn(model(input)).backward()

The constructor and behaviour follow torchgpipe's ``GPipe`` (balance, devices,
chunks, checkpoint modes); docs/gpipe.md shows the plans and what differs.
"""

# May import: the engine and everything below it (an application of the engine).

from __future__ import annotations

from typing import List

from .checkpoint import is_checkpointing as is_checkpointing
from .checkpoint import is_recomputing as is_recomputing
from .gpipe import GPipe as GPipe

__all__: List[str] = ["GPipe", "is_checkpointing", "is_recomputing"]
