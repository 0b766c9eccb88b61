"""One rank's step on the engine: its plan's tasks bound to its stages and its transport.

``RankRunner.run(state)`` runs the rank's plan for one step (one iteration, on
``SWPipeline``), the compute group on the caller's thread. Every task is guarded: an
exception in it first tells the other ranks (``Transport.fail``), then reaches the engine,
which stops the step's other threads and raises it here. Those threads are never left
waiting: a receive ends when its message or the sender's failure arrives, and every rank
that fails passes the first failure on (see ``transport.py``), so the ranks this one waits
for fail too and answer. A failed step leaves the ranks' message streams out of step, so the
schedule refuses to run another.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch

from ..engine.clocked import SWPipeline
from ..errors import PipelineAborted
from ..plan.context import IterContext
from .actions import FWD
from .comms import Message, PipelineWork
from .compute import StageOps, StepState
from .errors import PipelineRankError, RankTimeoutError
from .plan_of_rank import TaskFn, check_engine_runs, plan_of_rank
from .transport import Config, Failure, Transport, describe_error
from .wire import DONE, HELLO
from .units import COMPUTE, RankUnits, Unit

__all__: List[str] = []

JOIN_TIMEOUT_S = 5.0  # how long a failed step waits for its threads (a receive ends when the failure comes back)


class RankRunner:
    """One rank's plan, engine and transport for one kind of step (training, or forward only)."""

    def __init__(self, work: PipelineWork, units: RankUnits, rank: int, ops: StageOps, transport: Transport,
                 device: torch.device, timeout: float, config: Optional[Config] = None) -> None:
        self.rank = rank
        self.config = config  # what this rank runs: said in its HELLOs, compared with every peer's
        self.ops = ops
        self.transport = transport
        # how many messages this rank sends each peer in a step (HELLO, data, DONE)
        self.channels = {unit.peer: unit.channel[2] + 1 for unit in units[COMPUTE] if unit.marker == "done"
                         and unit.role == "send" and unit.channel is not None}
        # the peers' HELLOs and DONEs: their receives are posted as the step starts
        self.markers = [(unit.peer, unit.channel[2]) for unit in units[COMPUTE] if unit.marker and unit.role == "recv"
                        and unit.channel is not None]
        self.local = work.ranks[rank].local
        self.units = units
        self.plan = plan_of_rank(units, self._task)
        backstop = max(10 * timeout, 600.0)  # the receives time out first; the engine's own limits are a backstop
        self.pipe = SWPipeline(self.plan, device, caller_thread_group=COMPUTE, signal_timeout=backstop,
                               progress_timeout=backstop, join_timeout=JOIN_TIMEOUT_S)
        check_engine_runs(self.pipe, units)
        self.failure: Optional[Failure] = None
        self.mode = ops.backward  # messages are laid out alike from one step of a kind to the next

    def run(self, state: StepState, trace: bool = False) -> None:
        """Run one step (``trace``: record its timeline, see ``durations``); on failure every rank that waits for
        this one hears of it, and the error is raised."""
        if self.failure is not None:
            raise RuntimeError(f"step() after a failed step ({self.failure.where()} failed with "
                               f"{self.failure.error}): the ranks' messages are out of step; build the process group "
                               f"and the schedule again (usually: restart the job)")
        self.transport.start_step(self.channels, self.mode, self.config, self.markers)
        try:
            self.pipe.run([state], trace=trace or None)
        except BaseException as exc:
            first = self.failure = self.transport.fail(Failure(self.rank, None, None, None, describe_error(exc)))
            if first.rank == self.rank and not first.silent:
                raise  # this rank's own error, as it was raised
            raise first.error_for(self.rank) from None  # what happened elsewhere, said the same on every rank
        self.transport.finish_step()

    def durations(self) -> Dict[str, List[float]]:
        """What each unit of the last traced step took, in milliseconds, by name."""
        found: Dict[str, List[float]] = {}
        timeline = self.pipe.timeline
        for record in timeline.records if timeline is not None else []:
            found.setdefault(record.task, []).append((record.cpu_end - record.cpu_start) * 1e3)
        return found

    # -- the tasks --------------------------------------------------------------------------------

    def _task(self, unit: Unit) -> TaskFn:
        body = self._body(unit)
        transport, rank = self.transport, self.rank

        def task(ctx: IterContext) -> None:
            try:
                body(ctx.batch)
            except PipelineAborted:  # the step failed already (transport.py: a failure coming back)
                raise
            except PipelineRankError as exc:  # another rank failed, or this one waited for a silent one: pass it on
                transport.fail(Failure(exc.rank, exc.stage, exc.microbatch, exc.action, exc.error,
                                       silent=isinstance(exc, RankTimeoutError)))
                raise
            except BaseException as exc:
                transport.fail(_failure_of(exc, unit, rank))
                raise

        return task

    def _body(self, unit: Unit) -> Callable[[StepState], None]:
        ops, transport = self.ops, self.transport
        peer, index = unit.peer, unit.channel[2] if unit.channel is not None else -1
        msg = unit.message
        if unit.action is not None:
            action = unit.action
            handed = [m for m in self.local if m.consumer == action]

            def compute(state: StepState) -> None:
                for local in handed:
                    self._hand_over(local, state)
                ops.run(action, state)

            return compute
        if msg is None:  # HELLO or DONE
            status = HELLO if unit.marker == "hello" else DONE
            if unit.role == "send":
                return lambda state: transport.send_marker(peer, index, status)
            return lambda state: transport.recv_marker(peer, index, status)
        if unit.role == "send":
            if msg.kind == FWD.value:
                return lambda state: transport.send(peer, index, ops.take_output(msg.src_stage, msg.microbatch, state))
            return lambda state: transport.send(
                peer, index, state.input_grads.pop((msg.src_stage, msg.microbatch, msg.dst_stage)))
        what, key = msg.describe(), (msg.dst_stage, msg.microbatch, msg.src_stage)
        if msg.kind == FWD.value:
            return lambda state: ops.arrived(key, transport.recv(peer, index, what), state)
        return lambda state: ops.grads_arrived(key, transport.recv(peer, index, what), state)

    def _hand_over(self, msg: Message, state: StepState) -> None:
        """A value between two stages of this rank, as a message would carry it."""
        m = msg.microbatch
        if msg.kind == FWD.value:
            self.ops.arrived((msg.dst_stage, m, msg.src_stage), self.ops.take_output(msg.src_stage, m, state), state)
        else:
            state.grads[(msg.dst_stage, m, msg.src_stage)] = state.input_grads.pop((msg.src_stage, m, msg.dst_stage))


def _failure_of(exc: BaseException, unit: Unit, rank: int) -> Failure:
    """The failure to tell the other ranks about: where it happened and what it was."""
    if unit.action is not None:
        stage, microbatch = unit.action.stage, unit.action.microbatch
    elif unit.message is not None:
        msg = unit.message
        stage, microbatch = (msg.src_stage if unit.role == "send" else msg.dst_stage), msg.microbatch
    else:
        stage, microbatch = None, None
    return Failure(rank, stage, microbatch, unit.name, describe_error(exc))
