"""Inside ``use``, the module's parameters are the iteration's version however they are read.

The story (a bug): inside ``with versions.use(ctx):`` an L2 term
``sum(p.square().sum() for p in model.parameters())`` read the live parameters (only
attribute reads gave the version). Its gradient landed on the live ``.grad``, which the
step overwrote with the iteration's gradients: even ``WeightVersions(model, staleness=0)``
under ``run_serial`` trained exactly as if the term were absent. Now ``parameters()``,
``named_parameters()``, ``state_dict()`` and the attributes give the version on the
thread inside ``use`` (the live parameters everywhere else); ``load_state_dict`` inside
``use`` is refused; and a gradient on a live parameter that no step put there (a term
computed outside ``use``) is refused at the step instead of dropped.

Compared bitwise: at staleness 0 with the plain training loop (no library), at staleness
2 with the reference loop of ``test_weights``, on ``run_serial`` and both engines.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, List, Sequence

import pytest
import torch
from torch import nn

from swpipeline import IterContext
from test_weights import (OPTIMIZERS, Batch, Driver, MakeOpt, Odd, Pipelined, Reference, assert_same_losses,
                          assert_same_state, batches, forward, loss_of, mlp)

pytestmark = pytest.mark.filterwarnings("ignore::swpipeline.SharedStreamWarning")

L2 = 0.05


def l2(params: Sequence[torch.Tensor]) -> torch.Tensor:
    total = sum(p.square().sum() for p in params)
    assert isinstance(total, torch.Tensor)
    return L2 * total


class WithL2(Pipelined):
    """The pipelined training of ``test_weights`` with an L2 term through ``model.parameters()`` inside use."""

    def fwd(self, ctx: IterContext) -> None:
        x, y = ctx.batch
        with self.versions.use(ctx):
            ctx.out = forward(self.model, ctx.iter_idx, x)
            ctx.loss = loss_of(ctx.out, y) + l2(list(self.model.parameters()))


def plain_loop(make_opt: MakeOpt, data: Sequence[Batch]) -> Reference:
    """The ordinary training loop with the L2 term, no library (kept in a Reference for the comparisons)."""
    ref = Reference(mlp(), make_opt, 0)
    model, opt = ref.model, ref.opt
    for i, (x, y) in enumerate(data):
        loss = loss_of(forward(model, i, x), y) + l2(list(model.parameters()))
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref.losses.append(loss.detach())
    return ref


@pytest.mark.parametrize("k, placement", [(0, "one-thread"), (0, "mixed"), (2, "per-stage")])
@pytest.mark.parametrize("runner", ["SWPipeline", "DataFlowPipeline", "run_serial"])
def test_an_l2_term_through_parameters_counts(runner: str, k: int, placement: str) -> None:
    data = batches()
    make_opt = OPTIMIZERS["SGD-momentum"]
    ref = plain_loop(make_opt, data) if k == 0 else Reference(mlp(), make_opt, k, penalty=l2).run(data)
    if k == 0:  # the reference loop agrees with the plain loop at staleness 0
        assert_same_losses(Reference(mlp(), make_opt, 0, penalty=l2).run(data).losses, ref.losses)
    without = Reference(mlp(), make_opt, k).run(data)
    assert not torch.equal(ref.losses[-1], without.losses[-1])  # the term changes the training
    run = WithL2("SWPipeline" if runner == "run_serial" else runner, placement, None, k, make_opt, len(data))
    if runner == "run_serial":
        run.pipe.run_serial(data)
    else:
        run.pipe.run(data)
    assert_same_losses(run.losses, ref.losses)
    assert_same_state(run.model, ref)
    run.versions.close()


@pytest.mark.parametrize("k", [0, 2])
def test_named_parameters_state_dict_and_attributes_inside_use_are_the_version(k: int) -> None:
    data = batches(4)
    lib = Driver(Odd().double(), OPTIMIZERS["SGD"], k, data)
    live = dict(lib.model.named_parameters())
    for j in range(len(data)):
        with lib.versions.use(lib.ctxs[j]):
            seen = dict(lib.model.named_parameters())
            assert list(seen) == list(live)  # the same names, a tied weight once
            assert all(seen[n] is not live[n] and not isinstance(seen[n], nn.Parameter) for n in live)
            assert [id(p) for p in lib.model.parameters()] == [id(p) for p in seen.values()]
            assert lib.model.a.weight is seen["a.weight"] and lib.model.b.weight is seen["a.weight"]
            assert dict(lib.model.a.named_parameters()) == {"weight": seen["a.weight"], "bias": seen["a.bias"]}
            assert seen["scale"].requires_grad is False and seen["a.weight"].requires_grad is True
            state = lib.model.state_dict()
            assert all(torch.equal(state[n], seen[n]) for n in live)
            assert state["a.weight"].data_ptr() == seen["a.weight"].data_ptr()  # the version itself, detached
            assert not state["a.weight"].requires_grad
            elsewhere: List[Any] = []
            other = threading.Thread(target=lambda: elsewhere.append(dict(lib.model.named_parameters())))
            other.start()
            other.join(10)
            assert all(elsewhere[0][n] is live[n] for n in live)  # another thread: the live parameters
        assert all(p is live[n] for n, p in lib.model.named_parameters())
        assert lib.model.a.weight is live["a.weight"]
        lib.fwd(j)
        lib.bwd(j)
        lib.step(j)
    lib.versions.close()


def test_load_state_dict_inside_use_is_refused_and_writes_nothing() -> None:
    data, k = batches(4), 1
    lib = Driver(mlp(), OPTIMIZERS["SGD"], k, data)
    other = mlp()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    ctx = lib.ctxs[0]
    with lib.versions.use(ctx):
        version = {n: t.clone() for n, t in lib.model.state_dict().items()}
        with pytest.raises(RuntimeError, match=r"load_state_dict on a Sequential inside `with versions.use\(ctx\):` "
                                               r"would write into the iteration's version of the weights, not the "
                                               r"live ones: load outside use"):
            lib.model.load_state_dict(other.state_dict())
        with pytest.raises(RuntimeError, match="load_state_dict on a Linear inside"):
            lib.model[0].load_state_dict(other[0].state_dict())
        assert all(torch.equal(t, version[n]) for n, t in lib.model.state_dict().items())
        clone = copy.deepcopy(lib.model)  # a plain module: its tables are plain, its copied hook does nothing
        clone.load_state_dict(other.state_dict())
        assert torch.equal(clone[0].weight, other[0].weight)
    assert all(torch.equal(p, mlp().state_dict()[n]) for n, p in lib.model.state_dict().items())
    lib.model.load_state_dict(other.state_dict())  # outside use: the live weights, as always
    assert torch.equal(lib.model[0].weight, other[0].weight)
    lib.versions.close()


def test_a_loss_term_on_the_live_parameters_is_refused_at_the_step() -> None:
    data, k = batches(4), 1
    lib = Driver(mlp(), OPTIMIZERS["SGD"], k, data)
    ctx = lib.ctxs[0]
    with lib.versions.use(ctx):
        out = lib.model(ctx.batch[0])
    loss = loss_of(out, ctx.batch[1]) + l2(list(lib.model.parameters()))  # outside use: the live parameters
    loss.backward()
    before = [p.detach().clone() for p in lib.model.parameters()]
    with pytest.raises(RuntimeError, match=r"WeightVersions.step: the live parameter '0.weight' has a gradient that "
                                           r"no step put there, before the step of iteration 0: a loss term computed "
                                           r"with the live parameters \(outside `with versions.use\(ctx\):`"):
        lib.versions.step(ctx, lib.opt)
    assert all(torch.equal(p, q) for p, q in zip(lib.model.parameters(), before))  # nothing stepped
    lib.opt.zero_grad()  # as the message says, then the same iteration steps
    lib.versions.step(ctx, lib.opt)


def test_gradients_left_by_earlier_training_are_not_taken_for_a_dropped_term() -> None:
    data, k = batches(4), 1
    model = mlp()
    opt = OPTIMIZERS["SGD"](model.parameters())
    x, y = data[0]
    loss_of(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=False)  # zeros left on .grad, before WeightVersions is made
    trained = copy.deepcopy(model)
    lib = Driver(model, OPTIMIZERS["SGD"], k, data)
    lib.drive(k, "late")
    ref = Reference(trained, OPTIMIZERS["SGD"], k).run(data)
    assert_same_losses(lib.losses, ref.losses)
    assert_same_state(lib.model, ref)


def test_parameters_outside_any_optimizer_keep_their_gradient_without_a_refusal() -> None:
    data, k = batches(4), 2
    model = mlp()
    opt = torch.optim.SGD(model[0].parameters(), lr=0.05)  # the head is in no optimizer
    lib = Driver(model, lambda _: opt, k, data).drive(k, "late")  # no step refused: the head's .grad is known
    assert model[2].weight.grad is not None  # the last iteration's, as the step left it
    lib.versions.close()


def test_a_version_changed_in_place_inside_use_is_refused_at_the_step() -> None:
    data, k = batches(4), 1
    lib = Driver(mlp(), OPTIMIZERS["SGD"], k, data)
    lib.fwd(0)
    ctx = lib.ctxs[1]
    with lib.versions.use(ctx):
        with torch.no_grad():
            lib.model[2].bias.mul_(0.5)  # the version's storage, not the live weights
    lib.bwd(0)
    with pytest.raises(RuntimeError, match=r"WeightVersions.step: parameter '2.bias' was changed in place inside "
                                           r"`with versions.use\(ctx\):` before the step of iteration 0 .* never "
                                           r"reaches the live weights"):
        lib.step(0)
    lib.versions.close()
