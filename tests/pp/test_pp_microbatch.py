"""swpipeline.pp.microbatch (splitting and joining with chunk specs) and swpipeline.pp.backward (a stage's backward
under torch's three names), in one process, against torch's own functions and a whole backward."""

from __future__ import annotations

import copy
from typing import Any, List

import pytest
import torch
from torch import nn
from torch.distributed.pipelining import microbatch as torch_mb
from torch.distributed.pipelining.microbatch import _Replicate

from swpipeline.pp.backward import stage_backward, stage_backward_input, stage_backward_weight
from swpipeline.pp.microbatch import TensorChunkSpec, merge_chunks, merge_outputs, split_args_kwargs_into_chunks


def _data() -> List[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(7, 5, generator=gen), torch.randn(4, 9, generator=gen), torch.randn(7, 2, 3, generator=gen)]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@pytest.mark.parametrize("args_spec, kwargs_spec", [
    (None, None),
    ((TensorChunkSpec(0), TensorChunkSpec(1), TensorChunkSpec(2)), {"m": TensorChunkSpec(1)}),
    (TensorChunkSpec.from_tuple((1, 0, 0)), TensorChunkSpec.from_dict({"m": 0})),
])
def test_split_equals_torch_s(args_spec: Any, kwargs_spec: Any) -> None:
    a, b, c = _data()
    args, kwargs = (a, b, c), {"m": b, "flag": 3}
    ours = split_args_kwargs_into_chunks(args, kwargs, 3, args_spec, kwargs_spec)
    theirs = torch_mb.split_args_kwargs_into_chunks(args, kwargs, 3, args_spec,
                                                    None if kwargs_spec is None else {**kwargs_spec,
                                                                                      "flag": _Replicate})
    assert _same(ours, theirs)
    if args_spec is None:
        assert [t[1].shape for t in ours[0]] == [(2, 9), (1, 9), (1, 9)]  # as tensor_split: the larger first


def test_nested_values_are_split_per_tensor_and_the_rest_given_whole() -> None:
    a, b, _ = _data()
    shared = torch.ones(3)
    arg_chunks, kwarg_chunks = split_args_kwargs_into_chunks(
        ({"x": a, "pair": (a, "tag")}, shared), {"n": 2}, 2, ({"x": TensorChunkSpec(1)}, _Replicate))
    assert [c[0]["x"].shape for c in arg_chunks] == [(7, 3), (7, 2)]  # the spec of "x": dimension 1
    assert [c[0]["pair"][0].shape for c in arg_chunks] == [(4, 5), (3, 5)]  # no spec: dimension 0
    assert all(c[0]["pair"][1] == "tag" and c[1] is shared for c in arg_chunks)  # given whole
    assert kwarg_chunks == [{"n": 2}, {"n": 2}]
    joined = merge_chunks([c[0]["x"] for c in arg_chunks], TensorChunkSpec(1))
    assert torch.equal(joined, a)


@pytest.mark.parametrize("call, message", [
    (lambda a: split_args_kwargs_into_chunks((a,), {}, 8), "positional argument 0 has 7 rows along dimension 0, "
                                                           "too few to split into 8 microbatches; give at least 8"),
    (lambda a: split_args_kwargs_into_chunks((), {"m": a}, 2, None, {"m": TensorChunkSpec(2)}),
     "keyword argument 'm' has 2 dimensions, so it cannot be split along dimension 2"),
    (lambda a: split_args_kwargs_into_chunks((a, a), {}, 2, (TensorChunkSpec(0),)),
     "args_chunk_spec has 1 specs for 2 positional arguments: give one per argument"),
    (lambda a: split_args_kwargs_into_chunks(((a, a),), {}, 2, ((TensorChunkSpec(0),) * 3,)),
     r"the spec of positional argument 0, \(TensorChunkSpec\(0\), TensorChunkSpec\(0\), TensorChunkSpec\(0\)\), "
     r"does not match its value's structure \(a tuple of 2\)"),
    (lambda a: split_args_kwargs_into_chunks((), {"m": a}, 2, None, {"z": TensorChunkSpec(0)}),
     r"kwargs_chunk_spec names \['z'\], which are not among the keyword arguments \['m'\]"),
    (lambda a: split_args_kwargs_into_chunks((a,), {}, 0), "chunks must be an int >= 1, got 0"),
])
def test_bad_splits_are_refused_naming_the_argument(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(_data()[0])


def test_merge_follows_the_spec_and_the_schedules_detach() -> None:
    a = torch.randn(6, 4, requires_grad=True)
    pieces = [(p, p.t(), {"s": p.sum()}) for p in torch.tensor_split(a, 3)]
    merged = merge_chunks(pieces, (TensorChunkSpec(0), TensorChunkSpec(1), None))
    assert torch.equal(merged[0], a) and torch.equal(merged[1], a.t()) and merged[0].requires_grad
    sums = [float(p.sum().detach()) for p in torch.tensor_split(a, 3)]
    assert [float(s.detach()) for s in merged[2]["s"]] == sums  # no dimension: a list
    assert not merge_outputs(pieces, (TensorChunkSpec(0), TensorChunkSpec(1), None))[0].requires_grad
    assert repr(TensorChunkSpec(1)) == "TensorChunkSpec(1)"
    assert TensorChunkSpec.from_tuple((1,)) == (TensorChunkSpec(1),)
    with pytest.raises(TypeError, match="split_dim must be an int"):
        TensorChunkSpec("0")  # type: ignore[arg-type]


# -- the backward ------------------------------------------------------------------------------------------------

def _module_and_input() -> Any:
    torch.manual_seed(0)
    mod = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))
    x = torch.randn(5, 6, requires_grad=True)
    return mod, x, copy.deepcopy(mod), x.detach().clone().requires_grad_()


def test_a_split_backward_equals_a_whole_one_bit_for_bit() -> None:
    mod, x, ref, ref_x = _module_and_input()
    ref(ref_x).pow(2).sum().backward()
    dinputs, groups = stage_backward_input([mod(x).pow(2).sum()], None, [x], mod.parameters())
    assert torch.equal(dinputs[0], ref_x.grad) and torch.equal(x.grad, ref_x.grad)
    assert all(p.grad is None for p in mod.parameters())  # the weights wait for W
    grads = stage_backward_weight(mod.parameters(), groups)
    assert all(torch.equal(g, p.grad) and torch.equal(g, r.grad) for g, p, r in
               zip(grads, mod.parameters(), ref.parameters()))


def test_a_whole_backward_from_outputs_and_their_gradients() -> None:
    mod, x, ref, ref_x = _module_and_input()
    out = mod(x)
    grad = torch.ones_like(out) / 3
    got = stage_backward((out, out.detach()), (grad, None), [x, "not a tensor"])
    ref(ref_x).backward(grad)
    assert torch.equal(got[0], ref_x.grad) and got[1] is None
    assert all(torch.equal(p.grad, r.grad) for p, r in zip(mod.parameters(), ref.parameters()))
    with pytest.raises(ValueError, match="given 1 output gradients for 2 outputs"):
        stage_backward((mod(x), mod(x)), (grad,), [x])
