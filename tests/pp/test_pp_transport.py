"""swpipeline.pp's messages: the wire format, and steps back to back whose shapes change.

Bug stories kept here:

* A step's HELLO and DONE sends were posted and their handles dropped at the next step's
  start; dropping a pending gloo send cancels it, so now and then (about one run in three
  of 90 steps) a peer never got the DONE of the step before and both ranks waited forever.
  Every handle is now kept until its send completes: ``test_many_steps_back_to_back...``.
* A failure went as a header, then its text as a second message. When both ranks were
  interrupted at once (Ctrl-C under torchrun), now and then one had the other's header and
  waited for a text that never came, its sender gone: its step raised only after 5 s, a
  thread left. A failure is now one message, its text in the header, landing in the receive
  already posted: ``test_a_failure_arrives_whole_though_its_sender_stops_at_once``.
* Each message went as a header, then its tensors, whose receive was posted only once the
  header had arrived; the tensors, already there, waited for the receiving connection's own
  thread to be scheduled again, milliseconds on a busy machine. A message now goes once,
  into a buffer the receiver posted at the start of the step in the layout of the step
  before; a change of shape is announced (``CHANGED``) and costs a second round trip, which
  ``test_many_steps...`` exercises with batches of three sizes.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

import pytest
import torch

from dist_harness import run_on_ranks
from swpipeline.pp import wire
from test_pp_support import loss_fn, make_batch, make_model, reference_grads, stage_module, stage_param_slice


def test_what_arrives_in_host_memory_reaches_the_stage_on_its_device_in_the_unit_that_uses_it() -> None:
    # over gloo a message lands in host memory; a stage on a GPU must get it on the GPU. The gradients were once
    # left where they landed, and every schedule across ranks on a GPU failed at its first backward ("expected
    # device cuda:0 but got cpu"). They are moved by the forward or backward that takes them, on its own stream,
    # not by the receive: memory that the receive's stream allocates and the compute stream reads would go back to
    # the receive's stream when freed, for its next message, while the compute could still read it. The meta
    # device stands for a GPU here.
    from types import SimpleNamespace

    from swpipeline.pp.compute import StageOps, StepState

    seen: List[torch.Tensor] = []
    module = torch.nn.Linear(3, 3, device="meta")
    module.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    stage = SimpleNamespace(stage_index=1, device=torch.device("meta"), expected_inputs=None, submod=module,
                            is_first=False, is_last=False, wired=None)
    ops = StageOps([stage], None, sources={1: [0]}, consumers={1: [2]}, backward=True)  # type: ignore[list-item]
    state = StepState(args=[()], kwargs=[{}], targets=None)  # one microbatch
    sent = (torch.randn(2, 3),)
    layout = wire.layout_of(sent)
    landed = wire.unpack(wire.pack(sent, layout, torch.device("cpu")), layout)
    ops.arrived((1, 0, 0), landed, state)
    assert state.acts[(1, 0, 0)][0].device.type == "cpu"  # kept as it came until the forward takes it
    ops.forward(1, 0, state)
    assert [(t.device.type, t.requires_grad, t.shape) for t in seen] == [("meta", True, (2, 3))]
    ops.grads_arrived((1, 0, 2), landed, state)
    assert state.grads[(1, 0, 2)][0].device.type == "cpu"
    roots, grads = ops._roots(1, 0, state.saved[(1, 0)].outputs, state)
    assert [(g.device.type, g.shape) for g in grads if g is not None] == [("meta", (2, 3))]
    assert [r.device.type for r in roots] == ["meta"]


def test_pack_and_unpack_round_trip() -> None:
    tensors = (torch.randn(3, 5), None, torch.arange(7, dtype=torch.int64), torch.tensor([True, False]),
               torch.randn(2, 2, dtype=torch.float64), torch.randn(4, dtype=torch.bfloat16))
    layout = wire.layout_of(tensors)
    buffer = wire.pack(tensors, layout, torch.device("cpu"))
    assert buffer.numel() == wire.packed_size(layout) and buffer.numel() % wire.ALIGN == 0
    values = wire.read_header(buffer)
    assert values[0] == wire.DATA and wire.layout_from(values) == layout
    back = wire.unpack(buffer, layout)
    assert back[1] is None
    for a, b in zip(tensors, back):
        if a is not None:
            assert b is not None and b.dtype == a.dtype and torch.equal(a, b)
    assert wire.read_header(wire.marker(wire.FAILED, [12], size=1024))[:2] == [wire.FAILED, 12]


def test_layouts_in_turn_each_keep_their_own_header_and_offsets() -> None:
    """Headers and offsets are kept per layout: packing another layout, or writing to a packed buffer, changes
    neither."""
    a = (torch.randn(8, 512),)
    b = (torch.randn(2, 3), torch.arange(5, dtype=torch.int32))
    layout_a, layout_b = wire.layout_of(a), wire.layout_of(b)
    first = wire.pack(a, layout_a, torch.device("cpu"))
    first[:wire.HEADER_BYTES].fill_(7)  # a packed buffer is the caller's: the kept header is untouched
    for tensors, layout in [(b, layout_b), (a, layout_a), (b, layout_b)]:
        buffer = wire.pack(tensors, layout, torch.device("cpu"))
        assert wire.layout_from(wire.read_header(buffer)) == layout
        assert buffer.numel() == wire.packed_size(layout)
        assert all(torch.equal(x, y) for x, y in zip(tensors, wire.unpack(buffer, layout)))
    assert wire.packed_size(layout_a) == wire.HEADER_BYTES + 8 * 512 * 4
    assert wire.packed_size(layout_b) == wire.HEADER_BYTES + 64 + 64  # each tensor starts on a 64-byte boundary


def test_a_failure_is_one_message_whose_text_fits_its_header() -> None:
    from swpipeline.pp.transport import Failure

    failure = Failure(1, 2, 3, "2F3", "ValueError: " + "x" * 5000)  # longer than any header
    data = failure.encode()
    assert len(data) <= wire.FAILURE_BYTES
    for size in (wire.HEADER_BYTES, 4096):  # alone, or in the buffer of the message it replaces
        buffer = wire.failure_marker(data, size)
        assert buffer.numel() == size and wire.read_header(buffer)[:2] == [wire.FAILED, len(data)]
        back = Failure.decode(wire.failure_text(buffer))
        assert back._replace(error="") == failure._replace(error="")
        assert back.error.startswith("ValueError: xxx") and back.error.endswith("...")
    short = Failure(0, None, None, None, "KeyboardInterrupt: ", silent=False)
    assert Failure.decode(wire.failure_text(wire.failure_marker(short.encode()))) == short
    with pytest.raises(ValueError, match="does not fit"):
        wire.failure_marker(b"x" * (wire.FAILURE_BYTES + 1))


def fail_and_stop(rank: int, world: int) -> Any:
    """Rank 1 waits for rank 0's first message; rank 0 fails instead and stops dead at once (SIGSTOP: its
    process keeps its connections but answers nothing), as a rank that fails and exits does; rank 1 wakes it
    once its receive ended."""
    import os
    import signal

    import torch.distributed as dist

    from swpipeline.pp import PipelineRankError
    from swpipeline.pp.transport import Failure, Transport

    pids: List[Any] = [None] * world
    dist.all_gather_object(pids, os.getpid())
    transport = Transport(None, rank, torch.device("cpu"), timeout=3.0)
    transport.start_step({1 - rank: 2}, "step")
    if rank == 0:
        dist.barrier()  # rank 1's receive is posted
        time.sleep(0.2)  # and its notice reached this rank
        transport.fail(Failure(0, 0, 2, "0F2", "ValueError: NaN in the forward"))
        os.kill(os.getpid(), signal.SIGSTOP)  # gone, as far as rank 1 can tell, until it says so
        dist.barrier()
        return "woken"
    got: Dict[str, Any] = {}
    receive = threading.Thread(target=lambda: _receive_into(transport, got))
    receive.start()
    time.sleep(0.2)
    dist.barrier()
    receive.join(timeout=30)
    os.kill(pids[0], signal.SIGCONT)
    dist.barrier()
    error = got.get("error")
    assert isinstance(error, PipelineRankError) or error is None
    return (type(error).__name__, error.rank, error.stage, error.microbatch, error.error) if error else got


def _receive_into(transport: Any, got: Dict[str, Any]) -> None:
    from swpipeline.pp.wire import HELLO

    try:
        transport.recv_marker(0, 0, HELLO)
        got["value"] = "hello"
    except Exception as exc:
        got["error"] = exc


def test_a_failure_arrives_whole_though_its_sender_stops_at_once() -> None:
    results = run_on_ranks(fail_and_stop, 2, timeout=60)
    assert results == ["woken", ("PipelineRankError", 0, 0, 2, "ValueError: NaN in the forward")]


def test_unsendable_messages_are_refused_with_the_limits() -> None:
    with pytest.raises(TypeError, match="cannot send a tensor of dtype torch.uint16 between stages"):
        wire.layout_of((torch.zeros(2, dtype=torch.uint16),))
    with pytest.raises(ValueError, match="at most 15 tensors"):
        wire.layout_of(tuple(torch.zeros(1) for _ in range(16)))


def steps_on_rank(rank: int, world: int, schedule: str, local: int, rows: List[int]) -> List[bool]:
    """One step per entry of ``rows`` (the batch size), back to back; whether each step's gradients are exact."""
    import swpipeline.pp as pp

    model = make_model()
    num_stages = world * local
    mine = list(range(rank, num_stages, world))
    modules = {s: stage_module(model, s, num_stages) for s in mine}
    stages = [pp.PipelineStage(modules[s], s, num_stages, torch.device("cpu")) for s in mine]
    sched = getattr(pp, schedule)(stages[0] if local == 1 else stages, 4, loss_fn=loss_fn, timeout=60.0)
    exact = []
    for k, n_rows in enumerate(rows):
        x, y = make_batch(seed=k, rows=n_rows)
        for m in modules.values():
            m.zero_grad(set_to_none=True)
        args = (x,) if 0 in mine else ()
        kwargs: Dict[str, Any] = {"target": y} if num_stages - 1 in mine else {}
        sched.step(*args, **kwargs)
        ref = reference_grads(model, x, y, 4)[0]
        exact.append(all(torch.equal(p.grad, g) for s in mine
                         for p, g in zip(modules[s].parameters(), ref[stage_param_slice(model, s, num_stages)])))
    return exact


def test_many_steps_back_to_back_with_changing_shapes_stay_exact() -> None:
    rows = [16] * 30 + [12, 12, 13, 16, 16]  # the layouts of the step before, then changed (12, 13 rows: uneven)
    for schedule, local in (("Schedule1F1B", 1), ("ScheduleInterleaved1F1B", 2)):
        results = run_on_ranks(steps_on_rank, 2, timeout=120, schedule=schedule, local=local, rows=rows)
        assert results == [[True] * len(rows)] * 2, schedule


def test_the_watchdog_calls_only_waits_past_their_deadline_and_keeps_its_heap_small() -> None:
    import threading
    import time

    from swpipeline.pp.watchdog import Watchdog

    fired: List[str] = []
    dog = Watchdog("test-watchdog")
    for _ in range(1000):  # waits that end in time, as every message of every step does
        dog.done(dog.watch(60.0, lambda: fired.append("early")))
    late = threading.Event()
    dog.watch(0.05, lambda: (fired.append("late"), late.set()))
    assert late.wait(5.0)
    assert fired == ["late"]
    assert len(dog._deadlines.heap) < 200
    thread = dog._thread
    del dog
    time.sleep(0.1)
    assert thread is not None and not thread.is_alive()  # it ends with its owner


def thread_starts_on_rank(rank: int, world: int) -> Dict[str, Any]:
    """Threads started during steps 3 to 8 of a 1F1B run (the first steps start the watchdog); the messages whose
    receive was posted late (after their step started)."""
    import swpipeline.pp as pp
    from swpipeline.pp import transport

    stage = pp.PipelineStage(stage_module(make_model(), rank, world), rank, world, torch.device("cpu"))
    schedule = pp.Schedule1F1B(stage, 4, loss_fn=loss_fn)
    x, y = make_batch()
    started: List[str] = []
    late: List[int] = []
    real_start, real_irecv = threading.Thread.start, transport.Transport._irecv

    def start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    def irecv(self: Any, buffer: torch.Tensor, peer: int, message_tag: int) -> Any:
        if not self._outboxes or self._outboxes[peer].next_index:  # posted once this rank had sent something
            late.append(message_tag)
        return real_irecv(self, buffer, peer, message_tag)

    for step in range(8):
        if step == 2:
            threading.Thread.start = start  # type: ignore[method-assign]
            transport.Transport._irecv = irecv  # type: ignore[method-assign]
        schedule.step(*((x,) if rank == 0 else ()), **({"target": y} if rank else {}))
    threading.Thread.start = real_start  # type: ignore[method-assign]
    transport.Transport._irecv = real_irecv  # type: ignore[method-assign]
    return {"threads": started, "late": late}


def test_a_step_starts_no_thread_and_posts_every_receive_before_it_sends() -> None:
    """A rank runs its step on the caller's thread (a thread per peer, started and joined every step, cost 0.4-0.5 ms
    of CPU per step), and posts every receive of the step, its peers' HELLO and DONE included, as the step starts:
    a DONE whose receive was posted after it came took milliseconds more at the end of each step."""
    for got in run_on_ranks(thread_starts_on_rank, 2, timeout=120):
        assert got == {"threads": [], "late": []}
