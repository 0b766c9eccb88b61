"""Ctrl-C under torchrun stops every rank, each inside its step, and leaves no process behind.

In a terminal, Ctrl-C reaches torchrun (its ranks run in sessions of their own); torchrun
passes the interrupt on to every rank. Each rank of ``torchrun_interrupted.py`` is stepping
when it comes, so it lands inside ``step()``: every rank must stop with KeyboardInterrupt
(or with the PipelineRankError of its peer's interrupt, when that reaches it first),
its pipeline threads joined (each says so: a rank that torchrun had to kill, 30 s after the
interrupt, would say nothing), and every process must be gone.

Bug story: with both ranks interrupted at once, now and then (1 run of 8 on a quiet 2-core
machine, 5 of 30 with two busy processes beside it) one rank's receive of its peer's end of
step stayed open 5 s: it had the header of the peer's failure and waited for its text, sent
as a second message by a peer that had exited meanwhile. A failure is now one message (its
text in the header): 0 of 40 with the two busy processes (and see
``test_pp_transport.py::test_a_failure_arrives_whole_though_its_sender_stops_at_once``).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import List

from dist_harness import checkout_env, descendants, free_port

HERE = Path(__file__).resolve().parent


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_ctrl_c_under_torchrun_stops_every_rank_and_leaves_nothing() -> None:
    env = checkout_env(OMP_NUM_THREADS="1")
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), str(HERE / "torchrun_interrupted.py")]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: "queue.Queue[str]" = queue.Queue()
    seen: List[str] = []
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)
    reader.start()
    ranks: List[int] = []
    try:
        while "".join(seen).count(" stepping") < 2:  # both ranks in their loop (two ranks' lines may share one)
            try:
                seen.append(lines.get(timeout=120))
            except queue.Empty:
                raise AssertionError("the ranks did not start stepping in 120 s:\n" + "".join(seen)) from None
        ranks = descendants(proc.pid)
        assert ranks, "torchrun started no process"
        proc.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal does: torchrun gets it
        proc.wait(timeout=60)
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            for pid in [proc.pid, *descendants(proc.pid)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=30)
    while not lines.empty():
        seen.append(lines.get())
    out = "".join(seen)
    stopped = sorted(re.findall(r"rank (\d) stopped: (KeyboardInterrupt|PipelineRankError from rank (\d)'s "
                                r"KeyboardInterrupt); pipeline threads left: \[\]", out))
    assert [rank for rank, _, _ in stopped] == ["0", "1"], out  # each rank once, inside its step, threads joined
    assert all(peer in ("", str(1 - int(rank))) for rank, _, peer in stopped), out
    assert any(how == "KeyboardInterrupt" for _, how, _ in stopped), out
    assert proc.returncode != 0, out
    assert [pid for pid in ranks if _alive(pid)] == [], out
