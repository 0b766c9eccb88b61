"""Weights tied across pipeline stages: what exactness costs, on 2 gloo ranks.

A small language model (token embedding, 4 residual blocks, output head) is cut in two stages,
the head's weight tied to the embedding as in GPT-2. Three ways to train it with Schedule1F1B
(8 microbatches): the tie left undeclared (each copy gets only its own stage's share: wrong,
the copies drift apart), declared with ``exact=False`` (one exchange of each rank's sum per step),
and declared exact (each use's share per microbatch exchanged, summed in one process's order).
For each vocabulary size: the median ms per step of the slower rank (the three ways in turn,
``STEPS`` steps each per round, the first round a warm-up), whether
the tied weight's gradient after the first step equals one process's bit for bit, whether the
two copies are equal after the steps (AdamW), and what the tie's exchange sends per step from
each rank (counted on ``dist.isend``). Run:

    python benchmarks/pp_tied.py [--vocab 1024 8192]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: one intra-op thread per rank

import argparse  # noqa: E402
import copy  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any, Dict, List, Optional, Tuple  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from _common import format_table, machine_line, on_two_ranks, yes_no  # noqa: E402

WIDTH, N, BATCH, TOKENS, STEPS, ROUNDS = 64, 8, 32, 16, 5, 7
WAYS = {"undeclared (wrong)": None, "exact=False": False, "exact (default)": True}


def make(vocab: int) -> nn.ModuleList:
    """[stage 0, stage 1] of the tied model, each its own module (the head's weight a copy of the embedding's)."""
    torch.manual_seed(0)
    front = nn.Sequential(nn.Embedding(vocab, WIDTH), *[Residual() for _ in range(2)])
    back = nn.Sequential(*[Residual() for _ in range(2)], nn.Linear(WIDTH, vocab, bias=False))
    back[-1].weight = front[0].weight
    return nn.ModuleList([front, back])


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.lin(h))


def batch(vocab: int, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return (torch.randint(0, vocab, (BATCH, TOKENS), generator=gen),
            torch.randint(0, vocab, (BATCH, TOKENS), generator=gen))


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def rank_main(rank: int, world: int, port: int, vocabs: List[int], out: Any) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    import swpipeline.pp as pp
    from swpipeline.pp.ties import TAG_BASE

    sent = [0]
    isend = dist.isend

    def counted(tensor: torch.Tensor, *args: Any, tag: int = 0, **kwargs: Any) -> Any:
        """dist.isend, counting the bytes of the ties' messages."""
        if TAG_BASE <= tag < 2 * TAG_BASE:
            sent[0] += tensor.numel() * tensor.element_size()
        return isend(tensor, *args, tag=tag, **kwargs)

    dist.isend = counted  # type: ignore[assignment]

    got: Dict[Any, Any] = {}
    for vocab in vocabs:
        built = {}
        for way, exact in WAYS.items():
            module = copy.deepcopy(make(vocab)[rank])
            stage = pp.PipelineStage(module, rank, world, torch.device("cpu"))
            ties = [] if exact is None else [pp.TiedWeight("embedding", {0: "0.weight", 1: "2.weight"}, exact=exact)]
            schedule = pp.Schedule1F1B(stage, N, loss_fn=loss_fn, tied_weights=ties)
            built[way] = (module, module[0].weight if rank == 0 else module[-1].weight, schedule,
                          torch.optim.AdamW(module.parameters(), lr=1e-3))
        times: Dict[str, List[float]] = {way: [] for way in WAYS}
        step = {way: 0 for way in WAYS}
        for round_ in range(ROUNDS):  # the ways in turn, so that they share the machine's load
            for way in WAYS:
                module, tied, schedule, opt = built[way]
                sent[0] = 0
                for _ in range(STEPS):
                    x, y = batch(vocab, step[way])
                    dist.barrier()
                    start = time.perf_counter()
                    schedule.step(*([x] if rank == 0 else []), **(dict(target=y) if rank == 1 else {}))
                    if round_:  # the first round warms up
                        times[way].append((time.perf_counter() - start) * 1e3)
                    if step[way] == 0:
                        got[(vocab, way, "grad")] = tied.grad.numpy().copy()  # by value: a tensor would pass as a file
                    step[way] += 1
                    opt.step()
                    opt.zero_grad()
                got[(vocab, way, "sent")] = sent[0] / STEPS / 2 ** 20
        for way in WAYS:
            got[(vocab, way, "ms")] = statistics.median(times[way])
            got[(vocab, way, "weight")] = built[way][1].detach().numpy().copy()
    out.put((rank, got))
    dist.barrier()
    dist.destroy_process_group()


def one_process_grad(vocab: int) -> torch.Tensor:
    model = make(vocab)
    x, y = batch(vocab, 0)
    for xm, ym in zip(x.tensor_split(N), y.tensor_split(N)):
        loss_fn(model[1](model[0](xm)), ym).backward()
    grad: Optional[torch.Tensor] = model[0][0].weight.grad
    assert grad is not None
    return grad / N


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[1024, 8192])
    args = parser.parse_args()
    results = on_two_ranks(rank_main, args.vocab, timeout=900)
    rows = []
    for vocab in args.vocab:
        want = one_process_grad(vocab)
        for way, exact in WAYS.items():
            grads = [torch.from_numpy(results[r][(vocab, way, "grad")]) for r in (0, 1)]
            rows.append([f"{vocab} x {WIDTH}", way, f"{max(results[r][(vocab, way, 'ms')] for r in (0, 1)):.1f}",
                         yes_no(all(torch.equal(g, want) for g in grads)),
                         yes_no(bool((results[0][(vocab, way, "weight")] == results[1][(vocab, way, "weight")]).all())),
                         " / ".join(f"{results[r][(vocab, way, 'sent')]:.3f}" for r in (0, 1))])
    print(machine_line())
    print(format_table(["tied weight", "declared", "ms/step", "gradient = one process",
                        f"copies equal after {STEPS * ROUNDS} steps", "MB sent per step, rank 0 / 1"], rows, left=2))


if __name__ == "__main__":
    main()
