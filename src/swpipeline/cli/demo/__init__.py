"""``swpipeline demo``: train a small click model serially and pipelined, and compare.

The job is a DLRM-style recommendation model (embedding bags for the sparse
features, a bottom MLP for the dense ones, a top MLP on their concatenation,
binary click label). Every training iteration is five tasks in three stages
(``job.py`` has the table); batch preparation overlaps the model work. Period by period, the
last stage first, as ``print_schedule`` lists them (each period runs its oldest iteration's work first)::

    period     P0   P1   P2   P3   P4
    stage 2    --   --   i0   i1   i2     Forward/Backward/OptimizerStep
    stage 1    --   i0   i1   i2   i3     CopyToDevice
    stage 0    i0   i1   i2   i3   i4     PrepareBatch (overlaps the model work on another core)

The model sees exactly the updates of the serial loop, and the demo checks that the
per-iteration losses of both runs are equal. Guarantees the check relies on: batch
``k`` is generated from ``seed + k`` alone, both runs start from the same initial
weights, and every torch op runs with one intra-op thread in both runs
(``torch.set_num_threads(1)``).

The modules, from the bottom up (each imports only those above it in this list, and
the library imports none of them)::

    config.py    DemoConfig: the sizes of the job
    data.py      the synthetic click log (RawBatch, make_raw_batch)
    prepare.py   stage 0's work: hashing, de-duplicating ids, offsets (ModelBatch, prepare_batch)
    model.py     ClickModel
    job.py       TrainingJob: model, optimizer, the five task functions, the three-stage plan
    runs.py      timing one run, serial or pipelined (RunResult, timed_run)
    report.py    the printed report: results table and what its speedup divides, thread split, loss check
    outputs.py   the trace and pictures: checking their paths up front, writing them
    command.py   the command's options (add_arguments, run) and the demo itself (run_demo)

The names below are gathered here for the tests and benchmarks that drive the demo's
parts (``from swpipeline.cli.demo import DemoConfig, TrainingJob, make_raw_batch``). They
are not swpipeline's API, so ``__all__`` stays empty, as in every internal module.
"""

from __future__ import annotations

from typing import List

from .command import run_demo as run_demo
from .config import DemoConfig as DemoConfig
from .data import RawBatch as RawBatch
from .data import make_raw_batch as make_raw_batch
from .job import TrainingJob as TrainingJob
from .model import ClickModel as ClickModel
from .prepare import ModelBatch as ModelBatch
from .prepare import hash_ids as hash_ids
from .prepare import prepare_batch as prepare_batch
from .report import format_interference as format_interference
from .report import format_loss_check as format_loss_check
from .report import format_speedup_basis as format_speedup_basis
from .report import format_thread_split as format_thread_split
from .runs import RunResult as RunResult
from .runs import timed_run as timed_run

__all__: List[str] = []
