"""swpipeline: declarative software pipelines for PyTorch training and inference loops.

The whole public API is imported here; everything else is internal.
"""

from .analysis.inference import infer_deps as infer_deps
from .analysis.checker import RaceChecker as RaceChecker
from .analysis.races import RaceError as RaceError
from .analysis.report import PlanAnalysis as PlanAnalysis
from .analysis.report import analyze as analyze
from .engine.clocked import SWPipeline as SWPipeline
from .engine.dataflow import DataFlowPipeline as DataFlowPipeline
from .devices.device import CPUDevice as CPUDevice
from .devices.device import Device as Device
from .devices.device import TorchDevice as TorchDevice
from .errors import DependencyTimeoutError as DependencyTimeoutError
from .errors import PipelineTimeoutError as PipelineTimeoutError
from .errors import ProgressTimeoutError as ProgressTimeoutError
from .errors import SequencerTimeoutError as SequencerTimeoutError
from .errors import SharedStreamWarning as SharedStreamWarning
from .plan.context import FreedAttributeError as FreedAttributeError
from .plan.context import IterContext as IterContext
from .plan.model import DeclaredIO as DeclaredIO
from .plan.model import PipelinePlan as PipelinePlan
from .plan.model import PipelineTask as PipelineTask
from .plan.model import TaskSchedule as TaskSchedule
from .tuning.autoplan import autoplan as autoplan
from .tuning.autoplan import search_plan as search_plan
from .tuning.calibrate import calibrate as calibrate
from .tuning.costs import TaskCost as TaskCost
from .tuning.costs import TaskCosts as TaskCosts
from .tuning.overheads import EngineOverheads as EngineOverheads
from .tuning.search_result import PlanSearch as PlanSearch
from .tuning.sim_path import PathStep as PathStep
from .tuning.sim_result import SimResult as SimResult
from .tuning.sim_result import SimUnit as SimUnit
from .tuning.simulator import simulate as simulate
from .tuning.profiler import ProfileResult as ProfileResult
from .tuning.profiler import TaskProfiler as TaskProfiler
from .devices.simulated import SimulatedDevice as SimulatedDevice
from .observe.stats import RunStats as RunStats
from .observe.stats import TaskStats as TaskStats
from .observe.records import DependencyWait as DependencyWait
from .observe.records import TaskRecord as TaskRecord
from .plan.rng import task_generator as task_generator
from .observe.timeline import Timeline as Timeline
from .training.weights import VersionStats as VersionStats
from .training.weights import WeightVersions as WeightVersions

from .version import __version__ as __version__

__all__ = [
    "EngineOverheads",
    "PathStep",
    "PlanSearch",
    "SimResult",
    "SimUnit",
    "TaskCost",
    "TaskCosts",
    "autoplan",
    "calibrate",
    "search_plan",
    "simulate",
    "PlanAnalysis",
    "RaceChecker",
    "RaceError",
    "analyze",
    "infer_deps",
    "task_generator",
    "CPUDevice",
    "DataFlowPipeline",
    "DeclaredIO",
    "DependencyTimeoutError",
    "DependencyWait",
    "Device",
    "FreedAttributeError",
    "IterContext",
    "PipelinePlan",
    "PipelineTask",
    "PipelineTimeoutError",
    "ProfileResult",
    "ProgressTimeoutError",
    "RunStats",
    "SWPipeline",
    "SequencerTimeoutError",
    "SharedStreamWarning",
    "SimulatedDevice",
    "TaskProfiler",
    "TaskRecord",
    "TaskSchedule",
    "TaskStats",
    "Timeline",
    "TorchDevice",
    "VersionStats",
    "WeightVersions",
]
