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

from __future__ import annotations

from .compat import import_torchrec as _import_torchrec

_import_torchrec()  # one clear sentence when TorchRec is missing or does not load with this torch

from .feed import RankAgreement as RankAgreement
from .pipeline import PlannedTrainPipeline as PlannedTrainPipeline
from .plans import SPECS as PLAN_SPECS
from .plans import PlanSpec as PlanSpec
from .staged import StagedPipeline as StagedPipeline
from .staged import StagedTrainPipeline as StagedTrainPipeline
from .variants import EvalPipelineFusedSparseDist as EvalPipelineFusedSparseDist
from .variants import EvalPipelineSparseDist as EvalPipelineSparseDist
from .variants import PrefetchTrainPipelineSparseDist as PrefetchTrainPipelineSparseDist
from .variants import TrainPipelineBase as TrainPipelineBase
from .variants import TrainPipelineFusedSparseDist as TrainPipelineFusedSparseDist
from .variants import TrainPipelinePT2 as TrainPipelinePT2
from .variants import TrainPipelineSemiSync as TrainPipelineSemiSync
from .variants import TrainPipelineSparseDist as TrainPipelineSparseDist
from .variants import TrainPipelineSparseDistCompAutograd as TrainPipelineSparseDistCompAutograd
from .variants import TrainPipelineSparseDistLite as TrainPipelineSparseDistLite

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
