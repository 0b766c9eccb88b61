"""The whole pipeline is checked before any rank sends: a custom order that would hang is refused on every rank.

On 2 gloo ranks, in one process start: a crossed custom order is refused at construction
with the same error on both ranks, naming the ranks, microbatches and actions, and nothing
was sent (a schedule built after it runs exactly: no stray message is left on the
channels); a valid custom order runs exactly; ``format_schedule`` shows both ranks side by
side.
"""

from __future__ import annotations

from typing import Any, Dict

import torch

from dist_harness import run_on_ranks
from test_pp_support import loss_fn, make_batch, make_model, reference_grads, stage_module, stage_param_slice

CROSSED = {0: "0F0 0B0 0F1 0B1", 1: "1F0 1F1 1B0 1B1"}
CUSTOM = {0: "0F0 0F1 0B0 0B1", 1: "1F0 1B0 1F1 1B1"}


def checks_on_rank(rank: int, world: int) -> Dict[str, Any]:
    import swpipeline.pp as pp

    model = make_model()
    x, y = make_batch()
    out: Dict[str, Any] = {}

    def step(schedule: Any) -> None:
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)

    def stage() -> Any:
        return pp.PipelineStage(stage_module(model, rank, world), rank, world, torch.device("cpu"))

    try:
        pp.ScheduleFromActions([stage()], 2, CROSSED, loss_fn=loss_fn)
    except pp.ScheduleHangError as exc:
        out["refused"] = (str(exc), exc.ranks)
    for name, make in (("custom", lambda s: pp.ScheduleFromActions([s], 2, CUSTOM, loss_fn=loss_fn)),
                       ("gpipe", lambda s: pp.ScheduleGPipe(s, 2, loss_fn=loss_fn))):
        mine = stage()
        schedule = make(mine)
        step(schedule)
        want = reference_grads(model, x, y, 2)[0][stage_param_slice(model, rank, world)]
        out[name] = all(torch.equal(p.grad, g) for p, g in zip(mine.submod.parameters(), want))
    # a forward-only step: the last rank's output is the whole model's, bit for bit
    evaluated = pp.ScheduleGPipe(stage(), 4, loss_fn=loss_fn).eval(*((x,) if rank == 0 else ()))
    if rank == world - 1:
        with torch.no_grad():
            out["eval"] = torch.equal(evaluated, torch.cat([model(xm) for xm in torch.tensor_split(x, 4)]))
    out["table"] = pp.Schedule1F1B(stage(), 3, loss_fn=loss_fn).format_schedule()
    out["order"] = {r: [str(a) if a is not None else None for a in row]
                    for r, row in pp.Schedule1F1B(stage(), 3, loss_fn=loss_fn).pipeline_order.items()}
    return out


def test_checks_before_sending_on_two_ranks() -> None:
    results = run_on_ranks(checks_on_rank, 2, timeout=120)
    # refused on both ranks alike, naming ranks, microbatches and actions
    (text0, ranks0), (text1, ranks1) = results[0]["refused"], results[1]["refused"]
    assert text0 == text1 and ranks0 == ranks1 == [0, 1]
    assert "ranks 0, 1 wait on each other in a cycle (microbatches 0, 1)" in text0
    assert "1B0 on rank 1 waits for rank 1 1F1: it runs after it on rank 1's compute thread" in text0
    # nothing was sent by the refused schedule: the schedules built after it run exactly
    assert [r["custom"] for r in results] == [True, True]
    assert [r["gpipe"] for r in results] == [True, True]
    assert results[1]["eval"] is True
    # every rank knows every rank's schedule: the same table everywhere
    assert results[0]["table"] == results[1]["table"] == "\n".join([
        "Schedule1F1B: 2 ranks, 2 stages, 3 microbatches; 8 ticks, 25% idle (one tick per action)",
        "        rank 0  rank 1",
        "step 0: 0F0",
        "step 1: 0F1     1F0",
        "step 2:         1B0",
        "step 3: 0B0     1F1",
        "step 4: 0F2     1B1",
        "step 5: 0B1     1F2",
        "step 6:         1B2",
        "step 7: 0B2"])
    assert results[0]["order"][1] == [None, "1F0", "1B0", "1F1", "1B1", "1F2", "1B2"]
