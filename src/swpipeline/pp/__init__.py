"""swpipeline.pp: pipeline parallelism across ranks, each rank's step a plan on the swpipeline engine.

::

    from swpipeline.pp import PipelineStage, Schedule1F1B    # was: from torch.distributed.pipelining import ...

    stage = PipelineStage(part_of_model, rank, world_size, device)
    schedule = Schedule1F1B(stage, n_microbatches=8, loss_fn=loss_fn)
    schedule.step(x) / schedule.step() / schedule.step(target=y, losses=losses)   # on ranks first / middle / last

The same names and arguments as ``torch.distributed.pipelining``. Every rank computes every
rank's actions from the configuration and proves, before sending anything, that the
sends and receives match and that the whole pipeline cannot hang (``ScheduleHangError``
otherwise, naming the ranks, microbatches and actions). A failure on one rank stops every
rank with ``PipelineRankError`` naming the failing rank, stage, microbatch and error.
docs/pipeline_parallel.md has the details.
"""

# May import: the engine and everything below it (an application of the engine).

from __future__ import annotations

from typing import List

from .actions import Action as Action
from .actions import Kind as Kind
from .clip import clip_grad_norm_ as clip_grad_norm_
from .errors import PipelineRankError as PipelineRankError
from .errors import RankTimeoutError as RankTimeoutError
from .errors import ScheduleHangError as ScheduleHangError
from .errors import ScheduleMismatchError as ScheduleMismatchError
from .planner import StageCosts as StageCosts
from .planner import autoplan as autoplan
from .planner import simulate as simulate
from .schedule_base import PipelineSchedule as PipelineSchedule
from .schedules import PipelineScheduleMulti as PipelineScheduleMulti
from .schedules import PipelineScheduleSingle as PipelineScheduleSingle
from .schedules import _ScheduleForwardOnly as _ScheduleForwardOnly  # torch exports it unlisted too
from .schedules import Schedule1F1B as Schedule1F1B
from .schedules import ScheduleDualPipeV as ScheduleDualPipeV
from .schedules import ScheduleFromActions as ScheduleFromActions
from .schedules import ScheduleGPipe as ScheduleGPipe
from .schedules import ScheduleInterleaved1F1B as ScheduleInterleaved1F1B
from .schedules import ScheduleInterleavedZeroBubble as ScheduleInterleavedZeroBubble
from .schedules import ScheduleLoopedBFS as ScheduleLoopedBFS
from .schedules import ScheduleZBVZeroBubble as ScheduleZBVZeroBubble
from .stage import PipelineStage as PipelineStage
from .ties import TiedWeight as TiedWeight
from .tracer import Pipe as Pipe
from .tracer import SplitPoint as SplitPoint
from .tracer import build_stage as build_stage
from .tracer import pipe_split as pipe_split
from .tracer import pipeline as pipeline

__all__: List[str] = [
    "Action",
    "Kind",
    "Pipe",
    "PipelineRankError",
    "PipelineSchedule",
    "PipelineScheduleMulti",
    "PipelineScheduleSingle",
    "PipelineStage",
    "RankTimeoutError",
    "Schedule1F1B",
    "ScheduleDualPipeV",
    "ScheduleFromActions",
    "ScheduleGPipe",
    "ScheduleHangError",
    "ScheduleInterleaved1F1B",
    "ScheduleInterleavedZeroBubble",
    "ScheduleLoopedBFS",
    "ScheduleMismatchError",
    "ScheduleZBVZeroBubble",
    "SplitPoint",
    "StageCosts",
    "TiedWeight",
    "autoplan",
    "build_stage",
    "clip_grad_norm_",
    "pipe_split",
    "pipeline",
    "simulate",
]
