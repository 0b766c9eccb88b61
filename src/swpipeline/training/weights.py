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
thread's version inside ``use`` and the live parameter outside one. Nothing is swapped
on the module, so forwards of different iterations, a backward and a step can run at
once on different threads. Each iteration gets leaf tensors of its own (sharing the
version's storage), so two iterations on one version never add their gradients together;
a parameter shared by two submodules is one leaf. ``module.parameters()`` always gives
the live parameters (the optimizer's), even inside ``use``.

Runs. A run starts when a forward comes while every earlier iteration has stepped and
its number is not the next one (the first run, or a new ``pipe.run()`` numbering from 0
again): its version ``w_0`` is a copy of the live parameters at that moment, so weights
loaded after ``WeightVersions`` was made are the ones trained. A run abandoned with
iterations in flight leaves them behind until their contexts are freed; if a new run is
refused because of them, ``close()`` this ``WeightVersions`` and make a new one.

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
import itertools
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch

from ..plan.model import IterContext

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


class _VersionedParameters(Dict[str, Any]):
    """A submodule's parameter table: inside ``use``, each name gives the calling thread's leaf of its version."""

    __slots__ = ("owner",)

    def __init__(self, table: Dict[str, Any], owner: WeightVersions) -> None:
        super().__init__(table)
        self.owner = owner

    def __getitem__(self, name: str) -> Any:
        live = dict.__getitem__(self, name)
        current: Optional[Dict[int, torch.Tensor]] = getattr(self.owner._local, "current", None)
        if current is None or live is None:
            return live
        leaf = current.get(id(live))
        if leaf is None:
            raise RuntimeError(f"WeightVersions: parameter {name!r} was set after WeightVersions was made, so it "
                               f"has no versions: finish the module first, or close() and make a new WeightVersions")
        return leaf

    def __reduce__(self) -> Any:  # copy.deepcopy / pickle of the module: a plain table of the live parameters
        return (dict, (dict(self),))


class _InFlight(NamedTuple):
    """An iteration between its first ``use`` and its step: its context and its leaf per live parameter."""

    ctx: Callable[[], Optional[IterContext]]  # a weak reference: a freed context is an abandoned run's
    leaves: Dict[int, torch.Tensor]


def _context(ctx: IterContext) -> IterContext:
    """The context itself, also when a check hands the task a stand-in for it (its recording view)."""
    unwrap = getattr(type(ctx), "__swp_context__", None)
    if unwrap is None:
        raise TypeError(f"WeightVersions: expected the task's IterContext, got {type(ctx).__name__}")
    context: IterContext = unwrap(ctx)
    return context


def _refusal(module: torch.nn.Module) -> Optional[str]:
    """Why WeightVersions cannot version ``module`` (None: it can)."""
    for name, sub in module.named_modules():
        where = f"submodule {name!r}" if name else "it"
        kinds = {c.__name__ for c in type(sub).__mro__}
        if "OptimizedModule" in kinds or getattr(sub, "_compiled_call_impl", None) is not None:
            return (f"{where} is compiled (torch.compile), and compiled code does not read the parameters through "
                    f"the module at every call, so it would not see the iteration's version: give WeightVersions "
                    f"the module before compiling (for torch.compile(m), m._orig_mod) and run it uncompiled")
        wrapper = kinds & {"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"}
        if wrapper:
            return (f"{where} is wrapped in {wrapper.pop()}, which reads or reduces the live parameters itself while "
                    f"a stale iteration computes with its own version: give WeightVersions the plain module and "
                    f"average the gradients in the step, versions.step(ctx, optimizer, before_step=fn) with fn "
                    f"calling torch.distributed.all_reduce on each p.grad (then dividing by the world size)")
        if isinstance(sub, torch.nn.RNNBase):
            return (f"{where} is a {type(sub).__name__}, which keeps its own list of its weights (_flat_weights) "
                    f"and would compute with the live ones: write the loop with nn.RNNCell, nn.LSTMCell or "
                    f"nn.GRUCell, which read their parameters at every call")
        if isinstance(sub._parameters, _VersionedParameters):
            return f"{where} is already versioned by another WeightVersions: close() that one first"
    return None


class WeightVersions:
    """Versions of a module's weights, so forward, backward and optimizer step can run on different stages.

    ``with versions.use(ctx): out = module(x)`` runs the module on the iteration's version
    of the weights; the backward is the user's own ``loss.backward()``;
    ``versions.step(ctx, optimizer)`` hands the iteration's gradients to the live
    parameters, runs ``optimizer.step()`` and ``optimizer.zero_grad()``, and publishes the
    next version. Put ``versions.deps(forward_task, step_task)`` in the plan's
    ``inter_iter_deps``: the forward of iteration ``i`` waits for the step that published
    its version. Every iteration runs its forward under ``use`` and then one step, steps
    in iteration order.

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
        refusal = _refusal(module)
        if refusal is not None:
            raise ValueError(f"WeightVersions cannot version this {type(module).__name__}: {refusal}")
        self.module = module
        self.staleness = staleness
        self._live = list(module.parameters())  # each parameter once, shared ones too
        self._layout = self._current_layout()
        self._version_bytes = sum(p.numel() * p.element_size() for p in self._live)
        self._lock = threading.Lock()
        self._local = threading.local()  # .current: the leaves of the iteration this thread runs under use
        self._versions: Dict[int, List[torch.Tensor]] = {}  # v -> the weights after the step of iteration v - 1
        self._in_flight: Dict[int, _InFlight] = {}
        self._first = 0  # the run's first iteration: its version w_0 is numbered this
        self._next = 0  # the iteration whose step comes next
        self._stepping = False
        self._last_stepped: Callable[[], Optional[IterContext]] = lambda: None
        self._published = self._peak = 0
        self._closed = False
        for sub in module.modules():
            sub._parameters = _VersionedParameters(sub._parameters, self)

    # -- the three places a training loop touches ---------------------------------------------------

    @contextlib.contextmanager
    def use(self, ctx: IterContext) -> Iterator[None]:
        """A block in which the module, on this thread, computes with the iteration's version of the weights.

        Raises:
            RuntimeError: the version is not published yet (the dependency from ``deps`` is
                missing from the plan), the iteration has stepped already, or the module's
                parameters changed since ``WeightVersions`` was made.
        """
        leaves = self._leaves_of(_context(ctx))
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
                or steps come out of iteration order.
        """
        ctx = _context(ctx)
        i = ctx.iter_idx
        optimizers: Sequence[Any] = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
        with self._lock:
            self._check_open()
            held = self._in_flight.get(i)
            if held is None or held.ctx() is not ctx:
                done = held is None and self._first <= i < self._next
                raise RuntimeError(
                    f"WeightVersions.step: the step of iteration {i} ran already: call it once per iteration (with "
                    f"several optimizers, pass them as a list)" if done else
                    f"WeightVersions.step: iteration {i} has no weights in use: run its forward inside "
                    f"`with versions.use(ctx):`, with the same ctx, before its step")
            if i != self._next or self._stepping:
                raise RuntimeError(
                    f"WeightVersions.step: the step of iteration {i} came before the step of iteration {self._next} "
                    f"ended: a module's steps run one at a time, in iteration order (one step task in the plan)")
            self._stepping = True
        try:
            self._check_layout()
            for p in self._live:
                p.grad = held.leaves[id(p)].grad
            _keep_for_this_stream([p.grad for p in self._live])
            if before_step is not None:
                before_step()
            for opt in optimizers:
                opt.step()
            for opt in optimizers:
                opt.zero_grad()
            new = self._copy_live()
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
            self._last_stepped = weakref.ref(ctx)
            self._stepping = False

    def deps(self, forward: Any, step: Any) -> Tuple[Any, Any, int]:
        """The dependency for the plan's ``inter_iter_deps``: ``forward`` of iteration ``i`` after ``step`` of
        iteration ``i - staleness - 1``, which published the version it uses."""
        return (forward, step, self.staleness + 1)

    # -- what it costs, and the end --------------------------------------------------------------

    def stats(self) -> VersionStats:
        """How many versions were alive at most, and what one costs."""
        with self._lock:
            return VersionStats(self.staleness, self._peak, self._version_bytes, self._published)

    def close(self) -> None:
        """Give the module back its plain parameter tables (the live parameters, as trained) and drop the versions."""
        with self._lock:
            self._closed = True
            self._versions.clear()
            self._in_flight.clear()
        for sub in self.module.modules():
            if isinstance(sub._parameters, _VersionedParameters) and sub._parameters.owner is self:
                sub._parameters = dict(sub._parameters)

    # -- inside --------------------------------------------------------------------------------------

    def _leaves_of(self, ctx: IterContext) -> Dict[int, torch.Tensor]:
        i = ctx.iter_idx
        with self._lock:
            self._check_open()
            self._in_flight = {j: f for j, f in self._in_flight.items() if f.ctx() is not None}
            held = self._in_flight.get(i)
            if held is not None:
                if held.ctx() is ctx:
                    return held.leaves  # a second use in the same iteration
                raise RuntimeError(f"WeightVersions: iteration {i} is in flight with another IterContext: one run "
                                   f"at a time may use a WeightVersions")
            if self._last_stepped() is ctx:
                raise RuntimeError(f"WeightVersions.use: iteration {i} has stepped already: use(ctx) belongs in "
                                   f"its forward, before versions.step(ctx, ...)")
            if not self._in_flight and (not self._versions or i != self._next):
                self._start_run(i)
            elif i < self._next:
                raise RuntimeError(
                    f"WeightVersions.use: the forward of iteration {i} comes after the step of iteration "
                    f"{self._next - 1} while iterations {sorted(self._in_flight)} are in flight: a forward runs "
                    f"before its own step, in iteration order; if an abandoned run left these behind, close() "
                    f"this WeightVersions and make a new one")
            v = max(self._first, i - self.staleness)
            stash = self._versions.get(v)
            if stash is None:
                raise RuntimeError(self._unpublished(i, v))
            leaves = {id(p): t.detach().requires_grad_(p.requires_grad) for p, t in zip(self._live, stash)}
            self._in_flight[i] = _InFlight(weakref.ref(ctx), leaves)
            return leaves

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

    def _start_run(self, first: int) -> None:
        """A run starts at iteration ``first``: every earlier iteration has stepped; w_0 is the live weights now."""
        self._check_layout()
        self._first = self._next = first
        self._versions = {first: self._copy_live()}
        self._published += 1
        self._peak = max(self._peak, 1)

    def _copy_live(self) -> List[torch.Tensor]:
        with torch.no_grad():
            return [p.detach().clone() for p in self._live]

    def _current_layout(self) -> List[Tuple[str, int, torch.Size, torch.dtype, torch.device]]:
        return [(name, id(p), p.shape, p.dtype, p.device) for name, p in self.module.named_parameters()]

    def _check_layout(self) -> None:
        now = self._current_layout()
        if now != self._layout:
            changed = next((a or b)[0] for a, b in itertools.zip_longest(now, self._layout) if a != b)
            raise RuntimeError(
                f"WeightVersions: the module's parameters changed after WeightVersions was made (first at "
                f"{changed!r}: added, removed, replaced, or moved to another device or dtype): make WeightVersions "
                f"once the module is complete and in place, or close() this one and make a new one")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("WeightVersions: closed; make a new WeightVersions to train with versions again")


def _keep_for_this_stream(tensors: Sequence[Optional[torch.Tensor]]) -> None:
    """Mark each accelerator tensor as in use by the current stream: its memory, once freed, waits for that
    stream's work queued so far before it is handed out again (a no-op on the CPU)."""
    for t in tensors:
        if t is not None and t.device.type != "cpu" and hasattr(t, "record_stream"):
            t.record_stream(torch.get_device_module(t.device).current_stream(t.device))
