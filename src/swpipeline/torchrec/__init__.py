"""swpipeline.torchrec: every TorchRec train pipeline as a PipelinePlan, behind TorchRec's calling convention.

Swap one import::

    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist   # TorchRec
    from swpipeline.torchrec import TrainPipelineSparseDist                   # the same pipeline as a plan

    pipeline = TrainPipelineSparseDist(dmp_model, optimizer, device)
    while True:
        try:
            output = pipeline.progress(dataloader_iter)
        except StopIteration:
            break

Needs TorchRec 1.8.0 with fbgemm-gpu-cpu 1.8.0, which load only with torch 2.13
(``pip install "swpipeline[torchrec]"`` then ``pip install --no-deps torchrec==1.8.0``);
``import swpipeline`` never imports this package.
docs/torchrec.md describes each variant's plan, the options, and what differs
from TorchRec.
"""

# May import: the engine and everything below it (an application of the engine).

from __future__ import annotations

from .compat import import_torchrec as _import_torchrec

_import_torchrec()  # one clear sentence when TorchRec is missing or does not load with this torch

# (E402: the imports below load TorchRec, so they must come after the check above)
from .feed import RankAgreement as RankAgreement  # noqa: E402
from .pipeline import PlannedTrainPipeline as PlannedTrainPipeline  # noqa: E402
from .plans import SPECS as PLAN_SPECS  # noqa: E402
from .plans import PlanSpec as PlanSpec  # noqa: E402
from .staged import StagedPipeline as StagedPipeline  # noqa: E402
from .staged import StagedTrainPipeline as StagedTrainPipeline  # noqa: E402
from .variants import EvalPipelineFusedSparseDist as EvalPipelineFusedSparseDist  # noqa: E402
from .variants import EvalPipelineSparseDist as EvalPipelineSparseDist  # noqa: E402
from .variants import PrefetchTrainPipelineSparseDist as PrefetchTrainPipelineSparseDist  # noqa: E402
from .variants import TrainPipelineBase as TrainPipelineBase  # noqa: E402
from .variants import TrainPipelineFusedSparseDist as TrainPipelineFusedSparseDist  # noqa: E402
from .variants import TrainPipelinePT2 as TrainPipelinePT2  # noqa: E402
from .variants import TrainPipelineSemiSync as TrainPipelineSemiSync  # noqa: E402
from .variants import TrainPipelineSparseDist as TrainPipelineSparseDist  # noqa: E402
from .variants import TrainPipelineSparseDistCompAutograd as TrainPipelineSparseDistCompAutograd  # noqa: E402
from .variants import TrainPipelineSparseDistLite as TrainPipelineSparseDistLite  # noqa: E402

__all__ = [
    "EvalPipelineFusedSparseDist",
    "EvalPipelineSparseDist",
    "PLAN_SPECS",
    "PlanSpec",
    "PlannedTrainPipeline",
    "PrefetchTrainPipelineSparseDist",
    "RankAgreement",
    "StagedPipeline",
    "StagedTrainPipeline",
    "TrainPipelineBase",
    "TrainPipelineFusedSparseDist",
    "TrainPipelinePT2",
    "TrainPipelineSemiSync",
    "TrainPipelineSparseDist",
    "TrainPipelineSparseDistCompAutograd",
    "TrainPipelineSparseDistLite",
]
