"""GPipe and the embedding cache on a GPU, each checked against its reference, with their step times.

    python benchmarks/gpu_apps.py [--device cuda]

GPipe: 4 blocks (Linear + ReLU + LayerNorm, width 1024) in 2 partitions on one GPU
(a stream each), batch 1024 in 4 micro-batches, for each checkpoint mode: the output
and every gradient against torchgpipe 0.0.7's when it is installed (bitwise), else
against the plain module (to 1e-5 relative: micro-batching changes the order of the
batch-norm-free reductions only in the gradient sums), and ms per training step.

Embedding cache: a click model whose 200,000-row ``HostEmbeddingBag`` (Adagrad) sits
behind a 20,000-row device cache, 60 batches of 512 bags; pipelined training
(``EmbCacheTrainPipeline.progress``) against the same model trained with an
ordinary ``nn.EmbeddingBag`` holding the whole table on the device (bitwise: every
output and the final table), and steps per second of both.

Each result is one line starting with ``GPipe`` or ``embcache`` (``gpu_check.py``
collects them). Runs on the CPU too (``--device cpu``), as the test suite does.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F

from _common import machine_line, yes_no

Batch = Dict[str, torch.Tensor]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs, the device synchronized around each."""
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


# -- GPipe ---------------------------------------------------------------------------------------------


def gpipe_model(width: int, blocks: int) -> torch.nn.Sequential:
    torch.manual_seed(0)
    layers: List[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.LayerNorm(width)]
    return torch.nn.Sequential(*layers)


def train_step(model: torch.nn.Module, x: torch.Tensor) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(x)
    out.square().mean().backward()
    return out.detach(), [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def check_gpipe(device: torch.device, width: int = 1024, blocks: int = 4, batch: int = 1024, chunks: int = 4,
                repeats: int = 5) -> List[str]:
    from swpipeline.gpipe import GPipe

    try:
        import torchgpipe
    except ImportError:
        torchgpipe = None
    x = torch.randn(batch, width, device=device, generator=torch.Generator(device=device).manual_seed(1))
    per_partition = len(gpipe_model(width, blocks)) // 2
    lines = []
    for mode in ("never", "except_last", "always"):
        plain = gpipe_model(width, blocks).to(device)
        ours = GPipe(copy.deepcopy(plain), balance=[per_partition, per_partition], devices=[device, device],
                     chunks=chunks, checkpoint=mode)
        out, grads = train_step(ours, x)
        if torchgpipe is not None:
            theirs = torchgpipe.GPipe(copy.deepcopy(plain), balance=[per_partition, per_partition],
                                      devices=[device, device], chunks=chunks, checkpoint=mode)
            ref_out, ref_grads = train_step(theirs, x)
            same = torch.equal(out, ref_out) and all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
            against = "torchgpipe 0.0.7, bitwise"
            ref_ms = timed(device, lambda: train_step(theirs, x), repeats) * 1e3
            ref_text = f", torchgpipe {ref_ms:.2f} ms/step"
        else:
            ref_out, ref_grads = train_step(plain, x)
            same = torch.allclose(out, ref_out, rtol=1e-5, atol=1e-6) and all(
                torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(grads, ref_grads))
            against, ref_text = "the plain module, to 1e-5 (torchgpipe not installed)", ""
        ms = timed(device, lambda: train_step(ours, x), repeats) * 1e3
        lines.append(f"GPipe checkpoint={mode}: equal to {against}: {yes_no(same)}; {ms:.2f} ms/step{ref_text}")
    return lines


# -- the embedding cache -------------------------------------------------------------------------------

DENSE = 8


class ClickModel(torch.nn.Module):
    def __init__(self, emb: torch.nn.Module, dim: int) -> None:
        super().__init__()
        self.emb = emb
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim + DENSE, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))

    def forward(self, batch: Batch) -> Tuple[torch.Tensor, torch.Tensor]:
        pooled = self.emb(batch["ids"], batch["offsets"])
        logits = self.mlp(torch.cat([pooled, batch["dense"]], dim=1)).squeeze(1)
        return F.binary_cross_entropy_with_logits(logits, batch["label"]), logits.detach()


def click_batches(rows: int, bags: int, count: int) -> List[Batch]:
    gen = torch.Generator().manual_seed(2)
    batches = []
    for _ in range(count):
        lengths = torch.randint(1, 17, (bags,), generator=gen)
        ids = (torch.rand(int(lengths.sum()), generator=gen) ** 3 * rows).long()
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
        batches.append({"ids": ids, "offsets": offsets, "dense": torch.randn(bags, DENSE, generator=gen),
                        "label": torch.randint(0, 2, (bags,), generator=gen).float()})
    return batches


def reference_train(model: ClickModel, batches: List[Batch], device: torch.device, lr: float) -> List[torch.Tensor]:
    """The whole table as an ordinary EmbeddingBag on the device, trained with the same optimizers, batch by batch."""
    sparse = torch.optim.Adagrad(model.emb.parameters(), lr=lr)
    dense = torch.optim.SGD(model.mlp.parameters(), lr=0.05)
    outputs = []
    for batch in batches:
        on_device = {k: v.to(device) for k, v in batch.items()}
        loss, logits = model(on_device)
        sparse.zero_grad()
        dense.zero_grad()
        loss.backward()
        dense.step()
        sparse.step()
        outputs.append(logits)
    return outputs


def check_embcache(device: torch.device, rows: int = 200_000, cache_rows: int = 20_000, dim: int = 32,
                   bags: int = 512, steps: int = 60) -> List[str]:
    from swpipeline.embcache import EmbCacheTrainPipeline, HostEmbeddingBag

    lr = 0.01
    batches = click_batches(rows, bags, steps)
    torch.manual_seed(3)  # the same seed: the same initial rows and dense weights in both models
    host = HostEmbeddingBag(rows, dim, cache_rows=cache_rows, mode="sum", optimizer="adagrad", lr=lr)
    model = ClickModel(host, dim).to(device)
    torch.manual_seed(3)
    reference = ClickModel(torch.nn.EmbeddingBag(rows, dim, mode="sum"), dim).to(device)

    pipeline = EmbCacheTrainPipeline(model, torch.optim.SGD(model.mlp.parameters(), lr=0.05), device,
                                     ids_of=lambda batch: {"emb": (batch["ids"], batch["offsets"])})
    outputs: List[torch.Tensor] = []
    synchronize(device)
    start = time.perf_counter()
    it = iter(batches)
    while True:
        try:
            outputs.append(pipeline.progress(it))
        except StopIteration:
            break
    synchronize(device)
    pipelined_s = time.perf_counter() - start
    start = time.perf_counter()
    ref_outputs = reference_train(reference, batches, device, lr)
    synchronize(device)
    reference_s = time.perf_counter() - start
    same_outputs = len(outputs) == len(ref_outputs) and all(torch.equal(a, b) for a, b in zip(outputs, ref_outputs))
    same_table = torch.equal(host.full_weight().to(device), reference.emb.weight.detach())
    return [f"embcache: {steps} steps, outputs equal to whole-table training: {yes_no(same_outputs)}, final table "
            f"equal: {yes_no(same_table)}; pipelined {steps / pipelined_s:.1f} steps/s, whole table on the device "
            f"{steps / reference_s:.1f} steps/s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny sizes (a quick CPU check)")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(machine_line())
    if device.type == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(device)}")
    gpipe_args: Dict[str, int] = {"width": 64, "batch": 32, "repeats": 1} if args.small else {}
    cache_args: Dict[str, int] = {"rows": 2_000, "cache_rows": 600, "bags": 32, "steps": 12} if args.small else {}
    lines = check_gpipe(device, **gpipe_args) + check_embcache(device, **cache_args)
    print("\n".join(lines))
    return 1 if any("NO" in line for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
