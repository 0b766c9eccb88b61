"""WeightVersions (weight stashing): what it computes, checked against a reference written here.

With staleness ``k``: ``w_0`` the initial weights, ``g_i = grad L(w_{max(0, i-k)}; x_i)``
(forward and backward of iteration ``i`` on one version), ``w_{i+1} = step(w_i, g_i)``
with the user's optimizer. ``reference`` computes exactly that with
``torch.func.functional_call`` on a copy of the model and its own optimizer, never
through the library; every comparison is bitwise (``torch.equal``).

* driven by hand in orders a pipeline could take (the step of ``i`` late, after the
  forward of ``i + k``; or early, right after its backward, so the version a forward uses
  differs from the live weights), for SGD, SGD with momentum, Adam and AdamW, ``k`` in 0..2;
* dropout (reseeded in the forward) and BatchNorm (running statistics equal too); a
  parameter with no gradient, a frozen one, tied ones; several runs; NaN;
* three threads forced by events: a forward paused halfway while a backward is paused
  halfway and a step of an earlier iteration runs to its end;
* the refusals and the misuse errors; ``stats()`` and ``close()``;
* the pipelines: ``run()`` == ``run_serial()`` == the reference, on both engines, for
  placements on one thread, one per stage and mixed, with the caller's thread group on
  and off, and with random sleeps in every task (hypothesis).
"""

from __future__ import annotations

import copy
import random
import threading
from datetime import timedelta
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.func import functional_call

from swpipeline import (DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, SWPipeline, TaskSchedule,
                        VersionStats, WeightVersions, analyze)

pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")

Batch = Tuple[torch.Tensor, torch.Tensor]
MakeOpt = Callable[[Any], torch.optim.Optimizer]

OPTIMIZERS: Dict[str, MakeOpt] = {
    "SGD": lambda ps: torch.optim.SGD(ps, lr=0.05),
    "SGD-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "Adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "AdamW": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}


def mlp(kind: str = "plain") -> nn.Module:
    torch.manual_seed(0)  # the same initial weights for the reference and the library
    middle: List[nn.Module] = {"plain": [nn.Tanh()], "dropout": [nn.ReLU(), nn.Dropout(0.3)],
                               "batchnorm": [nn.BatchNorm1d(16), nn.ReLU()]}[kind]
    return nn.Sequential(nn.Linear(6, 16), *middle, nn.Linear(16, 1)).double()


def batches(n: int = 8, seed: int = 7) -> List[Batch]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 6, generator=gen, dtype=torch.float64), torch.randn(8, 1, generator=gen,
                                                                               dtype=torch.float64))
            for _ in range(n)]


def forward(call: Callable[[torch.Tensor], torch.Tensor], i: int, x: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(1000 + i)  # only the forward draws (dropout), so reseeding it makes the masks match
    return call(x)


def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, y)


# -- the reference: the semantics, written without the library -------------------------------------------------

Penalty = Callable[[Sequence[torch.Tensor]], torch.Tensor]  # a loss term of the parameters (an L2 term)


class Reference:
    """The staleness-k loop on a copy of the model: versions kept as dicts, the forward by functional_call;
    ``penalty``, if given, is added to each loss, on the same version (the parameters in their order)."""

    def __init__(self, model: nn.Module, make_opt: MakeOpt, k: int, penalty: Optional[Penalty] = None) -> None:
        self.model, self.k, self.penalty = model, k, penalty
        self.params = dict(model.named_parameters())
        self.opt = make_opt(list(self.params.values()))
        self.losses: List[torch.Tensor] = []
        self.outputs: List[torch.Tensor] = []
        self.versions: Dict[int, Dict[str, torch.Tensor]] = {}

    def run(self, data: Sequence[Batch]) -> "Reference":
        """One run: its iterations numbered from 0, its w_0 the weights when it starts."""
        self.versions = {0: self._snapshot()}
        for i, (x, y) in enumerate(data):
            leaves = {n: t.detach().clone().requires_grad_(self.params[n].requires_grad)
                      for n, t in self.versions[max(0, i - self.k)].items()}
            out = forward(lambda inp: functional_call(self.model, leaves, (inp,)), i, x)
            loss = loss_of(out, y)
            if self.penalty is not None:
                loss = loss + self.penalty(list(leaves.values()))
            loss.backward()
            for n, p in self.params.items():
                p.grad = leaves[n].grad
            self.opt.step()
            self.opt.zero_grad()
            self.versions[i + 1] = self._snapshot()
            self.losses.append(loss.detach())
            self.outputs.append(out.detach())
        return self

    def _snapshot(self) -> Dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.params.items()}


def reference(make_model: Callable[[], nn.Module], make_opt: MakeOpt, k: int, data: Sequence[Batch],
              runs: int = 1) -> Reference:
    ref = Reference(make_model(), make_opt, k)
    for _ in range(runs):
        ref.run(data)
    return ref


def assert_same_state(model: nn.Module, ref: Reference) -> None:
    for (name, p), (_, q) in zip(model.state_dict().items(), ref.model.state_dict().items()):
        assert torch.equal(p, q), name  # parameters and buffers (BatchNorm's running statistics)
    assert len(model.state_dict()) == len(ref.model.state_dict())


def assert_same_losses(losses: Sequence[Optional[torch.Tensor]], expected: Sequence[torch.Tensor]) -> None:
    assert len(losses) == len(expected)
    for i, (a, b) in enumerate(zip(losses, expected)):
        assert a is not None and torch.equal(a, b), f"iteration {i}: {a} != {b}"


# -- the library driven by hand --------------------------------------------------------------------------------

class Driver:
    """The library's three calls on IterContexts made here; the test picks the order."""

    def __init__(self, model: nn.Module, make_opt: MakeOpt, k: int, data: Sequence[Batch], first: int = 0) -> None:
        self.model, self.data = model, data
        self.opt = make_opt(model.parameters())
        self.versions = WeightVersions(model, staleness=k)
        self.ctxs = [IterContext(batch, first + i) for i, batch in enumerate(data)]
        self.losses: List[Optional[torch.Tensor]] = [None] * len(data)

    def fwd(self, j: int) -> torch.Tensor:
        ctx = self.ctxs[j]
        x, y = ctx.batch
        with self.versions.use(ctx):
            ctx.out = forward(self.model, j, x)
        ctx.loss = loss_of(ctx.out, y)
        return ctx.out

    def bwd(self, j: int) -> None:
        self.ctxs[j].loss.backward()

    def step(self, j: int) -> None:
        self.versions.step(self.ctxs[j], self.opt)
        self.losses[j] = self.ctxs[j].loss.detach()

    def drive(self, k: int, schedule: str) -> "Driver":
        """``late``: at time t the forward of t, the backward of t - 1, the step of t - k (the step of i right
        after the forward of i + k); ``eager``: each iteration's forward, backward and step in turn, so each
        forward uses a version older than the live weights."""
        n = len(self.data)
        if schedule == "eager":
            for j in range(n):
                self.fwd(j)
                self.bwd(j)
                self.step(j)
            return self
        lag = min(1, k)
        for t in range(n + k):
            if t < n:
                self.fwd(t)
            if 0 <= t - lag < n:
                self.bwd(t - lag)
            if 0 <= t - k < n:
                self.step(t - k)
        return self


@pytest.mark.parametrize("schedule", ["late", "eager"])
@pytest.mark.parametrize("k", [0, 1, 2])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_driven_by_hand_equals_the_reference(opt: str, k: int, schedule: str) -> None:
    data = batches()
    ref = reference(mlp, OPTIMIZERS[opt], k, data)
    lib = Driver(mlp(), OPTIMIZERS[opt], k, data).drive(k, schedule)
    assert_same_state(lib.model, ref)
    assert_same_losses(lib.losses, ref.losses)
    other = reference(mlp, OPTIMIZERS[opt], k + 1, data)  # the test can tell staleness apart
    assert not torch.equal(ref.losses[-1], other.losses[-1])


def test_the_forward_sees_its_version_not_the_live_weights() -> None:
    data, k = batches(), 2
    lib = Driver(mlp(), OPTIMIZERS["SGD"], k, data)
    live = lib.model[0].weight
    for j in range(len(data)):
        with lib.versions.use(lib.ctxs[j]):
            seen = lib.model[0].weight
            assert seen is not live and not isinstance(seen, nn.Parameter)
            assert list(lib.model.parameters())[0] is seen  # on this thread, inside use, the module is the version
        assert lib.model[0].weight is live and list(lib.model.parameters())[0] is live  # the optimizer's
        assert torch.equal(seen, live) == (j == 0)  # eager: from iteration 1 on the live weights moved on
        lib.fwd(j)
        lib.bwd(j)
        lib.step(j)


@pytest.fixture
def one_intra_op_thread() -> Iterator[None]:
    """BatchNorm on a tiny batch: torch's intra-op thread pool costs it tens of milliseconds a call on few cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("kind", ["dropout", "batchnorm"])
@pytest.mark.parametrize("k", [0, 2])
@pytest.mark.usefixtures("one_intra_op_thread")
def test_dropout_and_batchnorm(kind: str, k: int) -> None:
    data = batches()
    ref = reference(lambda: mlp(kind), OPTIMIZERS["Adam"], k, data)
    lib = Driver(mlp(kind), OPTIMIZERS["Adam"], k, data).drive(k, "late")
    assert_same_state(lib.model, ref)  # the running statistics too, for BatchNorm
    assert_same_losses(lib.losses, ref.losses)


class Odd(nn.Module):
    """A parameter that never gets a gradient, a frozen one, and two linears sharing one weight."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.b.weight = self.a.weight  # tied
        self.unused = nn.Linear(6, 6)
        self.scale = nn.Parameter(torch.full((6,), 0.5), requires_grad=False)
        self.head = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x))) * self.scale))


@pytest.mark.parametrize("k", [0, 1, 2])
def test_unused_frozen_and_tied_parameters(k: int) -> None:
    data = batches()
    make = lambda: Odd().double()  # noqa: E731
    ref = reference(make, OPTIMIZERS["AdamW"], k, data)
    lib = Driver(make(), OPTIMIZERS["AdamW"], k, data).drive(k, "late")
    assert_same_state(lib.model, ref)
    assert_same_losses(lib.losses, ref.losses)
    assert lib.model.b.weight is lib.model.a.weight
    assert torch.equal(lib.model.unused.weight, make().unused.weight)  # AdamW skipped it: no gradient, ever
    assert lib.versions.stats().version_bytes == sum(p.numel() * 8 for p in lib.model.parameters())


def test_several_runs_each_numbered_from_zero() -> None:
    data, k = batches(6), 2
    ref = reference(mlp, OPTIMIZERS["SGD-momentum"], k, data, runs=2)
    lib = Driver(mlp(), OPTIMIZERS["SGD-momentum"], k, data).drive(k, "late")
    first = list(lib.losses)
    lib.ctxs = [IterContext(batch, i) for i, batch in enumerate(data)]  # a new run: 0, 1, ... again
    lib.drive(k, "late")
    assert_same_state(lib.model, ref)
    assert_same_losses(first + lib.losses, ref.losses)
    assert lib.versions.stats().published == 2 * (1 + len(data))


def test_a_run_may_start_at_any_iteration_number() -> None:
    data, k = batches(6), 1
    ref = reference(mlp, OPTIMIZERS["Adam"], k, data)
    lib = Driver(mlp(), OPTIMIZERS["Adam"], k, data, first=40)
    n = len(data)
    for t in range(n + k):  # the "late" order, on iterations 40, 41, ...
        if t < n:
            lib.fwd(t)
            lib.bwd(t)
        if 0 <= t - k < n:
            lib.step(t - k)
    assert_same_state(lib.model, ref)
    assert_same_losses(lib.losses, ref.losses)


def test_weights_loaded_after_wrapping_are_the_ones_trained() -> None:
    data, k = batches(), 2
    trained = mlp()
    with torch.no_grad():
        for p in trained.parameters():
            p.mul_(-0.5)

    def loaded() -> nn.Module:
        return copy.deepcopy(trained)

    ref = reference(loaded, OPTIMIZERS["SGD"], k, data)
    lib = Driver(mlp(), OPTIMIZERS["SGD"], k, data)
    lib.model.load_state_dict(trained.state_dict())  # after WeightVersions was made, before the run
    lib.drive(k, "late")
    assert_same_state(lib.model, ref)
    assert_same_losses(lib.losses, ref.losses)


def test_nan_goes_where_the_semantics_says() -> None:
    data, k = batches(), 2
    data[2][0][0, 0] = float("nan")
    ref = reference(mlp, OPTIMIZERS["SGD"], k, data)
    lib = Driver(mlp(), OPTIMIZERS["SGD"], k, data).drive(k, "late")
    finite = [bool(torch.isfinite(loss).item()) for loss in lib.losses if loss is not None]
    assert finite == [True, True, False, True, True, False, False, False]  # 3, 4 train on versions 1, 2
    for a, b in zip(lib.losses, ref.losses):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    for p, q in zip(lib.model.parameters(), ref.model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, equal_nan=True)


def test_an_exception_inside_use_leaves_the_module_as_it_was() -> None:
    data, k = batches(), 1
    ref = reference(mlp, OPTIMIZERS["SGD-momentum"], k, data)
    lib = Driver(mlp(), OPTIMIZERS["SGD-momentum"], k, data)
    live = lib.model[0].weight
    with pytest.raises(ZeroDivisionError):
        with lib.versions.use(lib.ctxs[0]):
            assert lib.model[0].weight is not live
            raise ZeroDivisionError
    assert lib.model[0].weight is live
    lib.drive(k, "late")  # iteration 0's forward runs again, on the same leaves (no gradient on them yet)
    assert_same_state(lib.model, ref)
    assert_same_losses(lib.losses, ref.losses)


def test_a_versioned_module_deep_copies_as_a_plain_one() -> None:
    lib = Driver(mlp(), OPTIMIZERS["SGD"], 1, batches(2))
    clone = copy.deepcopy(lib.model)
    assert all(type(sub._parameters) is dict for sub in clone.modules())
    assert torch.equal(clone[0].weight, lib.model[0].weight)
    WeightVersions(clone, staleness=1).close()  # a module of its own


# -- three threads, the interleaving forced --------------------------------------------------------------------

class Gate(nn.Module):
    """Identity; when armed, its forward says it is in and waits to be let go."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.go, self.armed = threading.Event(), threading.Event(), False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.armed:
            self.entered.set()
            assert self.go.wait(10)
        return x


def gated_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), Gate(), nn.Tanh(), nn.Linear(16, 1)).double()


def in_thread(fn: Callable[[], None], errors: List[BaseException]) -> threading.Thread:
    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_forward_backward_and_step_of_three_iterations_on_three_threads() -> None:
    """A: forward of 3 (version 1) paused between its two linears; C: backward of 2 (version 0) paused before the
    weights' gradients; B: the step of 1 runs to its end (publishing version 2) meanwhile; then C, then A go on."""
    data, k = batches(6), 2
    ref = reference(gated_mlp, OPTIMIZERS["SGD-momentum"], k, data)
    lib = Driver(gated_mlp(), OPTIMIZERS["SGD-momentum"], k, data)
    live = lib.model[0].weight
    for j in range(3):
        lib.fwd(j)
    lib.bwd(0)
    lib.bwd(1)
    lib.step(0)
    errors: List[BaseException] = []
    gate: Gate = lib.model[1]
    gate.armed = True
    out: List[torch.Tensor] = []
    a = in_thread(lambda: out.append(lib.fwd(3)), errors)
    assert gate.entered.wait(10)
    gate.armed = False
    c_in, c_go = threading.Event(), threading.Event()

    def pause(grad: torch.Tensor) -> torch.Tensor:
        c_in.set()
        assert c_go.wait(10)
        return grad

    lib.ctxs[2].out.register_hook(pause)
    c = in_thread(lambda: lib.bwd(2), errors)
    assert c_in.wait(10)
    b = in_thread(lambda: lib.step(1), errors)
    b.join(10)
    assert not b.is_alive() and not errors
    assert lib.model[0].weight is live  # this thread is in no use(): the live weights, now w_2
    assert torch.equal(live, ref.versions[2]["0.weight"]) and not torch.equal(live, ref.versions[1]["0.weight"])
    c_go.set()
    c.join(10)
    gate.go.set()
    a.join(10)
    assert not a.is_alive() and not c.is_alive() and not errors, errors
    assert torch.equal(out[0], ref.outputs[3])  # both linears of A's forward read version 1
    lib.bwd(3)
    lib.step(2)
    lib.step(3)
    for j in (4, 5):
        lib.fwd(j)
        lib.bwd(j)
        lib.step(j)
    assert_same_state(lib.model, ref)
    assert_same_losses(lib.losses, ref.losses)


# -- refusals and misuse ---------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's import
def test_refuses_a_compiled_module() -> None:
    model = mlp()
    with pytest.raises(ValueError, match=r"compiled \(torch.compile\).*_orig_mod\) and run it uncompiled"):
        WeightVersions(torch.compile(model), staleness=1)  # built, never run
    inner = mlp()
    inner.compile()  # compiled in place
    with pytest.raises(ValueError, match="compiled"):
        WeightVersions(inner, staleness=1)
    WeightVersions(model, staleness=1).close()  # the module itself is fine


def test_refuses_data_parallel_wrappers() -> None:
    import torch.distributed as dist

    from dist_harness import free_port

    with pytest.raises(ValueError, match="DataParallel.*before_step"):
        WeightVersions(nn.DataParallel(mlp()), staleness=1)
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=timedelta(seconds=20))
    try:
        ddp = nn.parallel.DistributedDataParallel(mlp())
        with pytest.raises(ValueError, match=r"wrapped in DistributedDataParallel.*all_reduce on each p.grad"):
            WeightVersions(ddp, staleness=1)
        with pytest.raises(ValueError, match="submodule 'inner' is wrapped in DistributedDataParallel"):
            WeightVersions(nn.ModuleDict({"inner": ddp}), staleness=1)
    finally:
        dist.destroy_process_group()


def test_refuses_recurrent_modules_that_keep_their_own_weights() -> None:
    with pytest.raises(ValueError, match=r"submodule 'rnn' is a LSTM.*nn.LSTMCell"):
        WeightVersions(nn.ModuleDict({"rnn": nn.LSTM(4, 4)}), staleness=1)
    WeightVersions(nn.LSTMCell(4, 4), staleness=1).close()


@pytest.mark.parametrize("bad, error, words", [
    (-1, ValueError, "staleness must be >= 0"),
    (1.5, TypeError, "staleness must be an int >= 0"),
    (True, TypeError, "staleness must be an int >= 0"),
])
def test_refuses_a_bad_staleness(bad: Any, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        WeightVersions(mlp(), staleness=bad)


def test_refuses_what_is_not_a_module() -> None:
    with pytest.raises(TypeError, match="module must be a torch.nn.Module, got function"):
        WeightVersions(lambda x: x, staleness=0)  # type: ignore[arg-type]


def test_refuses_a_second_weight_versions_on_one_module() -> None:
    model = mlp()
    first = WeightVersions(model, staleness=1)
    with pytest.raises(ValueError, match="already versioned by another WeightVersions: close"):
        WeightVersions(model, staleness=1)
    with pytest.raises(ValueError, match="submodule '0' is already versioned"):
        WeightVersions(nn.Sequential(model[0]), staleness=1)  # a module holding a versioned one
    first.close()
    WeightVersions(model, staleness=1).close()


def test_step_errors() -> None:
    lib = Driver(mlp(), OPTIMIZERS["SGD"], 2, batches(4))
    with pytest.raises(RuntimeError, match=r"iteration 0 has no weights in use: run its forward inside"):
        lib.step(0)  # before its forward
    lib.fwd(0)
    lib.fwd(1)
    lib.bwd(0)
    lib.bwd(1)
    with pytest.raises(RuntimeError, match=r"step of iteration 1 came before the step of iteration 0 ended"):
        lib.step(1)
    lib.step(0)
    with pytest.raises(RuntimeError, match=r"step of iteration 0 ran already: call it once per iteration"):
        lib.step(0)
    lib.step(1)  # nothing was lost on the way
    stranger = IterContext(lib.ctxs[2].batch, 2)
    lib.fwd(2)
    with pytest.raises(RuntimeError, match="iteration 2 has no weights in use.*with the same ctx"):
        lib.versions.step(stranger, lib.opt)


def test_a_forward_whose_version_is_not_published_names_the_dependency() -> None:
    lib = Driver(mlp(), OPTIMIZERS["SGD"], 1, batches(4))
    lib.fwd(0)
    lib.fwd(1)
    with pytest.raises(RuntimeError, match=r"iteration 2 needs version 1 of the weights, which the step of "
                                           r"iteration 0 has not published yet: put versions.deps\(forward, step\), "
                                           r"which is \(forward, step, 2\) at staleness 1, in the plan's "
                                           r"inter_iter_deps .* step of iteration i - 2"):
        lib.fwd(2)


def test_use_after_the_step_is_refused() -> None:
    lib = Driver(mlp(), OPTIMIZERS["SGD"], 0, batches(4))
    lib.fwd(0)
    lib.bwd(0)
    lib.step(0)
    with pytest.raises(RuntimeError, match="iteration 0 has stepped already: use\\(ctx\\) belongs in its forward"):
        lib.fwd(0)
    lib = Driver(mlp(), OPTIMIZERS["SGD"], 2, batches(4))
    for j in range(4):
        lib.fwd(j)  # the forward of 3 uses version 1: after the step of 0
        if j >= 2:
            lib.bwd(j - 2)
            lib.step(j - 2)
    with pytest.raises(RuntimeError, match=r"forward of iteration 1 comes after the step of iteration 1 while "
                                           r"iterations \[2, 3\] are in flight: .* \(a new run starts at its first "
                                           r"iteration"):
        with lib.versions.use(IterContext(None, 1)):  # iteration 0 would start a new run (a retry)
            pass


def test_parameters_changed_after_wrapping_are_refused() -> None:
    lib = Driver(mlp(), OPTIMIZERS["SGD"], 1, batches(4))
    lib.fwd(0)
    lib.model[0].weight = nn.Parameter(torch.zeros(16, 6, dtype=torch.float64))  # in the middle of the run
    with pytest.raises(RuntimeError, match="parameter 'weight' was set after WeightVersions was made"):
        lib.fwd(1)
    lib = Driver(mlp(), OPTIMIZERS["SGD"], 1, batches(4))
    lib.model[0].weight = nn.Parameter(torch.zeros(16, 6, dtype=torch.float64))  # before the run
    with pytest.raises(RuntimeError, match="parameters changed after WeightVersions was made \\(first at '0.weight'"):
        lib.fwd(0)
    lib = Driver(mlp(), OPTIMIZERS["SGD"], 1, batches(4))
    lib.model[2] = nn.Linear(16, 1).double()  # a new submodule: its table is a plain one
    with pytest.raises(RuntimeError, match=r"parameters changed after WeightVersions was made \(first at '2.weight'"):
        lib.fwd(0)
    lib = Driver(mlp(), OPTIMIZERS["SGD"], 1, batches(4))
    lib.fwd(0)
    lib.bwd(0)
    lib.model.float()  # moved to another dtype in the middle of the run
    with pytest.raises(RuntimeError, match="first at '0.weight': added, removed, replaced, or moved"):
        lib.step(0)


# -- what it costs, and the end --------------------------------------------------------------------------------

MLP_BYTES = (6 * 16 + 16 + 16 * 1 + 1) * 8  # float64


@pytest.mark.parametrize("k", [0, 1, 2, 5])
def test_stats_count_the_versions(k: int) -> None:
    data = batches(4)
    lib = Driver(mlp(), OPTIMIZERS["SGD"], k, data)
    assert lib.versions.stats() == VersionStats(k, 0, MLP_BYTES, 0)
    lib.fwd(0)
    assert lib.versions.stats() == VersionStats(k, 1, MLP_BYTES, 1)
    lib.bwd(0)
    lib.step(0)
    assert lib.versions.stats().peak_versions == min(k + 1, 2)
    for j in range(1, 4):
        lib.fwd(j)
        lib.bwd(j)
        lib.step(j)
    stats = lib.versions.stats()
    assert stats == VersionStats(k, min(k + 1, 5), MLP_BYTES, 5)  # after 4 steps: versions 0..4 published
    assert stats.peak_bytes == min(k + 1, 5) * MLP_BYTES
    assert len(lib.versions._versions) == min(k + 1, 5)


def test_stats_format() -> None:
    assert VersionStats(2, 3, MLP_BYTES, 7).format() == (
        "WeightVersions(staleness=2): at most 3 stashed version(s) besides the live parameters, 1.01 KiB each "
        "(3.02 KiB at the peak); 7 published")
    assert VersionStats(0, 1, 100, 1).format().endswith("100 B each (100 B at the peak); 1 published")
    assert "1.50 MiB each" in VersionStats(1, 2, 3 * 2**19, 1).format()


def test_close_gives_back_plain_tables_and_the_module_trains_normally() -> None:
    data, k = batches(6), 1
    lib = Driver(mlp(), OPTIMIZERS["SGD-momentum"], k, data).drive(k, "late")
    lib.versions.close()
    lib.versions.close()  # twice is fine
    assert all(type(sub._parameters) is dict for sub in lib.model.modules())
    with pytest.raises(RuntimeError, match="closed; make a new WeightVersions"):
        lib.fwd(0)
    plain = reference(mlp, OPTIMIZERS["SGD-momentum"], k, data)  # the same state, then a plain loop on both
    plain_opt = plain.opt
    for model, opt in ((lib.model, lib.opt), (plain.model, plain_opt)):
        for x, y in data:
            loss_of(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    assert_same_state(lib.model, plain)
    WeightVersions(lib.model, staleness=1).close()  # may be versioned again


def test_deps_is_the_triple_for_inter_iter_deps() -> None:
    for k in (0, 3):
        versions = WeightVersions(mlp(), staleness=k)
        assert versions.deps("fwd", "step") == ("fwd", "step", k + 1)
        versions.close()


def test_before_step_sees_the_iterations_gradients_and_several_optimizers_step() -> None:
    data, k = batches(4), 1
    ref = reference(mlp, OPTIMIZERS["SGD"], k, data)
    model = mlp()
    versions = WeightVersions(model, staleness=k)
    first, second = (torch.optim.SGD(list(m.parameters()), lr=0.05) for m in (model[0], model[2]))
    seen: List[bool] = []
    ctxs = [IterContext(b, i) for i, b in enumerate(data)]
    for j, ctx in enumerate(ctxs):
        with versions.use(ctx):
            ctx.loss = loss_of(forward(model, j, ctx.batch[0]), ctx.batch[1])
        ctx.loss.backward()
        if j >= k:
            versions.step(ctxs[j - k], [first, second],
                          before_step=lambda: seen.append(all(p.grad is not None for p in model.parameters())))
    versions.step(ctxs[-1], [first, second])
    assert seen == [True] * (len(data) - k)
    assert all(p.grad is None for p in model.parameters())
    for p, q in zip(model.parameters(), ref.model.parameters()):
        assert torch.equal(p, q)


# -- in a pipeline ---------------------------------------------------------------------------------------------

Placement = Tuple[Tuple[int, int, int], Tuple[str, str, str], Tuple[Optional[str], Optional[str], Optional[str]]]
PLACEMENTS: Dict[str, Placement] = {  # (stages, thread groups, streams) of fwd, bwd, step
    "one-thread": ((0, 0, 0), ("default", "default", "default"), (None, None, None)),
    "per-stage": ((0, 1, 2), ("g0", "g1", "g2"), ("s0", "s1", "s2")),
    "mixed": ((0, 1, 1), ("front", "default", "default"), ("front", None, None)),
}


class Pipelined:
    """The three tasks of one module's training on a pipeline: fwd (under use), bwd, step (collects the losses)."""

    def __init__(self, engine: str, placement: str, caller: Any, k: int, make_opt: MakeOpt, n: int,
                 jitter: Optional[int] = None) -> None:
        self.model = mlp()
        self.opt = make_opt(self.model.parameters())
        self.versions = WeightVersions(self.model, staleness=k)
        self.losses: List[Optional[torch.Tensor]] = [None] * n
        self.jitter, self.fail_at = jitter, -1
        tasks = [PipelineTask("fwd", self.fwd), PipelineTask("bwd", self.bwd), PipelineTask("step", self.step)]
        stages, groups, streams = PLACEMENTS[placement]
        schedule = {t: TaskSchedule(stage=s, thread_group=g, stream=st_)
                    for t, s, g, st_ in zip(tasks, stages, groups, streams)}
        f, b, s = tasks
        plan = PipelinePlan(schedule, intra_iter_deps=[(b, f), (s, b)], inter_iter_deps=[self.versions.deps(f, s)])
        if engine == "SWPipeline":
            self.pipe: Any = SWPipeline(plan, device="cpu", caller_thread_group=caller)
        else:
            self.pipe = DataFlowPipeline(plan, max_depth=plan.depth + 1, device="cpu", caller_thread_group=caller)

    def nap(self, name: str, ctx: IterContext) -> None:
        if self.jitter is not None:
            threading.Event().wait(random.Random(f"{self.jitter}-{name}-{ctx.iter_idx}").uniform(0, 0.002))

    def fwd(self, ctx: IterContext) -> None:
        self.nap("fwd", ctx)
        x, y = ctx.batch
        with self.versions.use(ctx):
            ctx.out = forward(self.model, ctx.iter_idx, x)
        ctx.loss = loss_of(ctx.out, y)

    def bwd(self, ctx: IterContext) -> None:
        self.nap("bwd", ctx)
        if ctx.iter_idx == self.fail_at:
            raise ZeroDivisionError(f"bwd of iteration {ctx.iter_idx}")
        ctx.loss.backward()

    def step(self, ctx: IterContext) -> None:
        self.nap("step", ctx)
        self.versions.step(ctx, self.opt)
        self.losses[ctx.iter_idx] = ctx.loss.detach()


def pipeline_run(engine: str, placement: str, caller: Any, k: int, make_opt: MakeOpt, data: Sequence[Batch],
                 serial: bool = False, jitter: Optional[int] = None) -> Tuple[nn.Module, List[Optional[torch.Tensor]]]:
    run = Pipelined(engine, placement, caller, k, make_opt, len(data), jitter)
    if serial:
        run.pipe.run_serial(data)
    else:
        run.pipe.run(data)
    assert run.versions.stats().peak_versions == min(k + 1, len(data) + 1)  # fixed by the steps, not by timing
    run.versions.close()
    return run.model, run.losses


def check_pipeline(engine: str, placement: str, caller: Any, k: int, opt: str, jitter: Optional[int] = None) -> None:
    stages = PLACEMENTS[placement][0]
    assert stages[2] - stages[0] <= k + 1  # the version a forward needs is published by then
    data = batches()
    ref = reference(mlp, OPTIMIZERS[opt], k, data)
    for serial in (False, True):
        model, losses = pipeline_run(engine, placement, caller, k, OPTIMIZERS[opt], data, serial, jitter)
        for p, q in zip(model.parameters(), ref.model.parameters()):
            assert torch.equal(p, q), ("run_serial" if serial else "run")
        assert_same_losses(losses, ref.losses)


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_pipeline_equals_the_reference_for_each_optimizer(opt: str, k: int) -> None:
    check_pipeline("SWPipeline", "per-stage", "auto", k, opt)


@pytest.mark.parametrize("caller", ["auto", None], ids=["caller-runs-last-group", "every-group-on-a-worker"])
@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("k", [1, 2])
def test_pipeline_equals_the_reference_for_each_placement(k: int, placement: str, engine: str, caller: Any) -> None:
    check_pipeline(engine, placement, caller, k, "SGD-momentum")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), k=st.sampled_from([1, 2]), placement=st.sampled_from(list(PLACEMENTS)),
       engine=st.sampled_from(["SWPipeline", "DataFlowPipeline"]), caller=st.sampled_from(["auto", None]))
def test_random_sleeps_never_change_the_answer(seed: int, k: int, placement: str, engine: str, caller: Any) -> None:
    check_pipeline(engine, placement, caller, k, "Adam", jitter=seed)


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_pipeline_runs_twice_as_two_epochs(engine: str) -> None:
    data, k = batches(6), 2
    ref = reference(mlp, OPTIMIZERS["Adam"], k, data, runs=2)
    run = Pipelined(engine, "per-stage", None, k, OPTIMIZERS["Adam"], len(data))
    run.pipe.run(data)
    first = list(run.losses)
    run.pipe.run(data)  # iterations numbered from 0 again: a new run from the live weights
    assert_same_losses(first + run.losses, ref.losses)
    for p, q in zip(run.model.parameters(), ref.model.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("caller", ["auto", None], ids=["caller-runs-last-group", "every-group-on-a-worker"])
@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_a_run_after_an_abandoned_one_starts_from_the_steps_that_ran(engine: str, caller: Any) -> None:
    data, k = batches(6), 2
    run = Pipelined(engine, "per-stage", caller, k, OPTIMIZERS["SGD-momentum"], len(data))
    run.fail_at = 3
    with pytest.raises(ZeroDivisionError):
        run.pipe.run(data)  # abandoned with iterations in flight (their contexts go with the exception)
    m = sum(loss is not None for loss in run.losses)  # the steps that ran: 0 .. m - 1 (timing decides m)
    assert 1 <= m <= 3 and all(loss is not None for loss in run.losses[:m])
    stepped = run.losses[:m]
    run.fail_at = -1
    run.losses = [None] * len(data)
    run.pipe.run(data)
    ref = Reference(mlp(), OPTIMIZERS["SGD-momentum"], k).run(data[:m]).run(data)
    assert_same_losses(stepped + run.losses, ref.losses)
    for p, q in zip(run.model.parameters(), ref.model.parameters()):
        assert torch.equal(p, q)


def test_a_run_after_an_abandoned_one_driven_by_hand() -> None:
    data, k = batches(6), 2
    lib = Driver(mlp(), OPTIMIZERS["SGD"], k, data)
    for j in range(3):
        lib.fwd(j)
        lib.bwd(j)
    lib.step(0)
    lib.fwd(3)
    lib.bwd(3)
    lib.step(1)  # iterations 2 and 3 are left in flight
    kept = lib.ctxs  # the abandoned iterations' contexts stay alive: the new run's iteration 0 starts it anyway
    lib.ctxs = [IterContext(batch, i) for i, batch in enumerate(data)]
    first = [loss for loss in lib.losses if loss is not None]
    lib.losses = [None] * len(data)
    lib.drive(k, "late")
    ref = Reference(mlp(), OPTIMIZERS["SGD"], k).run(data[:2]).run(data)
    assert_same_losses(first + lib.losses, ref.losses)
    assert_same_state(lib.model, ref)
    assert len(kept) == len(data)


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_the_race_check_changes_nothing_and_finds_no_race(engine: str) -> None:
    # check_races hands each task a recording view of its context: WeightVersions keys the iteration by the
    # context the view stands for, so the checked run computes the reference
    data = batches()
    ref = reference(mlp, OPTIMIZERS["Adam"], 2, data)
    run = Pipelined(engine, "per-stage", "auto", 2, OPTIMIZERS["Adam"], len(data))
    plan = run.pipe.plan
    checked = SWPipeline(plan, device="cpu", check_races=True) if engine == "SWPipeline" else \
        DataFlowPipeline(plan, max_depth=plan.depth + 1, device="cpu", check_races=True)
    checked.run(data)
    for p, q in zip(run.model.parameters(), ref.model.parameters()):
        assert torch.equal(p, q)
    assert_same_losses(run.losses, ref.losses)


def test_the_analysis_finds_no_missing_dependency_in_a_versioned_plan() -> None:
    run = Pipelined("SWPipeline", "per-stage", "auto", 2, OPTIMIZERS["SGD-momentum"], 2)
    analysis = analyze(run.pipe.plan, batches(1)[0], warmup=1)
    assert analysis.missing_deps == [] and analysis.warnings == []
    assert "ctx.loss" in analysis.writes["fwd"] and "model.0.weight" in analysis.writes["step"]
