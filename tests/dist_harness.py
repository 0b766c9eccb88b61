"""Run a function on N ranks of a real gloo process group (127.0.0.1, a free port), bounded in time.

``run_on_ranks(fn, world_size, timeout, **kwargs)`` spawns one process per rank;
each initializes gloo, runs ``fn(rank, world_size, **kwargs)`` and sends its
(picklable) result back. The parent returns the results in rank order, or raises
with every failing rank's traceback; a rank that does not finish in ``timeout``
seconds is killed and the call fails (it never hangs the test run). Every rank
destroys its process group on the way out.

``fn`` must be importable by name in a fresh interpreter (a module-level
function of a module on ``sys.path``, e.g. this module or a test module).
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from typing import Any, Callable, Dict, List


def descendants(pid: int) -> List[int]:
    """The live processes started, directly or not, by process ``pid`` (read from /proc; none elsewhere). torchrun's
    ranks run in sessions of their own, so they are found by parentage. A zombie (ended, its parent's wait missing)
    is not counted."""
    from pathlib import Path

    children: Dict[int, List[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def checkout_env(**extra: str) -> Dict[str, str]:
    """This process's environment with this checkout's ``src/`` first on ``PYTHONPATH`` (and ``extra`` set), for a
    subprocess that must import the package under test, not an installed copy."""
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, port: int, results: Any,
               kwargs: Dict[str, Any]) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
        try:
            buffer = io.BytesIO()  # tensors as bytes: the queue would share them through file descriptors
            torch.save(fn(rank, world_size, **kwargs), buffer)
            results.put((rank, "ok", buffer.getvalue()))
        finally:
            dist.destroy_process_group()
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def run_on_ranks(fn: Callable[..., Any], world_size: int = 2, timeout: float = 120.0, **kwargs: Any) -> List[Any]:
    """``[fn(0, world_size, **kwargs), fn(1, world_size, **kwargs), ...]``, each on its own gloo rank."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    # not daemons, so that a rank may start processes of its own (a DataLoader's workers); the end of this
    # function kills any rank still alive
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, port, results, kwargs), daemon=False)
             for r in range(world_size)]
    for p in procs:
        p.start()
    got: Dict[int, Any] = {}
    errors: List[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) + len(errors) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world_size)) - set(got))
                raise TimeoutError(f"ranks {missing} did not finish {fn.__name__} within {timeout:g} s "
                                   f"(a hang: killed); errors so far: {errors}")
            try:
                rank, status, payload = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs) and results.empty():
                    time.sleep(0.5)
                    if results.empty():
                        codes = [p.exitcode for p in procs]
                        raise RuntimeError(f"a rank died without reporting (exit codes {codes}); errors: {errors}")
                continue
            if status == "ok":
                import torch

                got[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            else:
                errors.append(f"rank {rank}:\n{payload}")
        if errors:
            raise AssertionError("\n".join(errors))
        return [got[r] for r in range(world_size)]
    finally:
        for p in procs:
            p.join(timeout=5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
