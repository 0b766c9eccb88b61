"""Weight stashing: forward, backward and the optimizer step of one module on different pipeline stages.

A pipeline that puts a module's forward and its optimizer step on different stages (or
thread groups) overlaps the forward of iteration ``i`` with the step of an earlier
iteration. The optimizer updates the parameters in place while autograd still holds
them for a backward to come: without care the run races. ``WeightVersions`` gives each
iteration's forward *and* backward one version of the weights, and lets the optimizer
update the live parameters. With staleness ``k``, and a run's iterations numbered from 0::

    w_0                         the live parameters when the run's first forward starts
    g_i = grad L(w_v; x_i)      v = max(0, i - k): forward and backward of iteration i use version v
    w_{i+1} = step(w_i, g_i)    the user's optimizer on the live parameters (its state as usual)

``k = 0`` is the serial loop. Version ``v`` is published by the step of iteration
``v - 1``, so the forward of iteration ``i`` depends on the step of iteration
``i - k - 1``: ``versions.deps(forward, step)`` is that dependency, for the plan's
``inter_iter_deps``. The answer depends on ``k`` only, not on the engine, the placement
or thread timing; ``run_serial`` computes it too.

How a forward sees its version while other threads run other iterations: every
submodule's parameter table is replaced, once, by a table that gives the calling
thread's version inside ``use`` and the live parameter outside one (``tables.py``).
Nothing is swapped on the module, so forwards of different iterations, a backward and a
step can run at once on different threads. Each iteration gets leaf tensors of its own
(sharing the version's storage), so two iterations on one version never add their
gradients together; a parameter shared by two submodules is one leaf. Inside ``use``, on
its thread, the module is the version however its parameters are read: attributes,
``parameters()``, ``named_parameters()``, ``state_dict()``; a loss term written with
them (an L2 term) gets its gradient into the step, as in the serial loop. Outside
``use`` (the optimizer, the step) they are the live parameters. Refused rather than
lost: ``load_state_dict`` inside ``use`` (it would write into a version); at the step, a
version changed in place inside ``use`` (other iterations would see the change, the
live weights never) and a gradient on a live parameter that no step put there (a term
computed with the live parameters, outside ``use``, which the step would overwrite).

Runs. Every run takes its ``w_0`` from the live parameters when its first forward
starts, so weights loaded between runs (or after ``WeightVersions`` was made) are the
ones trained. A run starts at the forward of its first iteration: a forward numbered
at or below the current run's first iteration, with a context other than the one in
flight for it (``run``, ``run_serial`` and ``fill_pipeline`` number every run from 0, on
new contexts), or a forward of any number not the next one once every iteration has
stepped. Iterations of an earlier run still in flight (a failed or abandoned run) are
abandoned then: their step or forward, if it still comes, is refused. A new run while a
step of the earlier one runs on another thread is refused.

Not versioned: buffers (BatchNorm's running statistics) are updated in place by the
forward, in iteration order, as in the serial loop. A module run outside ``use`` (or on
another thread that its forward starts) computes with the live parameters.

Memory: at most ``k + 1`` versions besides the live parameters (a version is dropped
once no later iteration can use it), and the gradients of every iteration between its
backward and its step (one iteration's in the serial loop). ``stats()`` reports the
versions.

Streams. The backward leaves its gradients in memory of the forward's stream; the step
hands them to the optimizer on its own stream and then drops them, while the host runs
on. Each gradient is marked as in use by the step's stream (``record_stream``), so the
allocator gives its memory to the next backward only after the optimizer has read it.
A version is made on the step's stream and read on the forward's: it is dropped by a
later step, which the plan's dependencies order after every backward that used it.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch

from ..plan.context import IterContext
from .live import LiveParameters
from .tables import VersionedParameters, iteration_context, keep_for_this_stream, refusal, refuse_load_inside_use

__all__: List[str] = []


@dataclass(frozen=True)
class VersionStats:
    """What the stashed versions cost: how many were alive at most, and the bytes of one."""

    staleness: int
    peak_versions: int  # stashed versions alive at once, at most (the live parameters not counted)
    version_bytes: int  # the bytes of one version (every parameter once)
    published: int  # versions published so far (each run's first one included)

    @property
    def peak_bytes(self) -> int:
        return self.peak_versions * self.version_bytes

    def format(self) -> str:
        return (f"WeightVersions(staleness={self.staleness}): at most {self.peak_versions} stashed version(s) "
                f"besides the live parameters, {_size(self.version_bytes)} each ({_size(self.peak_bytes)} at the "
                f"peak); {self.published} published")


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


class _InFlight(NamedTuple):
    """An iteration between its first ``use`` and its step: its context and its leaf per live parameter."""

    ctx: Callable[[], Optional[IterContext]]  # a weak reference: a freed context is an abandoned run's
    leaves: Dict[int, torch.Tensor]
    marks: Tuple[int, ...]  # each leaf's version counter when made (shared with its version's storage)


class WeightVersions:
    """Versions of a module's weights, so forward, backward and optimizer step can run on different stages.

    ``with versions.use(ctx): out = module(x)`` runs the module on the iteration's version
    of the weights; the backward is the user's own ``loss.backward()``;
    ``versions.step(ctx, optimizer)`` hands the iteration's gradients to the live
    parameters, runs ``optimizer.step()`` and ``optimizer.zero_grad()``, and publishes the
    next version. Put ``versions.deps(forward_task, step_task)`` in the plan's
    ``inter_iter_deps``: the forward of iteration ``i`` waits for the step that published
    its version. Every iteration runs its forward under ``use`` and then one step, steps
    in iteration order. Every run takes its version 0 from the live weights when it
    starts; inside ``use`` the module's parameters, read in any way, are the version.

    Make it once the module is complete, on its device and dtype: parameters added,
    replaced or moved afterwards are refused at the next forward or step. Refused outright:
    a ``torch.compile``'d module, a ``DistributedDataParallel`` (or ``DataParallel``, FSDP)
    wrapper and ``nn.RNN``/``LSTM``/``GRU`` (the error says what to do instead).

    Args:
        module: the module whose parameters are versioned (all of them, its submodules' too).
        staleness: ``k >= 0``: the forward of iteration ``i`` uses the weights after the step of
            iteration ``i - k - 1`` (``k = 0``: the serial loop).

    Raises:
        TypeError: ``module`` is not a module, or ``staleness`` is not an int.
        ValueError: ``staleness < 0``, or a module that cannot be versioned (named in the message).
    """

    def __init__(self, module: torch.nn.Module, staleness: int) -> None:
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"WeightVersions: module must be a torch.nn.Module, got {type(module).__name__}")
        if isinstance(staleness, bool) or not isinstance(staleness, int):
            raise TypeError(f"WeightVersions: staleness must be an int >= 0 (0 is the serial loop), "
                            f"got {staleness!r}")
        if staleness < 0:
            raise ValueError(f"WeightVersions: staleness must be >= 0 (0 is the serial loop), got {staleness}")
        why = refusal(module)
        if why is not None:
            raise ValueError(f"WeightVersions cannot version this {type(module).__name__}: {why}")
        self.module = module
        self.staleness = staleness
        self._local = threading.local()  # .current: the leaves of the iteration this thread runs under use
        self._live = LiveParameters(module, self._local)
        self._lock = threading.Lock()
        self._versions: Dict[int, List[torch.Tensor]] = {}  # v -> the weights after the step of iteration v - 1
        self._in_flight: Dict[int, _InFlight] = {}
        self._run = 0  # the current run's number (0: none yet); each context is marked with the run it ran in
        self._run_of: weakref.WeakKeyDictionary[IterContext, int] = weakref.WeakKeyDictionary()
        self._first = 0  # the run's first iteration: its version w_0 is numbered this
        self._next = 0  # the iteration whose step comes next
        self._stepping = False
        self._published = self._peak = 0
        self._closed = False
        self._load_hooks = [_before_load(sub, refuse_load_inside_use) for sub in module.modules()]
        for sub in module.modules():
            sub._parameters = VersionedParameters(sub._parameters, self, self._local)

    # -- the three places a training loop touches ---------------------------------------------------

    @contextlib.contextmanager
    def use(self, ctx: IterContext) -> Iterator[None]:
        """A block in which the module, on this thread, computes with the iteration's version of the weights.

        Inside it, on this thread, the module's parameters are that version wherever they are
        read: as attributes (``module.fc.weight``), through ``parameters()``,
        ``named_parameters()`` and ``state_dict()``; a loss term written with them gets its
        gradient into the iteration's step. ``load_state_dict`` is refused inside it.

        Raises:
            RuntimeError: the version is not published yet (the dependency from ``deps`` is
                missing from the plan), the iteration has stepped already or belongs to a run
                that ended, or the module's parameters changed since ``WeightVersions`` was made.
        """
        leaves = self._leaves_of(iteration_context(ctx))
        before = getattr(self._local, "current", None)
        self._local.current = leaves
        try:
            yield
        finally:
            self._local.current = before

    def step(self, ctx: IterContext, optimizer: Any, before_step: Optional[Callable[[], None]] = None) -> None:
        """The iteration's step: its gradients on the live parameters' ``.grad``, ``before_step()``, then
        ``optimizer.step()`` and ``optimizer.zero_grad()``; then the next version is published.

        A parameter the iteration gave no gradient gets ``.grad = None``, as after ``zero_grad()``.

        Args:
            ctx: the iteration's context (the one its forward ran ``use`` with).
            optimizer: an optimizer over the live parameters, or a list of them (each steps, then each
                zeroes its gradients).
            before_step: called with no arguments once the gradients are on ``.grad``, before the
                optimizer: clip or all-reduce them there.

        Raises:
            RuntimeError: the iteration's forward did not run under ``use(ctx)``, its step ran already,
                it belongs to a run that ended, steps come out of iteration order, or a live parameter
                has a gradient the step would drop (a loss term computed outside ``use``).
        """
        ctx = iteration_context(ctx)
        i = ctx.iter_idx
        optimizers: Sequence[Any] = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
        held = self._claim_step(ctx, i)
        try:
            live = self._live
            live.check_layout()
            live.check_unchanged(held.leaves, held.marks, i)
            live.check_no_stray_gradient(i)
            for p in live.params:
                p.grad = held.leaves[id(p)].grad
            keep_for_this_stream([p.grad for p in live.params])
            if before_step is not None:
                before_step()
            for opt in optimizers:
                opt.step()
            for opt in optimizers:
                opt.zero_grad()
            live.handed = live.grads_now()
            new = live.copy()
        except BaseException:
            with self._lock:
                self._stepping = False
            raise
        with self._lock:
            del self._in_flight[i]
            self._versions[i + 1] = new
            self._next = i + 1
            for v in [v for v in self._versions if v < i + 1 - self.staleness]:  # no later iteration uses it
                del self._versions[v]
            self._published += 1
            self._peak = max(self._peak, len(self._versions))
            self._stepping = False

    def deps(self, forward: Any, step: Any) -> Tuple[Any, Any, int]:
        """The dependency for the plan's ``inter_iter_deps``: ``forward`` of iteration ``i`` after ``step`` of
        iteration ``i - staleness - 1``, which published the version it uses."""
        return (forward, step, self.staleness + 1)

    # -- what it costs, and the end --------------------------------------------------------------

    def __swp_named_tensors__(self) -> List[Tuple[torch.Tensor, str, torch.Tensor]]:
        """For the checks' reports: (the live parameter, ``"version v"``, the tensor) for each stashed version, so
        that ``analyze`` names what a forward reads after its parameter (an iteration's leaves share its
        version's memory, and so its name)."""
        with self._lock:
            return [(p, f"version {v}", t)
                    for v, tensors in self._versions.items() for p, t in zip(self._live.params, tensors)]

    def stats(self) -> VersionStats:
        """How many versions were alive at most, and what one costs."""
        with self._lock:
            return VersionStats(self.staleness, self._peak, self._live.version_bytes, self._published)

    def close(self) -> None:
        """Give the module back its plain parameter tables (the live parameters, as trained) and drop the versions."""
        with self._lock:
            self._closed = True
            self._versions.clear()
            self._in_flight.clear()
        for hook in self._load_hooks:
            hook.remove()
        for sub in self.module.modules():
            table = sub._parameters
            if isinstance(table, VersionedParameters) and table.owner is self:
                sub._parameters = dict(table.live_items())

    # -- inside: runs and forwards ---------------------------------------------------------------------

    def _leaves_of(self, ctx: IterContext) -> Dict[int, torch.Tensor]:
        """The leaves the forward of ``ctx``'s iteration computes with (made at its first ``use``).

        A run starts at the first forward of its first iteration: a forward numbered at or below
        the current run's first iteration whose context is not the one in flight for it (every
        run of ``run``, ``run_serial`` and ``fill_pipeline`` numbers its iterations from 0), or
        any forward when every iteration of the run has stepped and its number is not the next
        one. Iterations of an earlier run still in flight are abandoned then.
        """
        i = ctx.iter_idx
        with self._lock:
            self._check_open()
            self._in_flight = {j: f for j, f in self._in_flight.items() if f.ctx() is not None}
            held = self._in_flight.get(i)
            if held is not None and held.ctx() is ctx:
                return held.leaves  # a second use in the same iteration
            self._refuse_a_used_context(ctx, i, "use")
            if i <= self._first or (not self._in_flight and (not self._versions or i != self._next)):
                self._start_run(i)
            elif held is not None:
                raise RuntimeError(f"WeightVersions: iteration {i} is in flight with another IterContext: one run "
                                   f"at a time may use a WeightVersions")
            elif i < self._next:
                raise RuntimeError(
                    f"WeightVersions.use: the forward of iteration {i} comes after the step of iteration "
                    f"{self._next - 1} while iterations {sorted(self._in_flight)} are in flight: a forward runs "
                    f"before its own step, in iteration order (a new run starts at its first iteration, 0 for "
                    f"run(), run_serial() and fill_pipeline())")
            v = max(self._first, i - self.staleness)
            stash = self._versions.get(v)
            if stash is None:
                raise RuntimeError(self._unpublished(i, v))
            leaves = {id(p): t.detach().requires_grad_(p.requires_grad) for p, t in zip(self._live.params, stash)}
            self._in_flight[i] = _InFlight(weakref.ref(ctx), leaves, tuple(t._version for t in leaves.values()))
            self._run_of[ctx] = self._run
            return leaves

    def _refuse_a_used_context(self, ctx: IterContext, i: int, what: str) -> None:
        """Refuse a context whose iteration is no longer in flight: it stepped, or its run ended."""
        run = self._run_of.get(ctx)
        if run is None:
            return
        if run != self._run:
            raise RuntimeError(
                f"WeightVersions.{what}: iteration {i} belongs to a run that ended (a new run started at iteration "
                f"{self._first}): the iterations it left in flight were abandoned; one run at a time may use a "
                f"WeightVersions")
        raise RuntimeError(
            f"WeightVersions.step: the step of iteration {i} ran already: call it once per iteration (with several "
            f"optimizers, pass them as a list)" if what == "step" else
            f"WeightVersions.use: iteration {i} has stepped already: use(ctx) belongs in its forward, before "
            f"versions.step(ctx, ...)")

    def _start_run(self, first: int) -> None:
        """A run starts at iteration ``first``: w_0 is the live weights now; what was in flight is abandoned."""
        if self._stepping:
            raise RuntimeError(
                f"WeightVersions: a new run starts at iteration {first} while the step of iteration {self._next} "
                f"of the run before is running on another thread: wait for that step to end first")
        self._live.check_layout()
        self._run += 1
        self._first = self._next = first
        self._in_flight = {}
        self._versions = {first: self._live.copy()}
        self._published += 1
        self._peak = max(self._peak, 1)

    def _unpublished(self, i: int, v: int) -> str:
        """The error for a forward whose version is not published yet: the dependency, and what to do when the
        placement refuses it."""
        d = self.staleness + 1
        stages = "stage" if d == 1 else "stages"
        return (f"WeightVersions: the forward of iteration {i} needs version {v} of the weights, which the step of "
                f"iteration {v - 1} has not published yet: put versions.deps(forward, step), which is (forward, step, "
                f"{d}) at staleness {self.staleness}, in the plan's inter_iter_deps (the forward of iteration i then "
                f"waits for the step of iteration i - {d}). If the plan refuses that dependency because the step is "
                f"more than {d} {stages} after the forward, make the WeightVersions with staleness = the stage gap - 1 "
                f"(the step's stage minus the forward's, minus 1) and put its versions.deps(forward, step) in "
                f"inter_iter_deps, or move the step to at most {d} {stages} after the forward")

    # -- inside: steps ---------------------------------------------------------------------------------

    def _claim_step(self, ctx: IterContext, i: int) -> _InFlight:
        """Iteration ``i``'s leaves, once its step may run (marked running); else the error saying why not."""
        with self._lock:
            self._check_open()
            held = self._in_flight.get(i)
            if held is None or held.ctx() is not ctx:
                self._refuse_a_used_context(ctx, i, "step")
                raise RuntimeError(f"WeightVersions.step: iteration {i} has no weights in use: run its forward inside "
                                   f"`with versions.use(ctx):`, with the same ctx, before its step")
            if i != self._next or self._stepping:
                raise RuntimeError(
                    f"WeightVersions.step: the step of iteration {i} came before the step of iteration {self._next} "
                    f"ended: a module's steps run one at a time, in iteration order (one step task in the plan)")
            self._stepping = True
            return held

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("WeightVersions: closed; make a new WeightVersions to train with versions again")


def _before_load(module: torch.nn.Module, hook: Callable[..., None]) -> Any:
    """Register ``hook`` to run when ``load_state_dict`` reaches ``module``; returns its removable handle."""
    register: Callable[[Callable[..., None]], Any] = module.register_load_state_dict_pre_hook
    return register(hook)
