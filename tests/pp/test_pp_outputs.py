"""What a step takes and returns, as torch.distributed.pipelining users write it, against one process.

On 2 gloo ranks, in one start of the ranks:

* ``eval()`` on every schedule: the joined output equals the one-process model's forward;
* ``return_outputs=False``: the last rank gets None;
* a last stage that returns a dict: the step returns a dict, each value joined over the
  microbatches (before, a list of the microbatches' dicts), and ``loss_fn`` gets the dict;
* a non-tensor keyword argument, given to every stage;
* values between stages that receive no gradient: an int mask, and a float computed under
  ``no_grad`` (pytorch#152827 fails on this one): the gradients equal one process's;
* an intermediate stage that returns a dict: refused, naming it and saying what to return;
* chunk specs: the input split along dimension 1, a keyword mask along dimension 1 (given to
  both stages), a tuple output joined along dimensions 0 and 1.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
from torch import nn

from dist_harness import run_on_ranks
from swpipeline.pp.microbatch import TensorChunkSpec
from swpipeline.pp.orders import placement_of
from swpipeline.pp.placement import rank_of

W, N, ROWS = 8, 4, 8


class First(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer, self.kind = nn.Linear(W, W), kind

    def forward(self, x: torch.Tensor, scale: float = 1.0, mask: Any = None) -> Any:
        if self.kind == "specs":  # x is (features, rows), the mask too
            return self.layer(x.t()) * mask.t()
        h = self.layer(x) * scale
        if self.kind == "mask":
            return h, (x > 0).long()
        if self.kind == "no_grad":
            with torch.no_grad():
                total = h.sum(1, keepdim=True)
            return h, total
        if self.kind == "dict_between":
            return {"h": h}
        return h


class Last(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.layer, self.kind = nn.Linear(W, W), kind

    def forward(self, *values: Any, scale: float = 1.0, mask: Any = None) -> Any:
        if self.kind == "specs":
            out = self.layer(values[0]) * mask.t()
            return out, out.t()
        if self.kind == "mask":
            return self.layer(values[0]) * values[1].float()
        if self.kind == "no_grad":
            return self.layer(values[0]) + values[1]
        out = self.layer(values[0]) * scale
        if self.kind == "dict_out":
            return {"out": out, "rows": values[0].sum(1)}
        return out


def loss_of(kind: str) -> Any:
    if kind == "specs":
        return lambda o, t: ((o[0] - t) ** 2).mean()
    if kind == "dict_out":
        return lambda o, t: ((o["out"] - t) ** 2).mean()
    return lambda o, t: ((o - t) ** 2).mean()


def batch() -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return torch.randn(ROWS, W, generator=gen), torch.randn(ROWS, W, generator=gen)


def spec_mask() -> torch.Tensor:
    """A keyword mask of (features, rows), split along dimension 1."""
    return (batch()[0] > 0).float().t()


def one_process(kind: str, scale: float = 1.0) -> Dict[str, Any]:
    """The two modules in one process, microbatch after microbatch: joined outputs and scaled gradients."""
    first, last = First(kind), Last(kind)
    x, y = batch()
    outputs = []
    masks = torch.tensor_split(spec_mask(), N, dim=1)
    for m, (xm, ym) in enumerate(zip(torch.tensor_split(x, N), torch.tensor_split(y, N))):
        if kind == "specs":  # the input transposed, split along dimension 1: the same rows
            out = last(first(xm.t(), mask=masks[m]), mask=masks[m])
        else:
            h = first(xm, scale=scale)
            out = last(*(h if isinstance(h, tuple) else (h,)), scale=scale)
        loss_of(kind)(out, ym).backward()
        outputs.append(out)
    joined: Any = ({k: torch.cat([o[k].detach() for o in outputs]) for k in outputs[0]} if kind == "dict_out"
                   else (torch.cat([o[0].detach() for o in outputs]), torch.cat([o[1].detach() for o in outputs], 1))
                   if kind == "specs" else torch.cat([o.detach() for o in outputs]))
    grads = [p.grad / N for p in [*first.parameters(), *last.parameters()]]
    return {"output": joined, "grads": grads}


SCHEDULES = [("ScheduleGPipe", 1), ("Schedule1F1B", 1), ("ScheduleInterleaved1F1B", 2),
             ("ScheduleInterleavedZeroBubble", 2), ("ScheduleLoopedBFS", 2), ("ScheduleZBVZeroBubble", 2),
             ("ScheduleDualPipeV", 2)]


def whole_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(W, W) for _ in range(4)])


def outputs_on_rank(rank: int, world: int) -> Dict[str, Any]:
    import swpipeline.pp as pp
    from swpipeline.pp.orders import placement_of
    from swpipeline.pp.placement import stages_of

    got: Dict[str, Any] = {}
    x, y = batch()
    for name, local in SCHEDULES:  # eval(): a 4-layer model, one layer per stage
        mine = stages_of(rank, world, world * local, placement_of(name))
        per = 4 // (world * local)
        model = whole_model()
        stages = [pp.PipelineStage(nn.Sequential(*list(model)[s * per:(s + 1) * per]), s, world * local,
                                   torch.device("cpu")) for s in mine]
        schedule = getattr(pp, name)(stages[0] if local == 1 else stages, N, loss_fn=loss_of(""))
        last = world * local - 1 in mine
        got[f"eval {name}"] = schedule.eval(*((x,) if 0 in mine else ()))
        if last:
            got[f"eval {name}"] = got[f"eval {name}"].clone()
    for kind in ("plain", "dict_out", "mask", "no_grad", "kwargs", "no_return", "specs", "dict_between"):  # the
        # failing one last: after a failed step the group carries its failures (build the group again to go on)
        module = First(kind) if rank == 0 else Last(kind)
        stage = pp.PipelineStage(module, rank, world, torch.device("cpu"))
        specs = {}
        if kind == "specs":
            specs = dict(args_chunk_spec=TensorChunkSpec.from_tuple((1,)),
                         kwargs_chunk_spec={"mask": TensorChunkSpec(1)},
                         output_merge_spec=(TensorChunkSpec(0), TensorChunkSpec(1)))
        schedule = pp.Schedule1F1B(stage, N, loss_fn=loss_of(kind), **specs)
        extra: Dict[str, Any] = {"scale": 2.0} if kind == "kwargs" else {}
        if kind == "specs":
            extra["mask"] = spec_mask()
        if rank == 1:
            extra.update(target=y, return_outputs=kind != "no_return")
        try:
            output = schedule.step(*(((x.t() if kind == "specs" else x),) if rank == 0 else ()), **extra)
        except Exception as exc:
            got[kind] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        got[kind] = {"output": output, "grads": [p.grad.clone() for p in module.parameters()]}
    return got


def test_outputs_inputs_and_eval_as_torch_s_users_write_them() -> None:
    ranks = run_on_ranks(outputs_on_rank, 2, 180)
    x = batch()[0]
    want_eval = whole_model()(x).detach()
    for name, local in SCHEDULES:  # the rank of the last stage returns the output (rank 0 in a V)
        holder = rank_of(2 * local - 1, 2, placement_of(name))
        assert torch.equal(ranks[holder][f"eval {name}"], want_eval), name
        assert ranks[1 - holder][f"eval {name}"] is None
    for kind in ("plain", "dict_out", "mask", "no_grad", "kwargs", "no_return", "specs"):
        want = one_process(kind, scale=2.0 if kind == "kwargs" else 1.0)
        grads = ranks[0][kind]["grads"] + ranks[1][kind]["grads"]
        assert len(grads) == len(want["grads"]) and all(torch.equal(g, w) for g, w in zip(grads, want["grads"])), kind
        output = ranks[1][kind]["output"]
        if kind == "no_return":
            assert output is None
        elif kind == "specs":
            assert isinstance(output, tuple) and [o.shape for o in output] == [(ROWS, W), (W, ROWS)]
            assert all(torch.equal(o, w) for o, w in zip(output, want["output"]))
        elif kind == "dict_out":
            assert isinstance(output, dict) and list(output) == ["out", "rows"]
            assert all(torch.equal(output[k], want["output"][k]) for k in output)
        else:
            assert torch.equal(output, want["output"]), kind
    refused: List[str] = [ranks[0]["dict_between"]["error"], ranks[1]["dict_between"]["error"]]
    said = ("cannot send a dict with keys ['h'] between stages: a stage's output goes to the next stage as a tensor "
            "or a tuple of tensors (only the last stage's may be anything); return its tensors as a tuple")
    assert refused[0].startswith(f"TypeError: {said}") and said in refused[1], refused
