"""A small GPT trained with pipeline parallelism on 2 ranks, checked bit for bit against one process (CPU, gloo).

    torchrun --nproc_per_node 2 examples/pp_gpt.py

The model: token and position embeddings, 4 transformer blocks (causal self-attention and
an MLP), a final LayerNorm, and an output head whose weight *is* the token embedding's (tied,
as GPT-2's). Rank 0 holds the embeddings and the first two blocks, rank 1 the last two, the
LayerNorm and the head, each with its own copy of the tied weight, declared to the schedule
with ``TiedWeight``. Each step: Schedule1F1B over 4 microbatches, ``swpipeline.pp``'s
``clip_grad_norm_`` across both stages, then AdamW. Rank 1 prints the loss and the gradient
norm per step; each rank then checks its weights against the same model trained in one
process (the whole batch as the same 4 microbatches, ``torch.nn.utils.clip_grad_norm_``),
bit for bit.
"""

import copy
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

import swpipeline.pp as pp

VOCAB, WIDTH, HEADS, BLOCKS, CONTEXT = 96, 32, 4, 4, 16
BATCH, MICROBATCHES, STEPS, MAX_NORM = 16, 4, 30, 0.25


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then an MLP, each added to its input."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, h):
        b, t, _ = h.shape
        q, k, v = self.qkv(self.ln1(h)).view(b, t, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(attended.transpose(1, 2).reshape(b, t, WIDTH))
        return h + self.mlp(self.ln2(h))


class Front(nn.Module):
    """Stage 0: the embeddings and the first blocks."""

    def __init__(self, blocks):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.Sequential(*blocks)

    def forward(self, ids):
        return self.blocks(self.tok(ids) + self.pos(torch.arange(ids.shape[1])))


class Back(nn.Module):
    """Stage 1: the last blocks, the final LayerNorm and the head (its weight tied to the token embedding)."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, h):
        return self.head(self.ln(self.blocks(h)))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        blocks = [Block() for _ in range(BLOCKS)]
        self.front, self.back = Front(blocks[:BLOCKS // 2]), Back(blocks[BLOCKS // 2:])
        self.back.head.weight = self.front.tok.weight  # tied
        for table in (self.front.tok, self.front.pos):  # as GPT-2: the first loss is about ln(VOCAB)
            nn.init.normal_(table.weight, std=0.02)

    def forward(self, ids):
        return self.back(self.front(ids))


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def batches():
    """The same token batches on every rank: (input, next tokens). Each sequence counts up from a random start
    (mod VOCAB), so the loss falls well below ln(VOCAB) as the model learns to count."""
    data = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        start = torch.randint(0, VOCAB, (BATCH, 1), generator=data)
        tokens = (start + torch.arange(CONTEXT + 1)) % VOCAB
        yield tokens[:, :-1], tokens[:, 1:]


def one_process(model):
    """The same training in one process: the batch as the same microbatches, the whole model's clipping, AdamW."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for ids, target in batches():
        for ids_mb, target_mb in zip(ids.tensor_split(MICROBATCHES), target.tensor_split(MICROBATCHES)):
            loss_fn(model(ids_mb), target_mb).backward()
        for p in model.parameters():
            p.grad /= MICROBATCHES
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
    return model


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, "run with torchrun --nproc_per_node 2"
    torch.manual_seed(0)  # the same model on every rank; each keeps its stage (its own copy of the tied weight)
    model = GPT()
    part = copy.deepcopy(model.front if rank == 0 else model.back)
    stage = pp.PipelineStage(part, rank, world, torch.device("cpu"))
    tied = pp.TiedWeight("token embedding", {0: "tok.weight", 1: "head.weight"})
    schedule = pp.Schedule1F1B(stage, MICROBATCHES, loss_fn=loss_fn, tied_weights=[tied])
    optimizer = torch.optim.AdamW(part.parameters(), lr=1e-2)
    for step, (ids, target) in enumerate(batches()):
        losses = []
        if rank == 0:
            schedule.step(ids)
        else:
            schedule.step(target=target, losses=losses)
        norm = pp.clip_grad_norm_(schedule, MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
        if rank == 1:
            loss = sum(float(x.detach()) for x in losses) / len(losses)
            print(f"step {step}: loss {loss:.4f} (ln {VOCAB} = {math.log(VOCAB):.4f}), gradient norm {float(norm):.4f}",
                  flush=True)
    alone = one_process(model)
    want = alone.front if rank == 0 else alone.back
    same = all(torch.equal(a, b) for a, b in zip(part.parameters(), want.parameters()))
    same = same and (rank == 0 or torch.equal(part.head.weight, alone.front.tok.weight))
    dist.barrier()
    print(f"rank {rank}: weights after {STEPS} steps (tied copy included) bitwise equal to one process: "
          f"{'yes' if same else 'NO'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
