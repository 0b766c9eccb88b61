"""Pictures (src/swpipeline/observe/charts.py): the Gantt chart of a timeline and the period table of a schedule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from engine_helpers import ExecLog, sparse_dist_plan
from swpipeline import DataFlowPipeline, EngineOverheads, PipelinePlan, SWPipeline, TaskSchedule, simulate
from swpipeline.observe.timeline import Timeline

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_png(path: Path, min_colors: int) -> tuple:
    """Assert ``path`` is a PNG with real content (many distinct colours); returns its (height, width)."""
    image = pytest.importorskip("matplotlib.image")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    pixels = image.imread(path)
    height, width = pixels.shape[:2]
    assert height > 100 and width > 300
    colors = {tuple(p) for p in pixels.reshape(-1, pixels.shape[2])[:: 7].round(3).tolist()}
    assert len(colors) >= min_colors, f"only {len(colors)} colours: the picture looks empty"
    return height, width


@pytest.mark.parametrize("engine", ["SWPipeline", "DataFlowPipeline"])
def test_gantt_chart_is_a_nontrivial_png(engine: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    plan = sparse_dist_plan(ExecLog())
    pipe = SWPipeline(plan, device="cpu") if engine == "SWPipeline" else DataFlowPipeline(plan, 3, device="cpu")
    pipe.run(range(12), trace=True)
    assert pipe.timeline is not None
    whole, window = tmp_path / "all.png", tmp_path / "deep" / "window.png"
    pipe.timeline.save_chart(whole)
    pipe.timeline.save_chart(window, iterations=(2, 5), title="iterations 2 to 5")
    height, _ = check_png(whole, min_colors=12)  # ten iteration colours, hatching, text
    assert check_png(window, min_colors=8)[0] == height  # rows: 3 threads + 3 streams either way


def test_gantt_chart_rejects_a_window_without_records(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu")
    pipe.run(range(3), trace=True)
    assert pipe.timeline is not None
    with pytest.raises(ValueError, match=r"iterations \(7, 9\): no recorded task ran on them"):
        pipe.timeline.save_chart(tmp_path / "x.png", iterations=(7, 9))
    with pytest.raises(ValueError, match="first 2 is after last 1"):
        pipe.timeline.save_chart(tmp_path / "x.png", iterations=(2, 1))


def test_schedule_picture_is_a_nontrivial_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu")
    pipe.enable_shortcut("ZeroGrad")  # drawn hatched grey
    path = tmp_path / "schedule.png"
    pipe.save_schedule_chart(path, 6)
    check_png(path, min_colors=8)
    with pytest.raises(ValueError, match="num_periods must be a positive int"):
        pipe.save_schedule_chart(tmp_path / "bad.png", 0)


def test_importing_swpipeline_does_not_import_matplotlib() -> None:
    code = "import sys, swpipeline; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_iterations_are_drawn_in_forty_distinct_styles_then_repeat() -> None:
    from swpipeline.observe.charts import iteration_style

    styles = [iteration_style(i) for i in range(80)]
    assert len(set(styles[:40])) == 40  # i0 and i10 share a colour but not a hatch
    assert styles[10] == (0, "..") and styles[0] == (0, "")
    assert styles[40:] == styles[:40]
    assert "////" not in {hatch for _, hatch in styles}  # the dependency wait's hatch stays unique


def test_legend_has_one_entry_per_drawn_style_naming_every_iteration_drawn_that_way() -> None:
    from swpipeline.observe.charts import legend_entries

    assert legend_entries(range(12)) == [(i, f"i{i}") for i in range(12)]  # no more cut at ten
    entries = legend_entries(range(3, 130))
    assert len(entries) == 40
    assert entries[0] == (3, "i3, i43, i83, …")
    assert entries[-1] == (42, "i42, i82, i122")


def test_gantt_chart_of_many_iterations_draws_hatched_runs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    pipe = SWPipeline(sparse_dist_plan(ExecLog()), device="cpu")
    pipe.run(range(25), trace=True)
    assert pipe.timeline is not None
    path = tmp_path / "many.png"
    pipe.timeline.save_chart(path)
    check_png(path, min_colors=12)


def simulated_timeline(iterations: int, lanes_plan: str = "two",
                       overheads: Optional[EngineOverheads] = None) -> Timeline:

    if lanes_plan == "two":
        plan = PipelinePlan({"Load": TaskSchedule(0, "io", "io"), "Fwd": TaskSchedule(1)}, [("Fwd", "Load")])
        return simulate(plan, {"Load": 0.002, "Fwd": 0.003}, iterations, data_seconds=0.025,
                        overheads=overheads).timeline()
    return simulate(PipelinePlan({"Fwd": TaskSchedule(0)}), {"Fwd": 0.003}, iterations).timeline()


def test_the_time_axis_starts_at_the_start_of_the_run() -> None:
    pytest.importorskip("matplotlib")
    from swpipeline.observe.charts import gantt_figure

    timeline = simulated_timeline(12, overheads=EngineOverheads.zero())
    first = min(min(r.ready, r.cpu_start) for r in timeline.records)
    assert first == 0.025  # the first batch took 25 ms to load: nothing ran before
    for window in (None, (0, 7)):
        ax = gantt_figure(timeline, iterations=window).axes[0]
        assert ax.get_xlim()[0] == 0.0
    later = gantt_figure(timeline, iterations=(5, 7)).axes[0]
    window_start = min(min(r.ready, r.cpu_start) for r in timeline.records if 5 <= r.iteration <= 7)
    assert later.get_xlim()[0] == window_start * 1e3  # a window of later iterations starts with them (in ms)


@pytest.mark.parametrize("iterations, lanes", [(20, "two"), (20, "one"), (45, "one")])
def test_the_legend_stays_within_the_plot_height_and_the_picture(iterations: int, lanes: str) -> None:
    pytest.importorskip("matplotlib")
    from swpipeline.observe.charts import gantt_figure

    figure = gantt_figure(simulated_timeline(iterations, lanes))
    ax = figure.axes[0]
    legend = ax.get_legend()
    assert len(legend.get_texts()) == min(iterations, 40) + 1  # one per drawn style, and the dependency wait
    box, plot, page = legend.get_window_extent(), ax.get_window_extent(), figure.bbox
    assert box.height <= plot.height + 1
    assert box.y1 <= page.y1 and box.y0 >= page.y0 and box.x1 <= page.x1
