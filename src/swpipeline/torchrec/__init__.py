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

Needs TorchRec (``pip install --no-deps torchrec`` plus its dependencies, see
requirements-torchrec.txt); ``import swpipeline`` never imports this package.
docs/torchrec.md describes each variant's plan, the options, and what differs
from TorchRec.
"""

from __future__ import annotations

try:
    import torchrec as _torchrec  # noqa: F401  (the extra's one hard requirement)
except ImportError as exc:  # pragma: no cover - exercised only without torchrec
    raise ImportError(
        "swpipeline.torchrec needs TorchRec: pip install --no-deps -r requirements-torchrec.txt "
        "(and its dependencies from requirements-dev.txt)"
    ) from exc

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
