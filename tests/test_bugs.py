"""Bug stories: each real bug found in this project, as the test that catches it, with its story.

Every test's docstring says what happened, how it was found, what the test checks, and which
change to the code would make the test fail again. The tests run on the CPU; where a bug first
showed on a GPU, the test forces on the CPU the interleaving the GPU made likely.
"""

from __future__ import annotations

import copy
import gc
import pickle
import threading
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch

from engine_helpers import (ExecLog, Fn, MakePipe, make_plan, on_new_thread, plan_of, progress_until_stop,
                            swp_threads)
from inplace_job import INPLACE_RACE, InPlace
from swpipeline import (DataFlowPipeline, IterContext, PipelinePlan, PipelineTask, RaceChecker, RaceError, SWPipeline,
                        TaskSchedule, WeightVersions, analyze)
from swpipeline.shortcut.recording import Journal, RecordingView


# -- 1. autocast's weight cache, one for the whole process -------------------------------------------------------


def cache_race_plan(update_in_b: bool, events: bool) -> Tuple[PipelinePlan, Dict[str, torch.Tensor], torch.nn.Linear]:
    """A (group a) runs the layer under autocast and, with ``events``, holds its unit open until B is done;
    B (group b) changes the layer's weight in place after A's cast, then runs the layer itself."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    out: Dict[str, torch.Tensor] = {}
    a_ran, b_done = threading.Event(), threading.Event()

    def a(ctx: IterContext) -> None:
        out["a"] = layer(x)
        if events:
            a_ran.set()
            assert b_done.wait(5), "B never finished"

    def b(ctx: IterContext) -> None:
        if events:
            assert a_ran.wait(5), "A never ran"
        if update_in_b:
            with torch.no_grad():
                layer.weight.add_(1)
        out["b"] = layer(x)
        b_done.set()

    ta, tb = PipelineTask("A", a), PipelineTask("B", b)
    schedule = {ta: TaskSchedule(thread_group="a", stream="a"), tb: TaskSchedule(thread_group="b", stream="b")}
    return PipelinePlan(schedule), out, layer


def fresh(layer: torch.nn.Linear) -> torch.Tensor:
    torch.manual_seed(0)
    torch.nn.Linear(8, 8)  # the same draws as cache_race_plan: x comes after the layer
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        return layer(x)


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlow-3"])
def test_a_task_never_sees_a_weight_cast_another_thread_made_before_the_weight_changed(engine: str) -> None:
    """Autocast's weight cache is one for the whole process.

    On an H100 (torch 2.11), a CUDA autocast test of the data-flow engine failed once in the parallel suite.
    Repeated under a second GPU workload, a two-stream pipeline under the caller's ``torch.autocast`` differed
    from ``run_serial`` in 28 of 56 runs (errors up to 28, sometimes NaN), and in none of 6,486 without that
    workload. torch keeps one cache of autocast's weight casts per process, not per thread: a task got the cast
    another thread had made, on another stream (maybe not computed yet), of a weight changed in place since, or
    one freed under it when the first thread to leave its autocast region cleared the cache for all. The fix
    runs every task with the cache off (``engine/modes.py``: the caller's autocast is carried to the workers
    without the cache, and ``weight_cache_off`` turns it off on every worker and for every driving call). Here,
    on the CPU, events force the order: A casts the weight, B changes it in place and runs the layer while A's
    unit is still open; B must compute with the changed weight. Entering the carried autocast region with
    ``cache_enabled=True`` (``Modes.applied``) makes B read A's stale cast and fail.
    """
    plan, out, layer = cache_race_plan(update_in_b=True, events=True)
    pipe: Any = (SWPipeline(plan, device="cpu", caller_thread_group=None) if engine == "SWPipeline" else
                 DataFlowPipeline(plan, max_depth=3, device="cpu", caller_thread_group=None))  # A, B on workers
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pipe.run(range(1))
    assert not torch.equal(out["b"], out["a"])  # B's weight is not A's
    assert torch.equal(out["b"], fresh(layer))


def test_the_serial_run_casts_each_weight_as_it_is_when_used() -> None:
    """The serial half of the autocast story: the baseline computes what the pipelined tasks compute.

    With the tasks on the cache off, ``run_serial`` on the caller's thread must run its tasks with the cache off
    too, or its B reuses the cast made before its own in-place change and the baseline differs from the
    pipelined run. The caller's own setting is given back afterwards. Letting ``run_serial`` keep the caller's
    cache on makes B's output the stale cast's and the test fail.
    """
    plan, out, layer = cache_race_plan(update_in_b=True, events=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        SWPipeline(plan).run_serial(range(1))
        assert torch.is_autocast_cache_enabled()  # the caller's own setting, as it was
    assert torch.equal(out["b"], fresh(layer))


# -- 2. the race checker blamed the reader for another thread's change ----------------------------------------


@pytest.mark.parametrize("reader_returns", ["first", "last"])
def test_a_value_changed_by_another_task_while_a_reader_runs_is_the_changers_write(reader_returns: str) -> None:
    """The race checker named the reader as the writer.

    ``check_races=True`` compared a tensor read from the context before and after the reading task (its version
    counter). When B doubled ``ctx.x`` in place on its thread while C, on another, was still reading it, C's
    check saw the value changed and logged the change as C's own: the report said C changes ctx.x in place,
    which B reads, the roles swapped. It showed as a flaky failure: the in-place test of the shared-state checks
    failed about once in four suite runs. The fix counts a change only where an operator on the reading task's
    own thread wrote the memory (the checks now follow the memory each call's operators write,
    ``analysis/checked_call.py``); the change is B's write, which B's own check logs. Here events force the
    interleaving (C reads, B changes, C returns before or after B) and the report must say C reads what B
    changes. Watching tensors by their version counter again and counting a change seen at the end of a call as
    the caller's (``CheckedJournal.finish``) makes C raise the swapped report and the test fail.
    """
    read, changed, c_done, b_done = threading.Event(), threading.Event(), threading.Event(), threading.Event()

    class Forced(InPlace):
        def b(self, ctx: IterContext) -> None:
            assert read.wait(timeout=10)
            super().b(ctx)
            changed.set()
            if reader_returns == "first":
                assert c_done.wait(timeout=10)

        def c(self, ctx: IterContext) -> None:
            x = ctx.x
            read.set()
            assert changed.wait(timeout=10)
            if reader_returns == "last":
                assert b_done.wait(timeout=10)
            self.seen.append(int(x))

    job = Forced()
    plan = plan_of(job.spec(), intra=[("B", "A"), ("C", "A")])
    checker = RaceChecker(plan)
    run_a, run_b, run_c = (checker.wrap(task) for task in plan.tasks)
    ctx = IterContext(None, 0)
    run_a(ctx)
    in_c: List[BaseException] = []

    def reader() -> None:
        try:
            run_c(ctx)
        except BaseException as exc:  # noqa: BLE001 (handed to the test thread)
            in_c.append(exc)
        finally:
            c_done.set()

    thread = threading.Thread(target=reader)
    thread.start()
    with pytest.raises(RaceError) as info:
        try:
            run_b(ctx)
        finally:
            b_done.set()
    thread.join(timeout=10)
    assert not thread.is_alive() and in_c == [] and job.seen == [0]
    assert str(info.value) == INPLACE_RACE
    assert (info.value.attribute, info.value.first, info.value.second) == ("ctx.x", ("B", 0), ("C", 0))


# -- 3. two threads finding one race reported two different ones ----------------------------------------------


def test_two_readers_racing_with_one_write_report_the_same_race() -> None:
    """Which race the caller saw depended on which thread reported first.

    A test of the race checks on generators failed under load about one run in ten: two worker threads found
    races at about the same time, each reported the pair it had just seen, and the caller raised whichever
    reached it first. The fix reports, for a generator and then for a context attribute, the conflicting pair a
    serial run reaches first among those logged (``analysis/checker.py``, ``_earliest`` by ``_serial_rank``), so
    every thread raises the same RaceError. Here B and C both read ``ctx.x``, which A writes, with no
    dependency: B's check and then C's find a race, replayed on one thread in the order the flaky run took; both
    must name (A, B). Reporting the pair the finding thread has just compared (``RaceChecker._compare`` without
    ``_earliest``) makes C's error name (A, C) and fail.
    """
    def write_x(ctx: IterContext) -> None:
        ctx.x = ctx.iter_idx

    def reads_into(name: str) -> Fn:
        def read(ctx: IterContext) -> None:
            setattr(ctx, name, getattr(ctx, "x", None))
        return read

    plan = plan_of({"A": (0, "a", "a", write_x), "B": (0, "b", "b", reads_into("b")),
                    "C": (0, "c", "c", reads_into("c"))})
    checker = RaceChecker(plan)
    ctx = IterContext(None, 0)
    checker.wrap("A")(ctx)
    with pytest.raises(RaceError) as first:
        checker.wrap("B")(ctx)
    with pytest.raises(RaceError) as second:
        checker.wrap("C")(ctx)
    assert str(first.value) == str(second.value)
    assert (second.value.first, second.value.second) == (("A", 0), ("B", 0))


# -- 4. thread idents are reused -----------------------------------------------------------------------------


def test_a_new_thread_may_drive_a_pipeline_whose_run_has_finished(make_pipe: MakePipe) -> None:
    """A new thread was taken for a dead worker of the run before.

    The pipeline told threads apart by ``threading.get_ident()``: who holds the driving claim, and whether a
    caller is a worker of the run (a task calling its own pipeline, refused: it would wait for itself). On Linux
    a new thread very often gets the ident of one that has ended, such as a worker of the last run, so a fresh
    thread driving the pipeline after a run had finished could be taken for that dead worker and refused,
    depending on which ident it drew. The fix, made with the life-cycle work that lets any thread drive a
    pipeline once the previous driving call has returned, tells threads apart by their ``threading.Thread``
    object (``engine/driving.py``, the crew's ``worker_on``); this test came with it. Runs alternate between the
    test's thread and a fresh one, three times, so that the fresh thread is likely to draw a dead worker's
    ident; each must run every batch. Looking a worker up by ident again (``Crew.worker_on``) makes the fresh
    thread's call fail whenever its ident is reused (in three runs of three here).
    """
    pipe = make_pipe(make_plan(ExecLog(), {"Load": (0, "copy", "io"), "Train": (1, None, "compute")},
                               intra=[("Train", "Load")]), device="cpu")
    for _ in range(3):
        assert progress_until_stop(pipe, pipe.fill_pipeline(range(4))) == [0, 1, 2, 3]  # no drain()
        result = on_new_thread(lambda: progress_until_stop(pipe, pipe.fill_pipeline(range(2))))
        assert result == [[0, 1]]
    assert swp_threads() == []


# -- 5. a look at every attribute raised ValueError --------------------------------------------------------------


def test_a_look_at_every_attribute_after_the_write_is_the_race_too() -> None:
    """``min()`` of an empty sequence instead of the race.

    A task that looks at every attribute of its context at once (iterating ``vars(ctx)``, a copy, a pickle)
    counts as a read of all of them. When such a look came after another thread group's unordered write of
    ``ctx.x``, the race report searched the attribute's own accesses for the earliest racing pair, the look was
    not among them, and the check raised ``ValueError`` (an empty ``min()``) instead of the race. The fix, made
    while the checker's hot path was being trimmed, lets the look take part in the attribute's pairs; this test
    came with it. Here A writes and then B deep-copies the context, on one thread in that order; the report must
    be the race. Picking the pair from the attribute's own log alone (``pool = entries`` in
    ``RaceChecker._compare``) makes it raise ValueError again.
    """
    def writes(ctx: IterContext) -> None:
        ctx.x = 1

    plan = plan_of({"A": (0, "a", "a", writes), "B": (0, "b", "b", lambda ctx: copy.deepcopy(ctx))})
    checker = RaceChecker(plan)
    ctx = IterContext(None, 0)
    checker.wrap("A")(ctx)
    with pytest.raises(RaceError) as info:
        checker.wrap("B")(ctx)
    assert str(info.value) == ("race on ctx.x: 'B' (iteration 0) reads ctx.x, which 'A' (iteration 0) writes, and no "
                               "declared dependency orders the two (a serial run runs 'A' first): add (\"B\", \"A\") "
                               "to intra_iter_deps")


# -- 6. a context stored in itself ----------------------------------------------------------------------------


@pytest.mark.parametrize("check", ["plain", "check_races", "analyze"])
def test_a_context_stored_in_itself_is_the_context_under_every_check(check: str) -> None:
    """``ctx.me = ctx`` kept the checks' stand-in past its call.

    The checks hand a task a recording view that stands for its context. A task that stored the context in
    itself (``ctx.me = ctx``) stored the view, and a later task reading ``ctx.me`` got a view whose call had
    ended instead of the context, so ``check_races`` and ``analyze`` changed what a correct plan computed. It
    was fixed, with this test, together with naming ``WeightVersions``' stashed versions in the checks' reports.
    The fix stores the context where a task stores its view (``shortcut/recording.py``'s ``unwrapped``). Here
    the later task must see an ``IterContext`` with the value under every check. Making ``unwrapped`` return the
    view as given makes the analyzed run see a ``RecordingView`` and fail.
    """
    seen: List[Tuple[type, int]] = []

    def keep(ctx: IterContext) -> None:
        ctx.me = ctx
        ctx.x = 1

    def look(ctx: IterContext) -> None:
        seen.append((type(ctx.me), ctx.me.x))

    plan = plan_of({"Keep": (0, None, "default", keep), "Look": (0, None, "default", look)}, intra=[("Look", "Keep")])
    if check == "analyze":
        analyze(plan, None)
    else:
        SWPipeline(plan, device="cpu", check_races=check == "check_races").run(range(2))
    assert seen == [(IterContext, 1)] * (1 if check == "analyze" else 2)


# -- 7. pickling the context under the checks ------------------------------------------------------------------


def test_a_view_pickles_to_the_bytes_of_its_context_and_notes_the_look() -> None:
    """``pickle.dumps(ctx)`` failed under the checks.

    A task that saved its context (``torch.save(ctx, buf)``, ``pickle.dumps(ctx)``) ran in a plain run and
    failed under ``check_races=True``, ``analyze()`` and a shortcut's caching run with ``PicklingError: args[0]
    from __newobj__ args has the wrong class``: pickle checks the class of the object it saves against the class
    its reduction names, and the recording view's class was not ``IterContext``. The fix gives the view its
    context's ``__class__`` and reduction (``shortcut/recording.py``) and counts the pickle as a read of every
    attribute; ``tests/shortcut/test_recording_view_pickle.py`` came with it and checks the runs. Here the view
    must pickle to exactly the context's bytes, for every protocol, refuse protocols 0 and 1 with the context's
    own error, and note the look. Answering the view's own class for ``__class__`` again makes pickle raise that
    ``PicklingError``.
    """
    ctx = IterContext(torch.ones(2), 3)
    ctx.x, ctx.y = 1, [2]
    journal = Journal(ctx)
    view = RecordingView(journal)
    assert pickle.dumps(view) == pickle.dumps(ctx)
    assert pickle.dumps([view, view]) == pickle.dumps([ctx, ctx])  # the second is a reference to the first
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.dumps(view, protocol=protocol) == pickle.dumps(ctx, protocol=protocol)
    for protocol in (0, 1):  # a class with __slots__ and no __getstate__: refused, the same way
        with pytest.raises(TypeError) as plain:
            pickle.dumps(ctx, protocol=protocol)
        with pytest.raises(TypeError) as viewed:
            pickle.dumps(view, protocol=protocol)
        assert str(viewed.value) == str(plain.value)
    assert journal.reads == {"x", "y", "batch"}
    assert type(view) is RecordingView and isinstance(view, IterContext)


# -- 8. a retry trained the weights of the failed attempt --------------------------------------------------------


@pytest.mark.parametrize("failed_context", ["freed", "kept"])
def test_a_retry_after_a_failed_first_attempt_trains_the_weights_loaded_in_between(failed_context: str) -> None:
    """``WeightVersions`` kept version 0 of a run that failed before its first step.

    A run failed before any step finished (the backward of iteration 0 raised); the user loaded other weights
    (``model.load_state_dict``) and called ``run`` again. The retry's first iterations computed on the weights
    the failed attempt had started from: a run's start was inferred from the iteration numbers, and after a
    failure before the first step the next iteration number was 0 again, so version 0 was kept (with the failed
    iteration's context still alive, held by the exception, the retry was refused instead).
    ``tests/training/test_weights_runs.py``, which came with the fix, runs it on every engine. The fix starts a
    run at any forward numbered at or below the run's first iteration on a new context
    (``WeightVersions._leaves_of``). Here the retry's forward must compute with the loaded weights. Dropping ``i
    <= self._first`` from the condition that starts a run makes it fail.
    """
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    versions = WeightVersions(model, staleness=1)
    x = torch.randn(3, 4)
    attempt: Optional[IterContext] = IterContext(x, 0)
    assert attempt is not None
    with versions.use(attempt):
        model(x)  # the attempt fails here, before its step
    if failed_context == "freed":
        attempt = None
        gc.collect()
    loaded = {name: value + 1 for name, value in model.state_dict().items()}
    model.load_state_dict(loaded)
    with versions.use(IterContext(x, 0)):
        out = model(x)
    assert torch.equal(out, torch.nn.functional.linear(x, loaded["weight"], loaded["bias"]))
    versions.close()


# -- 9. a snapshot of the best weights was a race ------------------------------------------------------------------


@pytest.mark.parametrize("check", ["analyze", "check_races"])
def test_a_snapshot_of_the_weights_is_a_read_of_them(check: str) -> None:
    """``best = copy.deepcopy(model.state_dict())`` on one thread group was called a write of the weights.

    Once the checks followed memory, a write was the memory a written tensor covered after its operator ran.
    ``copy.deepcopy`` of a tensor makes an empty tensor and points it at the copied storage with ``set_`` (to
    copy the bytes), and ``set_``'s schema marks that tensor written: so a snapshot wrote ``model.weight``.
    ``analyze`` asked for a dependency the loop does not need and ``check_races=True`` raised ``RaceError`` on a
    correct plan. Found by trying what a training loop does (issue: "Copying is reading");
    ``tests/analysis/test_copies.py`` checks the catalogue of copies and changes that came with the fix. Now
    a write is the memory a written tensor covered *before* the operator ran. Handing ``wrote`` the region
    looked up after the call (``operators.py``) makes this test fail again.
    """
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    snapshots: List[Dict[str, torch.Tensor]] = []
    seen: List[torch.Tensor] = []

    def snapshot(ctx: IterContext) -> None:
        snapshots.append(copy.deepcopy(model.state_dict()))

    def forward(ctx: IterContext) -> None:
        with torch.no_grad():
            seen.append(model(torch.ones(1, 4)))

    plan = plan_of({"Snapshot": (0, "a", "a", snapshot), "Forward": (0, None, "default", forward)})
    if check == "analyze":
        assert analyze(plan, None).missing_deps == []
        return
    SWPipeline(plan, device="cpu", check_races=True).run(range(3))
    assert len(snapshots) == len(seen) == 3
    assert all(torch.equal(s["weight"], model.weight) for s in snapshots)


# -- 10. a race raised inside a library call became that library's error ---------------------------------------


@pytest.mark.parametrize("swallow", ["load_state_dict", "except"])
def test_a_race_raised_inside_a_call_that_catches_it_is_still_the_race(swallow: str) -> None:
    """``model.load_state_dict`` turned the checker's ``RaceError`` into a ``RuntimeError`` listing it.

    A write of the weights is judged before the operator writes, inside torch's dispatch. ``load_state_dict``
    copies each parameter in a ``try`` and collects what is raised as text, then raises a ``RuntimeError``: the
    race reached the user as a failure to load. A task that catches the error itself (``except RuntimeError``)
    hid the race altogether, and the run finished. Found by the catalogue of copies and writes
    (``tests/analysis/test_copies.py``), where the load row failed one run in three: whether the race is found
    at the write (inside ``load_state_dict``) or at the other task's read depends on which comes second. Here
    the order is forced: ``Look`` comes first in the serial order and runs first, so the race is found at
    ``Act``'s write. The checker now keeps a race raised in a call and raises it when the call ends, whatever
    the call did with it (the call's own exception is its cause). Not re-raising ``journal.raced`` in
    ``RaceChecker.wrap`` makes this test fail again.
    """
    torch.manual_seed(0)
    model, other = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)

    def look(ctx: IterContext) -> None:
        with torch.no_grad():
            model(torch.ones(1, 4))

    def act(ctx: IterContext) -> None:
        if swallow == "load_state_dict":
            model.load_state_dict(other.state_dict())
            return
        try:
            with torch.no_grad():
                model.weight.add_(1)
        except RuntimeError:
            pass

    plan = plan_of({"Look": (0, "b", "b", look), "Act": (1, "a", "a", act)})
    with pytest.raises(RaceError) as info:
        SWPipeline(plan, device="cpu", check_races=True).run_serial([None])
    assert str(info.value) == (
        "race on model.weight: 'Act' (iteration 0) writes model.weight, which 'Look' (iteration 0) reads, and no "
        "declared dependency orders the two (a serial run runs 'Look' first): add (\"Act\", \"Look\") to "
        "intra_iter_deps")
    if swallow == "load_state_dict":
        assert isinstance(info.value.__cause__, RuntimeError)
        assert "Error(s) in loading state_dict" in str(info.value.__cause__)
