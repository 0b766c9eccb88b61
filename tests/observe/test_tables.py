"""print_schedule / print_stage_analysis / __repr__ against the tables the seeds print.

The seeds' tables were extracted from HTML, so their whitespace is collapsed: they are
compared token by token. The exact layout (minimum column widths 17/7/12/5 for
Task/Thread/Stream/period cells, trailing blanks stripped) is asserted separately.
"""

from __future__ import annotations

import pytest

from engine_helpers import FakeStream
from swpipeline import PipelinePlan, PipelineTask, SWPipeline, TaskSchedule
from swpipeline.observe.tables import format_period_table

import seed_plans

FUSED_SPARSE_DIST_5 = "\n".join([
    "#  Task              Thread  Stream       | P0    P1    P2    P3    P4",
    "-- ----------------- ------- ------------ + ----- ----- ----- ----- -----",
    "0  EmbLookup         default emb_lookup   | --    --    i0    i1    i2",
    "1  ZeroGrad          default default      | --    --    i0    i1    i2",
    "2  WaitBatch         default default      | --    --    i0    i1    i2",
    "3  Forward           default default      | --    --    i0    i1    i2",
    "4  Backward          default default      | --    --    i0    i1    i2",
    "5  OptimizerStep     default default      | --    --    i0    i1    i2",
    "6  InputDistStart    default data_dist    | --    i0    i1    i2    i3",
    "7  InputDistWait     default data_dist    | --    i0    i1    i2    i3",
    "8  H2D               default memcpy       | i0    i1    i2    i3    i4",
])

BASE_3 = "\n".join([
    "#  Task              Thread  Stream       | P0    P1    P2",
    "-- ----------------- ------- ------------ + ----- ----- -----",
    "0  ZeroGrad          default default      | --    i0    i1",
    "1  WaitBatch         default default      | --    i0    i1",
    "2  Forward           default default      | --    i0    i1",
    "3  Backward          default default      | --    i0    i1",
    "4  OptimizerStep     default default      | --    i0    i1",
    "5  H2D               default memcpy       | i0    i1    i2",
])

# PT2 declares no dependencies: inside its one stage (one stream) the rows, like the tasks on the
# stream, follow the declaration order, never the names (the seed's table is in name order).
PT2_2 = "\n".join([
    "#  Task              Thread  Stream       | P0    P1",
    "-- ----------------- ------- ------------ + ----- -----",
    "0  LoadBatch         default default      | i0    i1",
    "1  H2D               default default      | i0    i1",
    "2  InputTransform    default default      | i0    i1",
    "3  ZeroGrad          default default      | i0    i1",
    "4  Forward           default default      | i0    i1",
    "5  Backward          default default      | i0    i1",
    "6  OptimizerStep     default default      | i0    i1",
])


def pipe_of(plan: PipelinePlan) -> SWPipeline:
    return SWPipeline(plan, device="cpu")


# -- print_schedule ---------------------------------------------------------------------------


def test_fused_sparse_dist_schedule_matches_seed_000_token_by_token() -> None:
    num_periods, expected = seed_plans.SEED_TABLES["FusedSparseDist000"]
    out = pipe_of(seed_plans.fused_sparse_dist_000()).format_schedule(num_periods)
    assert out.split() == expected.split()


def test_fused_sparse_dist_schedule_exact_layout() -> None:
    assert pipe_of(seed_plans.fused_sparse_dist_000()).format_schedule(5) == FUSED_SPARSE_DIST_5
    assert pipe_of(seed_plans.fused_sparse_dist()).format_schedule(5) == FUSED_SPARSE_DIST_5
    assert pipe_of(seed_plans.fused_sparse_dist(make_fn=seed_plans.noop)).format_schedule(5) == FUSED_SPARSE_DIST_5


@pytest.mark.parametrize("name", sorted(seed_plans.SEED_TABLES))
def test_seed_001_schedules_match_token_by_token(name: str) -> None:
    num_periods, expected = seed_plans.SEED_TABLES[name]
    out = pipe_of(seed_plans.ALL_BUILDERS[name]()).format_schedule(num_periods)
    assert out.split() == expected.split()
    lines = out.split("\n")
    assert len(lines) == 2 + len(seed_plans.ALL_BUILDERS[name]().tasks)
    assert all(line == line.rstrip() for line in lines)


def test_seed_tables_have_the_documented_periods() -> None:
    assert seed_plans.SEED_TABLES["SemiSync"][0] == 6
    assert {n for n, (p, _) in seed_plans.SEED_TABLES.items() if p == 5} == {
        "Base", "SparseDist", "SparseDistLite", "FusedSparseDist", "FusedSparseDist000", "Prefetch",
        "CompAutograd"}


def test_base_schedule_exact_layout_with_fewer_periods_than_cell_width() -> None:
    assert pipe_of(seed_plans.base()).format_schedule(3) == BASE_3


def test_pt2_schedule_exact_layout() -> None:
    assert pipe_of(seed_plans.pt2()).format_schedule(2) == PT2_2


def test_stream_none_and_default_both_print_default() -> None:
    plan = PipelinePlan({"A": TaskSchedule(stream=None), "B": TaskSchedule(stream="default"),
                         "C": TaskSchedule(stream="memcpy")}, intra_iter_deps=[("B", "A"), ("C", "B")])
    assert pipe_of(plan).format_schedule(1) == "\n".join([
        "#  Task              Thread  Stream       | P0",
        "-- ----------------- ------- ------------ + -----",
        "0  A                 default default      | i0",
        "1  B                 default default      | i0",
        "2  C                 default memcpy       | i0",
    ])


def test_a_stream_object_prints_its_swp_name() -> None:
    plan = PipelinePlan({"E": TaskSchedule(stream=FakeStream("emb_lookup"))})
    assert pipe_of(plan).format_schedule(1).split("\n")[2] == "0  E                 default emb_lookup   | i0"


def test_columns_widen_for_long_names_groups_streams_and_periods() -> None:
    plan = PipelinePlan({"VeryLongTaskNameForTesting": TaskSchedule(stream="a_really_long_stream",
                                                                    thread_group="loader_thread")})
    assert pipe_of(plan).format_schedule(12) == "\n".join([
        "#  Task                       Thread        Stream               | P0    P1    P2    P3    P4    P5"
        "    P6    P7    P8    P9    P10   P11",
        "-- -------------------------- ------------- -------------------- + ----- ----- ----- ----- ----- -----"
        " ----- ----- ----- ----- ----- -----",
        "0  VeryLongTaskNameForTesting loader_thread a_really_long_stream | i0    i1    i2    i3    i4    i5"
        "    i6    i7    i8    i9    i10   i11",
    ])


def test_period_cells_widen_for_long_cells() -> None:
    rows = [("A", "default", "default", ["i99999", "i100000"]), ("B", "default", "default", ["--", "i0"])]
    assert format_period_table(rows, 2) == "\n".join([
        "#  Task              Thread  Stream       | P0      P1",
        "-- ----------------- ------- ------------ + ------- -------",
        "0  A                 default default      | i99999  i100000",
        "1  B                 default default      | --      i0",
    ])


def test_index_column_widens_past_99_rows() -> None:
    names = [f"T{k:03d}" for k in range(101)]
    plan = PipelinePlan({n: TaskSchedule() for n in names},
                        intra_iter_deps=[(b, a) for a, b in zip(names, names[1:])])
    lines = pipe_of(plan).format_schedule(1).split("\n")
    assert lines[0] == "#   Task              Thread  Stream       | P0"
    assert lines[1] == "--- ----------------- ------- ------------ + -----"
    assert lines[2] == "0   T000              default default      | i0"
    assert lines[-1] == "100 T100              default default      | i0"


def test_thread_group_column() -> None:
    plan = PipelinePlan({"H2D": TaskSchedule(stream="memcpy", thread_group="loader"),
                         "Fwd": TaskSchedule(stage=1)}, intra_iter_deps=[("Fwd", "H2D")])
    assert pipe_of(plan).format_schedule(2).split("\n")[2:] == [
        "0  Fwd               default default      | --    i0",
        "1  H2D               loader  memcpy       | i0    i1",
    ]


@pytest.mark.parametrize("num_periods", [0, -1, True, 2.0, "3", None])
def test_format_schedule_rejects_a_bad_period_count(num_periods: object) -> None:
    pipe = pipe_of(seed_plans.base())
    with pytest.raises(ValueError, match=r"num_periods must be a positive int, got " + repr(num_periods)):
        pipe.format_schedule(num_periods)  # type: ignore[arg-type]


def test_print_schedule_prints_format_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    pipe = pipe_of(seed_plans.fused_sparse_dist_000())
    pipe.print_schedule(5)
    assert capsys.readouterr().out == FUSED_SPARSE_DIST_5 + "\n"


def test_format_period_table_directly() -> None:
    rows = [("Forward", "compute", "default", ["--", "i0"]), ("H2D", "io", "memcpy", ["i0", "i1"])]
    assert format_period_table(rows, 2) == "\n".join([
        "#  Task              Thread  Stream       | P0    P1",
        "-- ----------------- ------- ------------ + ----- -----",
        "0  Forward           compute default      | --    i0",
        "1  H2D               io      memcpy       | i0    i1",
    ])


# -- print_stage_analysis ---------------------------------------------------------------------------

# The specification's printed example, whitespace collapsed as it was extracted ("..." elides rows).
SPEC_STAGE_ANALYSIS = """\
Task schedule (topological order):
Pos Task Idx Stage Type
--------------------------------------------------
0 CopyBatch 0 0 stream
1 Forward 1 1 stream
...
LDS = 2 (example: (1, 0))
Pipeline depth = 2
\u2713 LDS == depth (Dilworth-optimal)"""

LDS_LINE = ("  LDS: the longest chain of dependencies, consumer first, in which each task is at a later stage than the "
            "task it needs (here {}); its tasks need one stage each, so the depth is at least the LDS")
DILWORTH_LINE = ("  Dilworth-optimal: the depth equals the LDS, so every stage boundary separates a producer from a "
                 "consumer that needs its result")

COPY_FORWARD = "\n".join([
    "Task schedule (topological order):",
    "Pos  Task                 Idx  Stage  Type",
    "-" * 50,
    "0    CopyBatch            0    0      stream",
    "1    Forward              1    1      stream",
    "LDS = 2 (example: (1, 0))",
    "Pipeline depth = 2",
    "\u2713 LDS == depth (Dilworth-optimal)",
    LDS_LINE.format("Forward <- CopyBatch"),
    DILWORTH_LINE,
])


def copy_forward_plan() -> PipelinePlan:
    copy, fwd = PipelineTask("CopyBatch", seed_plans.noop("c")), PipelineTask("Forward", seed_plans.noop("f"))
    return PipelinePlan({copy: TaskSchedule(stage=0, stream="memcpy", thread_group="io"),
                         fwd: TaskSchedule(stage=1, thread_group="compute")},
                        intra_iter_deps=[(fwd, copy)], pipeline_depth=2)


def test_stage_analysis_matches_the_specification_token_by_token() -> None:
    # every line the specification shows, in its order; the explanation of LDS and the verdict follows it
    got = [line.split() for line in pipe_of(copy_forward_plan()).format_stage_analysis().splitlines()]
    spec = [line.split() for line in SPEC_STAGE_ANALYSIS.splitlines()]
    elided = spec.index(["..."])
    assert got[:elided] == spec[:elided]
    assert got[elided:elided + len(spec) - elided - 1] == spec[elided + 1:]
    assert got[2] == ["-" * 50]


def test_stage_analysis_of_the_seed_copybatch_forward_example() -> None:
    assert pipe_of(copy_forward_plan()).format_stage_analysis() == COPY_FORWARD


def test_stage_analysis_when_lds_is_shorter_than_depth() -> None:
    plan = PipelinePlan({"A": TaskSchedule(), "B": TaskSchedule(stage=2)}, intra_iter_deps=[("B", "A")])
    assert pipe_of(plan).format_stage_analysis() == "\n".join([
        "Task schedule (topological order):",
        "Pos  Task                 Idx  Stage  Type",
        "-" * 50,
        "0    A                    1    0      stream",
        "1    B                    0    2      stream",
        "LDS = 2 (example: (2, 0))",
        "Pipeline depth = 3",
        "\u2717 LDS < depth: 1 stage(s) hold a batch in flight without separating a producer from its "
        "consumer; a depth of 2 gives the same dependency structure",
        LDS_LINE.format("B <- A"),
    ])


def test_stage_analysis_without_dependencies_has_lds_1() -> None:
    plan = PipelinePlan({"Solo": TaskSchedule(stage=1)})
    assert pipe_of(plan).format_stage_analysis().split("\n")[3:] == [
        "0    Solo                 0    1      stream",
        "LDS = 1 (example: (1,))",
        "Pipeline depth = 2",
        "\u2717 LDS < depth: 1 stage(s) hold a batch in flight without separating a producer from its "
        "consumer; a depth of 1 gives the same dependency structure",
        LDS_LINE.format("Solo"),
    ]


def test_stage_analysis_of_fused_sparse_dist() -> None:
    # Rows in serial order; Idx is the position in the ready-first enqueue order.
    assert pipe_of(seed_plans.fused_sparse_dist_000()).format_stage_analysis() == "\n".join([
        "Task schedule (topological order):",
        "Pos  Task                 Idx  Stage  Type",
        "-" * 50,
        "0    H2D                  1    0      stream",
        "1    InputDistStart       2    1      stream",
        "2    InputDistWait        4    1      stream",
        "3    EmbLookup            0    2      stream",
        "4    ZeroGrad             3    2      stream",
        "5    WaitBatch            5    2      stream",
        "6    Forward              6    2      stream",
        "7    Backward             7    2      stream",
        "8    OptimizerStep        8    2      stream",
        "LDS = 3 (example: (2, 1, 0))",
        "Pipeline depth = 3",
        "\u2713 LDS == depth (Dilworth-optimal)",
        LDS_LINE.format("EmbLookup <- InputDistWait <- H2D"),
        DILWORTH_LINE,
    ])


def test_stage_analysis_widens_the_task_column_and_the_rule_for_long_names() -> None:
    plan = PipelinePlan({"AVeryLongTaskNameIndeed": TaskSchedule()})
    lines = pipe_of(plan).format_stage_analysis().split("\n")
    assert lines[1] == "Pos  Task                    Idx  Stage  Type"
    assert lines[2] == "-" * 50
    assert lines[3] == "0    AVeryLongTaskNameIndeed 0    0      stream"
    longer = PipelinePlan({"A" * 40: TaskSchedule()})
    lines = pipe_of(longer).format_stage_analysis().split("\n")
    assert lines[2] == "-" * len(lines[3]) == "-" * 64


def test_print_stage_analysis_prints_format_stage_analysis(capsys: pytest.CaptureFixture[str]) -> None:
    pipe = pipe_of(seed_plans.sparse_dist())
    pipe.print_stage_analysis()
    assert capsys.readouterr().out == pipe.format_stage_analysis() + "\n"


# -- __repr__ -------------------------------------------------------------------------------------


def test_repr_shows_device_depth_tasks_and_one_period_per_stage() -> None:
    pipe = pipe_of(seed_plans.fused_sparse_dist_000())
    text = repr(pipe)
    assert text.startswith("SWPipeline(device=cpu, depth=3, ")
    head, blank, *table = text.split("\n")
    assert head == ("SWPipeline(device=cpu, depth=3, tasks=['H2D', 'InputDistStart', 'InputDistWait', 'EmbLookup', "
                    "'ZeroGrad', 'WaitBatch', 'Forward', 'Backward', 'OptimizerStep'], shortcuts=[])")
    assert blank == ""
    assert "\n".join(table) == pipe.format_schedule(3)


def test_repr_of_a_serial_plan() -> None:
    text = repr(pipe_of(PipelinePlan({"H2DAndShuffle": TaskSchedule()})))
    assert text == "\n".join([
        "SWPipeline(device=cpu, depth=1, tasks=['H2DAndShuffle'], shortcuts=[])",
        "",
        "#  Task              Thread  Stream       | P0",
        "-- ----------------- ------- ------------ + -----",
        "0  H2DAndShuffle     default default      | i0",
    ])
