"""The schedules, under torch.distributed.pipelining's names and constructor arguments.

Each one is ``PipelineSchedule`` with its own action orders (``orders.py``)::

    ScheduleGPipe(stage, n_microbatches, loss_fn=None, ..., scale_grads=True)
    Schedule1F1B(stage, n_microbatches, loss_fn=None, ..., scale_grads=True)
    ScheduleInterleaved1F1B(stages, n_microbatches, loss_fn=None, ..., scale_grads=True)
    ScheduleInterleavedZeroBubble(stages, n_microbatches, loss_fn=None, ..., scale_grads=True)
    ScheduleLoopedBFS(stages, n_microbatches, loss_fn=None, output_merge_spec=None, scale_grads=True)
    ScheduleZBVZeroBubble(stages, n_microbatches, loss_fn=None, ..., scale_grads=True)    (stages in a V)
    ScheduleDualPipeV(stages, n_microbatches, loss_fn=None, ..., scale_grads=True)        (stages in a V)
    ScheduleFromActions(stages, n_microbatches, actions, loss_fn=None, scale_grads=True)

Every schedule also takes, keyword only, ``timeout=`` (seconds to wait for a rank to start
its step before failing, naming it; twice that for a later message; default 300) and
``skips=`` (skip connections: ``(from stage, to stage)`` pairs at least two stages apart; the
later stage's forward takes the previous stage's output, then each skip source's, in stage
order), and ``tied_weights=`` (weights that several stages use, each holding a copy: a list of
``TiedWeight``; every copy gets the one-process gradient, see ``ties.py``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Union

from . import orders
from .actions import ActionLike, parse_orders
from .comms import Skip
from .schedule_base import DEFAULT_TIMEOUT_S, PipelineSchedule
from .stage import PipelineStage
from .ties import TiedWeight

__all__: List[str] = []

LossFn = Optional[Callable[..., Any]]


def _check_specs(who: str, args_chunk_spec: Any, kwargs_chunk_spec: Any) -> None:
    """The chunk specs' outer shape: a tuple or list (one spec per positional argument), a dict (per keyword)."""
    if args_chunk_spec is not None and not isinstance(args_chunk_spec, (tuple, list)):
        raise TypeError(f"{who}: args_chunk_spec must be a tuple with one spec per positional argument, such as "
                        f"TensorChunkSpec.from_tuple((0, 1)), got {args_chunk_spec!r}")
    if kwargs_chunk_spec is not None and not isinstance(kwargs_chunk_spec, Mapping):
        raise TypeError(f"{who}: kwargs_chunk_spec must be a dict with one spec per keyword argument, such as "
                        f"TensorChunkSpec.from_dict({{'mask': 1}}), got {kwargs_chunk_spec!r}")


class PipelineScheduleSingle(PipelineSchedule):
    """A schedule with one stage per rank (``num_stages`` equal to the number of ranks)."""

    def __init__(self, stage: PipelineStage, n_microbatches: int, loss_fn: LossFn = None,
                 args_chunk_spec: Any = None, kwargs_chunk_spec: Any = None, output_merge_spec: Any = None,
                 scale_grads: bool = True, *, timeout: float = DEFAULT_TIMEOUT_S, skips: Iterable[Skip] = (),
                 tied_weights: Sequence[TiedWeight] = ()) -> None:
        who = type(self).__name__
        _check_specs(who, args_chunk_spec, kwargs_chunk_spec)
        if not isinstance(stage, PipelineStage):
            raise TypeError(f"{who}: stage must be a swpipeline.pp.PipelineStage, got {type(stage).__name__}")
        if stage.num_stages != stage.group_size:
            raise ValueError(f"{who} runs one stage per rank, but the pipeline has {stage.num_stages} stages on "
                             f"{stage.group_size} ranks: use ScheduleInterleaved1F1B for several stages per rank")
        super().__init__([stage], n_microbatches, loss_fn, scale_grads, timeout=timeout,
                         skips=_check_skips(who, skips, [stage]),
                         specs=(args_chunk_spec, kwargs_chunk_spec, output_merge_spec), tied_weights=tied_weights)


class ScheduleGPipe(PipelineScheduleSingle):
    """GPipe: every microbatch's forward, then every backward (fill and drain)."""

    _built_in = "ScheduleGPipe"


class Schedule1F1B(PipelineScheduleSingle):
    """1F1B: after a warm-up of forwards, one backward and one forward in turn, so fewer activations live at once.

    Unlike torch.distributed.pipelining's, it runs with fewer microbatches than stages too.
    """

    _built_in = "Schedule1F1B"


class PipelineScheduleMulti(PipelineSchedule):
    """A schedule with several stages per rank, placed in a loop (stage ``s`` on rank ``s % ranks``).

    A schedule class of one's own, as torch's custom schedules are written, subclasses it and sets
    ``self.pipeline_order = {rank: [actions]}`` in its ``__init__`` (torch's ``_Action`` objects
    are read too); its stages may be placed anyhow, each on the rank whose list holds its actions::

        class Mine(PipelineScheduleMulti):
            def __init__(self, stages, n_microbatches, loss_fn=None):
                super().__init__(stages, n_microbatches, loss_fn)
                self.pipeline_order = {0: ["0F0", "1F0", "4F0", "4B0", "1B0", "0B0"], 1: ["2F0", "3F0", "3B0", "2B0"]}

    ``backward_requires_autograd`` and ``defer_pp_recv`` are accepted for torch's sake and change
    nothing: the backward always runs autograd, and receives wait on threads of their own, never
    in front of the compute that does not need them.
    """

    def __init__(self, stages: Sequence[PipelineStage], n_microbatches: int, loss_fn: LossFn = None,
                 args_chunk_spec: Any = None, kwargs_chunk_spec: Any = None, output_merge_spec: Any = None,
                 scale_grads: bool = True, backward_requires_autograd: bool = True, defer_pp_recv: bool = False, *,
                 timeout: float = DEFAULT_TIMEOUT_S, skips: Iterable[Skip] = (),
                 tied_weights: Sequence[TiedWeight] = ()) -> None:
        who = type(self).__name__
        _check_specs(who, args_chunk_spec, kwargs_chunk_spec)
        if isinstance(stages, PipelineStage):
            stages = [stages]
        stages = list(stages)
        if stages and isinstance(stages[0], PipelineStage) and self._built_in:
            _check_fit(who, self._built_in, stages[0], n_microbatches)
        super().__init__(stages, n_microbatches, loss_fn, scale_grads, timeout=timeout,
                         skips=_check_skips(who, skips, stages),
                         specs=(args_chunk_spec, kwargs_chunk_spec, output_merge_spec), tied_weights=tied_weights)


class ScheduleInterleaved1F1B(PipelineScheduleMulti):
    """Interleaved 1F1B: several stages per rank, microbatches through them in groups of ``ranks`` (depth first)."""

    _built_in = "ScheduleInterleaved1F1B"


class ScheduleInterleavedZeroBubble(PipelineScheduleMulti):
    """Interleaved zero bubble: the backward split into the inputs' gradients (I) and the weights' (W), the W's
    held back to fill the bubble at the end of the step."""

    _built_in = "ScheduleInterleavedZeroBubble"


class ScheduleLoopedBFS(PipelineScheduleMulti):
    """Looped breadth-first: several stages per rank (placed in a loop), every microbatch through one stage before
    the next; the backwards from the rank's last stage to its first, each stage's in microbatch order (torch's
    runs them last microbatch first, which sums each gradient in the reverse of one process's order).

    torch's arguments (no chunk specs), in torch's order."""

    def __init__(self, stages: Sequence[PipelineStage], n_microbatches: int, loss_fn: LossFn = None,
                 output_merge_spec: Any = None, scale_grads: bool = True, backward_requires_autograd: bool = True,
                 defer_pp_recv: bool = False, *, timeout: float = DEFAULT_TIMEOUT_S, skips: Iterable[Skip] = ()
                 ) -> None:
        super().__init__(stages, n_microbatches, loss_fn, None, None, output_merge_spec, scale_grads,
                         backward_requires_autograd, defer_pp_recv, timeout=timeout, skips=skips)

    _built_in = "ScheduleLoopedBFS"


class ScheduleZBVZeroBubble(PipelineScheduleMulti):
    """ZBV zero bubble: two stages per rank placed in a V (rank ``r`` holds stages ``r`` and ``2p - 1 - r``), each
    backward split in I then W, the W's of the drain held back to fill its bubble. Same order as torch's."""

    _built_in = "ScheduleZBVZeroBubble"


class ScheduleDualPipeV(PipelineScheduleMulti):
    """DualPipeV: two stages per rank placed in a V, at least ``2p`` microbatches; in its steady state each rank
    runs a forward of one of its stages beside a backward of the other (one after the other here: a rank computes
    on one thread), the end of the drain split in I and W. Same order as torch's."""

    _built_in = "ScheduleDualPipeV"


class _PipelineScheduleRuntime(PipelineScheduleMulti):
    """The base torch gives custom schedules that list their sends and receives (``pipeline_order_with_comms``);
    here a ``PipelineScheduleMulti`` like any other: the sends and receives are derived from the compute actions."""


class _ScheduleForwardOnly(PipelineScheduleSingle):
    """torch's forward-only schedule: every microbatch's forward, stage after stage; ``step()`` is ``eval()``."""

    _built_in = "ScheduleGPipe"

    def step(self, *args: Any, target: Any = None, losses: Optional[List[Any]] = None, return_outputs: bool = True,
             **kwargs: Any) -> Any:
        """A forward-only step, as ``eval()``."""
        return self._step(False, args, kwargs, target, losses, return_outputs)


class ScheduleFromActions(PipelineScheduleMulti):
    """A schedule written as data: every rank's compute actions, checked before anything runs.

    ::

        ScheduleFromActions(stages, 2, {0: "0F0 0F1 0B0 0B1", 1: "1F0 1B0 1F1 1B1"}, loss_fn=loss)

    Args:
        stages: this rank's stages; each stage lives on the rank whose list holds its actions (any placement).
        n_microbatches: microbatches per step.
        actions: per rank, its compute actions in order (``Action`` objects or strings such as
            ``"1F3"``; a list, or one string with spaces between them; ``None`` entries are ignored).
            The sends and receives are derived from them.
        loss_fn, scale_grads, timeout, skips: as for the other schedules.

    Raises:
        ValueError: an action missing, repeated or on the wrong rank.
        ScheduleHangError: the actions would hang; it names the ranks, microbatches and actions
            that wait for each other.
    """

    def __init__(self, stages: Sequence[PipelineStage], n_microbatches: int,
                 actions: Mapping[int, Union[str, Sequence[Optional[ActionLike]]]], loss_fn: LossFn = None,
                 scale_grads: bool = True, *, timeout: float = DEFAULT_TIMEOUT_S, skips: Iterable[Skip] = (),
                 tied_weights: Sequence[TiedWeight] = ()) -> None:
        self._given = parse_orders(actions)
        super().__init__(stages, n_microbatches, loss_fn, scale_grads=scale_grads, timeout=timeout, skips=skips,
                         tied_weights=tied_weights)


def _check_fit(who: str, built_in: str, first: PipelineStage, n_microbatches: Any) -> None:
    """The stages divide over the ranks, as many as the built-in order ``built_in`` runs per rank (if any), with
    enough microbatches for it (an ``n_microbatches`` that is no int is refused later, by the schedule)."""
    if first.num_stages % first.group_size:
        raise ValueError(f"{who}: {first.num_stages} stages do not divide evenly over {first.group_size} ranks; give "
                         f"every rank the same number of stages")
    if built_in and isinstance(n_microbatches, int) and not isinstance(n_microbatches, bool):
        reason = orders.unfit(built_in, first.group_size, first.num_stages // first.group_size, n_microbatches)
        if reason is not None:
            raise ValueError(f"{who}: {reason}")


def _check_skips(who: str, skips: Iterable[Skip], stages: Sequence[Any]) -> List[Skip]:
    """Skip connections as (earlier stage, later stage) pairs, at least two stages apart; none given: those of the
    traced model the stages were built from (``tracer.py``)."""
    found: List[Skip] = []
    given = list(skips)
    if not given and stages and isinstance(stages[0], PipelineStage):
        given = list(stages[0].skips)
    for pair in given:
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(s, int) for s in pair)):
            raise TypeError(f"{who}: skips are (from stage, to stage) pairs of ints, got {pair!r}")
        a, b = pair
        total = stages[0].num_stages if stages and isinstance(stages[0], PipelineStage) else b + 1
        if not 0 <= a < b - 1 < total - 1:
            raise ValueError(f"{who}: skip {pair} must go from a stage to a later one at least two stages on, both "
                             f"in 0..{total - 1} (the next stage gets the output anyway)")
        if pair not in found:
            found.append(pair)
    return found
