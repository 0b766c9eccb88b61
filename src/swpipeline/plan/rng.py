"""Random numbers that do not depend on the schedule: a generator of a task's own for each iteration.

Every task that draws from torch's default generator shares one stream of numbers with
every other such task, on every thread: which numbers a task gets depends on which task
drew before it, and a pipelined run orders tasks of different thread groups differently
from the serial loop (the checks report such pairs). ``task_generator`` gives a task a
generator nobody else draws from, seeded from ``(seed, name, ctx.iter_idx)`` alone, so
the task draws the same numbers in ``run_serial``, in ``run`` on either engine, on any
thread group and at any depth.

The seed is a stable hash (BLAKE2b of the three values), never Python's ``hash``, which
changes from one process to the next.
"""

from __future__ import annotations

import hashlib
from typing import Any, List, Optional

import torch

from .context import IterContext

__all__: List[str] = []

_SEED_BITS = 63  # torch.Generator.manual_seed takes any 64-bit value; stay clear of the sign bit


def stable_seed(seed: int, name: str, iteration: int) -> int:
    """A seed that depends on ``(seed, name, iteration)`` only, the same in every process."""
    digest = hashlib.blake2b(f"{seed}\x1f{name}\x1f{iteration}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << _SEED_BITS) - 1)


def task_generator(ctx: IterContext, name: str, seed: int = 0, device: Optional[Any] = None) -> torch.Generator:
    """A random generator of one task's own for one iteration, seeded from ``(seed, name, ctx.iter_idx)``.

    Draw everything the task draws from it (``torch.randint(..., generator=g)``,
    ``t.bernoulli_(p, generator=g)``) and the numbers no longer depend on the order in which
    tasks run: ``run_serial`` and ``run`` on either engine draw the same ones. Each call
    returns a fresh generator in the same state, so call it once per task call and keep it
    for all the task's draws (two calls with the same arguments give the same numbers).

    Operators without a ``generator`` argument (``torch.nn.Dropout``, ``F.dropout``,
    attention dropout) draw from the default generator. Leave that one to a single task,
    on one thread group, and give every other task that draws a generator of its own: the
    single task then draws in the order of its own iterations, as in the serial loop. The
    checks (``analyze``, ``infer_deps``, ``check_races=True``) report two tasks that share a
    generator without a dependency that orders them.

    Args:
        ctx: the task's IterContext (its ``iter_idx`` picks the iteration's numbers).
        name: what the numbers are for, usually the task's name; tasks with different names
            draw different numbers.
        seed: the run's seed; change it for other numbers in every task and iteration.
        device: the device of the generator (the device the task draws on); by default
            torch's default device, ``torch.get_default_device()``.

    Returns:
        A new ``torch.Generator`` on ``device``, seeded with a stable hash of
        ``(seed, name, ctx.iter_idx)``.

    Raises:
        TypeError: ``ctx`` is not an IterContext, ``name`` is not a string, or ``seed`` is
            not an int.
        ValueError: ``device`` is not a device torch knows, or one this machine cannot make a
            generator on (``'cuda'`` without CUDA).
    """
    if not isinstance(ctx, IterContext):
        raise TypeError(f"task_generator: ctx must be the task's IterContext, got {type(ctx).__name__}")
    if not isinstance(name, str):
        raise TypeError(f"task_generator: name must be a string (the task's name), got {type(name).__name__} "
                        f"{name!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"task_generator: seed must be an int, got {type(seed).__name__} {seed!r}")
    try:
        where = torch.get_default_device() if device is None else torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"task_generator: device {device!r} is not a torch device; pass the device the task draws "
                         f"on, e.g. 'cpu' or 'cuda'") from None
    try:
        generator = torch.Generator(device=where)
    except RuntimeError as error:  # torch's text for it talks of its libraries and linker flags
        raise ValueError(f"task_generator: no random generator on device {str(where)!r}: {_why_none(where, error)}; "
                         f"pass the device the task draws on, one this machine has (e.g. 'cpu')") from None
    generator.manual_seed(stable_seed(seed, name, ctx.iter_idx))
    return generator


def _why_none(where: torch.device, error: RuntimeError) -> str:
    """Why torch made no generator on ``where``, in a user's words where we know them, else torch's first sentence."""
    if where.type == "cuda" and not torch.cuda.is_available():
        return "this machine has no CUDA device (torch.cuda.is_available() is False)"
    first = str(error).strip().split(". ")[0].rstrip(".")
    return f"torch says {first!r}"
