"""Where one rank's step of swpipeline.pp goes: its units by kind, and what lies between them.

What is measured
    2 gloo ranks on this machine (127.0.0.1), one intra-op thread each, ``--schedule`` (default
    Schedule1F1B) over ``--microbatches`` microbatches of the issue's tiny model: 8 blocks of
    Linear(64) + ReLU, a batch of 32, split in two stages. After 20 warm-up steps, ``--steps``
    steps back to back (no barrier between them); each rank adds up, per step:

    ``step() in all``      the time of ``schedule.step`` (``zero_grad`` is outside it);
    ``outside the run``    ``step()`` less the rank's run: splitting the batch, setting gradients aside
                           and scaling them, joining the outputs;
    ``posting receives``   ``Transport.start_step``: every receive of the step posted (gloo's
                           ``irecv``, one per message);
    ``engine``             the engine's run less its units: assembling the run, handing out, ending it;
    ``end of step``        waiting for the step's sends (``Transport.finish_step``);
    ``compute``            the F, B, I and W units (the model's own work and autograd);
    ``sends``              packing each message and posting it (``isend``);
    ``receives``           taking each message: mostly waiting for it to come;
    ``HELLO`` / ``DONE``   the markers at the step's start and end, sent and taken (waiting included).

    The units are timed by wrapping each task the rank's plan runs, the rest by wrapping the
    methods named; the wrappers' own time (about 1 µs a unit) counts as the engine's. Rank 0
    is the first stage: what it does before its first send and after its last receive is on
    every rank's critical path.

Run: ``python benchmarks/pp_step_breakdown.py`` (about 20 s).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: one intra-op thread per rank

import argparse  # noqa: E402
import copy  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from typing import Any, Callable, Dict  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from _common import format_table, machine_line, on_two_ranks  # noqa: E402

ROWS = ("step() in all", "outside the run", "posting receives", "engine", "end of step", "compute", "sends",
        "receives", "HELLO", "DONE")


def _adding_time(fn: Callable[..., Any], totals: Dict[str, float], key: str) -> Callable[..., Any]:
    """``fn``, its time added up into ``totals[key]`` at every call."""
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - start

    return timed


def _timed(owner: Any, name: str, totals: Dict[str, float], key: str) -> None:
    """Wrap ``owner.name`` so that its time adds up into ``totals[key]``."""
    setattr(owner, name, _adding_time(getattr(owner, name), totals, key))


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        out.put((rank, measure(rank, args)))
    finally:
        dist.destroy_process_group()


def measure(rank: int, args: argparse.Namespace) -> Dict[str, float]:
    import swpipeline.pp as pp
    from swpipeline.engine.clocked import SWPipeline
    from swpipeline.pp import runner, transport

    totals: Dict[str, float] = defaultdict(float)
    real_task = runner.RankRunner._task

    def task(self: Any, unit: Any) -> Callable[[Any], None]:
        key = ("compute" if unit.action is not None else {"hello": "HELLO", "done": "DONE"}.get(unit.marker)
               or {"send": "sends", "recv": "receives"}[unit.role])
        return _adding_time(real_task(self, unit), totals, key)

    runner.RankRunner._task = task  # type: ignore[method-assign]
    _timed(transport.Transport, "start_step", totals, "posting receives")
    _timed(transport.Transport, "finish_step", totals, "end of step")
    _timed(runner.RankRunner, "run", totals, "run")
    _timed(SWPipeline, "run", totals, "engine run")
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(8)]
    module = copy.deepcopy(nn.Sequential(*blocks[rank * 4:(rank + 1) * 4]))
    stage = pp.PipelineStage(module, rank, 2, torch.device("cpu"))
    schedule = getattr(pp, args.schedule)(stage, args.microbatches, loss_fn=nn.functional.mse_loss)
    _timed(type(schedule), "step", totals, "step() in all")
    x, y = torch.randn(32, 64), torch.randn(32, 64)

    def step() -> None:
        module.zero_grad(set_to_none=True)
        schedule.step(*([x] if rank == 0 else []), **({"target": y} if rank == 1 else {}))

    for _ in range(20):
        step()
    dist.barrier()
    totals.clear()
    for _ in range(args.steps):
        step()
    dist.barrier()
    per_step = {key: value / args.steps * 1e3 for key, value in totals.items()}
    units = sum(per_step.get(k, 0.0) for k in ("compute", "sends", "receives", "HELLO", "DONE"))
    per_step["outside the run"] = per_step["step() in all"] - per_step.pop("run")
    per_step["engine"] = per_step.pop("engine run") - units
    return per_step


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--schedule", default="Schedule1F1B", choices=["ScheduleGPipe", "Schedule1F1B"])
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    print(machine_line())
    ranks = on_two_ranks(rank_main, args, timeout=300)
    rows = [[row] + [f"{ranks[r][row]:.3f}" for r in (0, 1)] for row in ROWS]
    print(f"{args.schedule}, 2 gloo ranks, {args.microbatches} microbatches of the tiny model, {args.steps} steps: "
          f"ms per step")
    print(format_table(["", "rank 0", "rank 1"], rows, left=1))
    print(machine_line().splitlines()[0].replace("python", "after: python", 1))


if __name__ == "__main__":
    main()
