"""What every schedule does: know every rank's actions, prove them, run this rank's step.

A schedule's constructor computes every rank's compute actions from the configuration
(``orders.py``), derives the messages (``comms.py``) and the units of every rank
(``units.py``), and proves them together (``check.prove``) before anything is sent; a
schedule that could hang is refused there, on every rank alike. ``step()`` splits the
inputs into microbatches, runs this rank's plan (``runner.py``), then divides the summed
gradients by ``n_microbatches`` when ``scale_grads``: only this step's, so that gradients
accumulated over several steps without ``zero_grad`` add up each step's share (torch's divides
the whole gradient at every step, earlier steps' shares again)::

    __init__   orders -> derive -> units (all ranks) -> prove -> this rank's plan and engine
    step()     split -> set earlier gradients aside -> run the plan (one iteration) -> scale this step's
               gradients -> add the earlier ones back -> losses, output
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .actions import BWD, BWD_W, FWD, Action, RankOrders, format_orders, parse_orders
from .check import aligned_orders, prove
from .comms import PipelineWork, Skip, derive
from .data_parallel import gathered_for_the_step, sharded_modules
from .compute import StageOps, StepState, check_inputs
from .microbatch import merge_outputs, split_args_kwargs_into_chunks, split_target
from .orders import BUILT_IN, placement_of
from .placement import LOOP, V, Placement, of_orders, rule, stages_of
from .planner import StageCosts, costs_from_timelines, simulate_orders
from .runner import RankRunner
from .stage import PipelineStage
from .ties import TiedWeight, Ties
from .transport import Config, Transport
from .units import COMPUTE, RankUnits, units_of_rank

__all__: List[str] = []

DEFAULT_TIMEOUT_S = 300.0


class PipelineSchedule:
    """The part every schedule shares (see the module docstring); the schedules differ only in their orders.

    A built-in schedule names its order in ``orders.BUILT_IN`` (``_built_in``; where its stages live follows from
    it, ``orders.placement_of``). A schedule written as data gives every rank's actions instead: as
    ``ScheduleFromActions``' argument, or, as torch's custom schedules do, by setting ``pipeline_order`` in its
    ``__init__``; its stages live where its actions put them (``placement.of_orders``)."""

    _built_in = ""
    _given: Optional[RankOrders] = None  # a schedule written as data: every rank's compute actions

    def _orders(self, ranks: int, local: int, n: int, backward: bool) -> RankOrders:
        if self._given is not None:
            return {rank: [a for a in actions if backward or a.kind is FWD] for rank, actions in self._given.items()}
        if not self._built_in:
            raise ValueError(f"{type(self).__name__} has no order of actions: a schedule class of your own sets "
                             f"self.pipeline_order = {{rank: [actions, ...]}} in its __init__ (or use "
                             f"ScheduleFromActions(stages, n_microbatches, actions))")
        return BUILT_IN[self._built_in](ranks, local, n, backward)

    def __init__(self, stages: Sequence[PipelineStage], n_microbatches: int, loss_fn: Optional[Callable[..., Any]],
                 scale_grads: bool, *, timeout: float = DEFAULT_TIMEOUT_S, skips: Sequence[Skip] = (),
                 specs: Tuple[Any, Any, Any] = (None, None, None), tied_weights: Sequence[TiedWeight] = ()) -> None:
        self._stages = _check_stages(stages, type(self).__name__)
        if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, int) or n_microbatches < 1:
            raise ValueError(f"{type(self).__name__}: n_microbatches must be an int >= 1, got {n_microbatches!r}")
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError(f"{type(self).__name__}: loss_fn must be callable as loss_fn(output, target), got "
                            f"{type(loss_fn).__name__}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ValueError(f"{type(self).__name__}: timeout must be a finite number of seconds > 0, got {timeout!r}")
        first = self._stages[0]
        self._n_microbatches = n_microbatches
        self._loss_fn = loss_fn
        self.scale_grads = bool(scale_grads)
        self._timeout = float(timeout)
        self._skips = tuple(skips)
        self._args_spec, self._kwargs_spec, self._merge_spec = specs  # microbatch.py
        self.num_ranks, self.num_stages, self.rank = first.group_size, first.num_stages, first.group_rank
        self._has_first = any(s.is_first for s in self._stages)
        self._has_last = any(s.is_last for s in self._stages)
        self._sharded = sharded_modules([s.submod for s in self._stages])  # FSDP2's, data_parallel.py
        device = first.device if dist.get_backend(first.group) == "nccl" else torch.device("cpu")
        self._transport = Transport(first.group, self.rank, device, self._timeout)
        self._placement: Placement = LOOP
        self._tied_weights = tied_weights
        self._ties = Ties(tied_weights, self._stages, LOOP, self._timeout, type(self).__name__, resolve=False)
        self._built: Dict[bool, Tuple[PipelineWork, Dict[int, RankUnits]]] = {}
        self._runners: Dict[bool, RankRunner] = {}
        if self._given is not None or self._built_in:
            self._settle()  # proved now, before any rank sends anything

    def _settle(self) -> None:
        """Place the stages as the order says, check this rank's against it, derive and prove every rank's work."""
        placement: Placement = (placement_of(self._built_in) if self._given is None
                                else of_orders(self._given, self.num_ranks, self.num_stages))
        _check_placement(self._stages, type(self).__name__, placement)
        self._placement = placement
        self._ties = Ties(self._tied_weights, self._stages, placement, self._timeout, type(self).__name__)
        self._built.clear()
        self._runners.clear()
        self._work(self._loss_fn is not None)

    def _define(self, order: Mapping[int, Sequence[Any]], compute_only: bool) -> None:
        """A schedule of the user's own: every rank's actions, proved now."""
        self._given = parse_orders(order, compute_only)
        self._settle()

    @property
    def pipeline_order(self) -> Dict[int, List[Optional[Action]]]:
        """Every rank's compute actions on paper, one tick each, None where a rank idles (``print_schedule`` draws
        it). A schedule class of one's own sets it in its ``__init__`` to give its order, ``{rank: [actions]}``:
        ``Action`` objects, their strings (``"1F3"``), or torch's own action objects, ``None`` for an idle tick;
        it is checked and proved at once."""
        return aligned_orders(self._work(self._loss_fn is not None)[1], COMPUTE)

    @pipeline_order.setter
    def pipeline_order(self, order: Mapping[int, Sequence[Any]]) -> None:
        self._define(order, compute_only=False)

    @property
    def pipeline_order_with_comms(self) -> Dict[int, List[Action]]:
        """torch's form of a custom order that lists the sends and receives too. Set, its sends and receives are
        dropped and derived again from the compute actions (each send is posted as soon as its value exists, each
        receive taken just before the action that needs it); read, it gives every rank's compute actions."""
        return {rank: list(work.compute) for rank, work in self._work(self._loss_fn is not None)[0].ranks.items()}

    @pipeline_order_with_comms.setter
    def pipeline_order_with_comms(self, order: Mapping[int, Sequence[Any]]) -> None:
        self._define(order, compute_only=True)

    def _validate_and_set_stage_mapping(self, order: Mapping[int, Sequence[Any]]) -> None:
        """What a custom schedule written for torch calls after setting ``pipeline_order``: check it again."""
        self._define(order, compute_only=False)

    # -- every rank's schedule --------------------------------------------------------------------

    def _work(self, backward: bool) -> Tuple[PipelineWork, Dict[int, RankUnits]]:
        if backward not in self._built:
            local = self.num_stages // self.num_ranks
            orders = self._orders(self.num_ranks, local, self._n_microbatches, backward)
            work = derive(orders, self.num_ranks, self.num_stages, self._n_microbatches, backward, self._skips,
                          self._placement)
            units = {rank: units_of_rank(work, rank) for rank in range(self.num_ranks)}
            prove(units)
            self._built[backward] = (work, units)
        return self._built[backward]

    def format_schedule(self) -> str:
        """Every rank's compute actions side by side: a column per rank, a row per tick of one action each."""
        ticks = max(len(row) for row in self.pipeline_order.values())
        busy = sum(1 for row in self.pipeline_order.values() for a in row if a is not None)
        idle = 1 - busy / (ticks * self.num_ranks) if ticks else 0.0
        title = (f"{type(self).__name__}: {self.num_ranks} ranks, {self.num_stages} stages, "
                 f"{self._n_microbatches} microbatches; {ticks} ticks, {idle:.0%} idle (one tick per action)")
        return format_orders(self.pipeline_order, title)

    def print_schedule(self) -> None:
        """Print ``format_schedule()``."""
        print(self.format_schedule())

    # -- a step -----------------------------------------------------------------------------------

    def step(self, *args: Any, target: Any = None, losses: Optional[List[Any]] = None, return_outputs: bool = True,
             **kwargs: Any) -> Any:
        """Run one step of the whole batch, split into ``n_microbatches`` microbatches along dimension 0.

        Call it on every rank: the rank holding stage 0 with the input, the rank holding the last
        stage with ``target=`` (when there is a ``loss_fn``), the others with neither.

        Args:
            args, kwargs: the model's inputs; positional ones go to stage 0, keyword ones to every stage
                of this rank (tensors split along dimension 0, anything else given to every microbatch).
            target: the last stage's target, split like the inputs.
            losses: a list to fill with each microbatch's loss (on the rank of the last stage).
            return_outputs: whether the rank of the last stage returns the joined output.

        Returns:
            On the rank of the last stage, the outputs of every microbatch joined along dimension 0;
            elsewhere None.

        Raises:
            RuntimeError: gradients are disabled (use ``eval()``), or an earlier step failed.
            PipelineRankError: another rank failed (its rank, stage, microbatch and error are named).
            RankTimeoutError: a rank sent nothing for ``timeout`` seconds.
            Exception: what this rank's stage raised, with a note naming the action.
        """
        backward = self._loss_fn is not None
        if backward and not torch.is_grad_enabled():
            raise RuntimeError("step() needs gradients enabled to run the backward; it was called under "
                               "torch.no_grad(): call eval() for a forward-only step")
        return self._step(backward, args, kwargs, target, losses, return_outputs)

    def eval(self, *args: Any, target: Any = None, losses: Optional[List[Any]] = None, **kwargs: Any) -> Any:
        """A forward-only step (the same arguments as ``step``); losses are computed when ``target`` is given."""
        return self._step(False, args, kwargs, target, losses, True)

    def measure(self, *args: Any, target: Any = None, steps: int = 1, **kwargs: Any) -> StageCosts:
        """Run ``steps`` training steps like ``step()`` (their gradients add up as steps' do) with their timelines
        recorded, and return what every stage's forward and backward of one microbatch took: the costs that
        ``swpipeline.pp.simulate`` and ``autoplan`` take. Call it on every rank, like ``step()``.

        The costs are medians over the steps (each started by every rank together; one more traced step first,
        not counted, sets the timeline up); ``message_ms`` is what taking a received message costs plus a
        message's way between two ranks (ranks 0 and 1 time it); ``send_ms`` what packing and posting one costs
        its sender; ``step_ms`` is what a step took beyond its actions on paper.
        """
        durations: Dict[str, List[float]] = {}
        walls: List[float] = []
        group = self._stages[0].group
        for k in range(max(int(steps), 1) + 1):  # the first traced step sets the timeline up: not counted
            dist.barrier(group=group)  # every rank starts the step together: its wall is the step's, not a wait
            start = time.perf_counter()
            self._step(True, args, kwargs, target, None, False, trace=True)
            if k:
                walls.append((time.perf_counter() - start) * 1e3)
                for name, values in self._runner(True).durations().items():
                    durations.setdefault(name, []).extend(values)
        latency = 0.0  # a message's way from one rank to the next: ranks 0 and 1 time it for everyone
        if self.num_ranks > 1 and self.rank < 2:
            latency = self._transport.one_way_ms(1 - self.rank)
        mine = (durations, sorted(walls)[len(walls) // 2], args[0].shape[0] if self._has_first and args else 0,
                latency)
        gathered: List[Any] = [None] * self.num_ranks
        dist.all_gather_object(gathered, mine, group=group)
        batch = max(g[2] for g in gathered)
        costs = costs_from_timelines([g[0] for g in gathered], self.num_stages, max(batch // self._n_microbatches, 1),
                                     0.0)
        costs = dataclasses.replace(costs, message_ms=costs.message_ms + max(g[3] for g in gathered))
        orders = self._orders(self.num_ranks, self.num_stages // self.num_ranks, self._n_microbatches, True)
        on_paper = simulate_orders(orders, self.num_ranks, self._n_microbatches, batch, costs, self._skips,
                                   self._placement)
        return dataclasses.replace(costs, step_ms=max(max(g[1] for g in gathered) - on_paper, 0.0))

    def _step(self, backward: bool, args: Tuple[Any, ...], kwargs: Dict[str, Any], target: Any,
              losses: Optional[List[Any]], return_outputs: bool, trace: bool = False) -> Any:
        n = self._n_microbatches
        if self._has_first and not args:
            raise ValueError(f"step(): rank {self.rank} holds stage 0, which takes the model's input; pass it: "
                             f"step(x, ...)")
        if backward and self._has_last and target is None:
            raise ValueError(f"step(): rank {self.rank} holds the last stage, which computes loss_fn(output, target); "
                             f"pass target=")
        if losses is not None and not isinstance(losses, list):
            raise TypeError(f"step(): losses must be a list to fill, got {type(losses).__name__}")
        try:
            arg_mbs, kwarg_mbs = split_args_kwargs_into_chunks(args if self._has_first else (), kwargs, n,
                                                               self._args_spec if self._has_first else None,
                                                               self._kwargs_spec)
            targets = split_target(target, n) if self._has_last else None
        except ValueError as exc:
            raise ValueError(f"step(): {exc}") from None
        first = self._stages[0]
        if first.is_first and first.expected_inputs is not None:  # refused here, before any rank hears of the step
            for m, mb in enumerate(arg_mbs):
                check_inputs(first.expected_inputs, mb, 0, m, None)
        state = StepState(arg_mbs, kwarg_mbs, targets)
        scaled = backward and self.scale_grads and n != 1
        earlier = _set_aside_gradients(self._stages) if scaled else []
        ties = self._ties.step(n, state.tied) if backward and self._ties.mine else contextlib.nullcontext()
        try:
            with gathered_for_the_step(self._sharded), ties:
                self._runner(backward).run(state, trace)
        except BaseException:
            _add_back(earlier)  # as unscaled as the step left them, plus what was there before
            raise
        if scaled:
            for param in _parameters(self._stages):
                if param.grad is not None:
                    param.grad.div_(n)
            _add_back(earlier)
        if self._has_last and losses is not None and state.losses:
            losses.clear()
            losses.extend(state.losses[m] for m in range(n))
        if self._has_last and return_outputs:
            return merge_outputs([state.results[m] for m in range(n)], self._merge_spec)
        return None

    def _config(self, backward: bool) -> Config:
        """What this rank runs, for its HELLOs: a fingerprint of everything every rank must agree on (down to every
        rank's actions), and its description."""
        work = self._work(backward)[0]
        agreed = (type(self).__name__, self._n_microbatches, self.num_stages, self.num_ranks, self._placement,
                  self._skips, self.scale_grads, backward, self._ties.description(),
                  sorted((r, [str(a) for a in w.compute]) for r, w in work.ranks.items()))
        fingerprint = int.from_bytes(hashlib.blake2b(repr(agreed).encode(), digest_size=7).digest(), "big") or 1
        extras = [_placed(self._placement), f"skips {list(self._skips)}" if self._skips
                  else "", f"tied weights {self._ties.description()}" if self._ties.ties else "",
                  "scale_grads=False" if not self.scale_grads else "", "step()" if backward else "eval()"]
        text = (f"{type(self).__name__} with {self._n_microbatches} microbatches over {self.num_stages} stages"
                + "".join(f", {e}" for e in extras if e))
        return Config(fingerprint, text)

    def _runner(self, backward: bool) -> RankRunner:
        if backward not in self._runners:
            work, units = self._work(backward)
            sources = {s: [s - 1] + sorted(a for a, b in self._skips if b == s) for s in range(1, self.num_stages)}
            consumers = {s: ([s + 1] if s + 1 < self.num_stages else []) + sorted(b for a, b in self._skips if a == s)
                         for s in range(self.num_stages)}
            last: Dict[int, Action] = {}  # each stage's last action that writes its parameters' gradients
            for action in work.ranks[self.rank].compute:
                if action.kind in (BWD, BWD_W):
                    last[action.stage] = action
            ops = StageOps(self._stages, self._loss_fn, sources, consumers, backward, last,
                           self._ties if self._ties.exact_of_stage else None)
            self._runners[backward] = RankRunner(work, units[self.rank], self.rank, ops, self._transport,
                                                 self._stages[0].device, self._timeout, self._config(backward))
        return self._runners[backward]


def _set_aside_gradients(stages: Sequence[PipelineStage]) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Gradients accumulated before this step (no ``zero_grad`` since the last): a copy of each, the gradient
    itself zeroed in place (so that this step sums its microbatches from zero, as one process does, and a view
    into it, a DDP bucket's, stays one). Scaling then divides only this step's share."""
    earlier = []
    for param in _parameters(stages):
        if param.grad is not None:
            earlier.append((param.grad, param.grad.clone()))
            param.grad.zero_()
    return earlier


def _parameters(stages: Sequence[PipelineStage]) -> List[torch.nn.Parameter]:
    """The stages' parameters, each once (a tied weight may be one Parameter in two stages of a rank)."""
    return list({id(p): p for stage in stages for p in stage.submod.parameters()}.values())


def _add_back(earlier: List[Tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Add what ``_set_aside_gradients`` set aside to the gradients (this step's share first)."""
    for grad, before in earlier:
        grad.add_(before)


def _check_stages(stages: Sequence[PipelineStage], who: str) -> List[PipelineStage]:
    """This rank's stages, in pipeline order, all of one pipeline."""
    found = list(stages)
    if not found:
        raise ValueError(f"{who}: no stages given; pass this rank's PipelineStage(s)")
    for stage in found:
        if not isinstance(stage, PipelineStage):
            raise TypeError(f"{who}: stages must be swpipeline.pp.PipelineStage objects, got {type(stage).__name__} "
                            f"(a torch.distributed.pipelining stage cannot run here: build it from swpipeline.pp)")
    first = found[0]
    for stage in found[1:]:
        if (stage.num_stages, stage.group_size, stage.group) != (first.num_stages, first.group_size, first.group):
            raise ValueError(f"{who}: the stages belong to different pipelines ({first!r} and {stage!r}); give the "
                             f"stages of one pipeline, with the same num_stages and group")
    found.sort(key=lambda s: s.stage_index)
    indices = [s.stage_index for s in found]
    if len(set(indices)) != len(indices):
        raise ValueError(f"{who}: stage indices {indices} repeat; give each stage once")
    return found


def _check_placement(stages: Sequence[PipelineStage], who: str, placement: Placement) -> None:
    """This rank was given exactly the stages the placement puts on it."""
    first = stages[0]
    indices = [s.stage_index for s in stages]
    expected = stages_of(first.group_rank, first.group_size, first.num_stages, placement)
    if indices != expected:
        raise ValueError(f"{who}: rank {first.group_rank} holds the stages {expected} "
                         f"({rule(first.group_size, placement)}) but was given {indices}: build every one of them on "
                         f"this rank")


def _placed(placement: Placement) -> str:
    """The placement in a schedule's description (none for a loop)."""
    if isinstance(placement, tuple):
        return "stages on ranks " + " ".join(map(str, placement))
    return "placed in a V" if placement == V else ""
