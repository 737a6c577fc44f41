"""Figures of planned pipeline schedules: every box where the plan puts it, the white area is the bubble.

Each test names the bug planted by hand (in coursekit/viz/pipeline.py) to see it fail.
"""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from coursekit.parallel.pipeline import gpipe, interleaved_1f1b, measured_bubble, one_f_one_b, plan, zb_h1  # noqa: E402
from coursekit.measure.trace import Span  # noqa: E402
from coursekit.viz.pipeline import draw_plan, draw_plan_and_measured, draw_plans  # noqa: E402

CASES = [gpipe(3, 4), one_f_one_b(4, 8), interleaved_1f1b(2, 4, 2), zb_h1(3, 5), one_f_one_b(1, 2)]


def boxes(ax) -> dict[str, Rectangle]:
    return {r.get_gid(): r for r in ax.patches if isinstance(r, Rectangle) and r.get_gid()}


@pytest.mark.parametrize("schedule", CASES, ids=lambda s: f"{s.name}-p{s.n_ranks}-m{s.n_micro_batches}")
def test_every_compute_action_is_a_box_where_the_plan_puts_it(schedule):
    """Boxes in full-stage units: the plan's times divided by v (a chunk is 1/v of a rank's layers).
    Planted bugs: only forwards drawn (the old strategy-map staircase): 'missing B0@s0 ...'; boxes at their
    index on the rank (``start = k``) instead of the planned start: 'B0@s0 at x=4 != 10'."""
    planned = plan(schedule)
    fig = draw_plan(planned)
    drawn = boxes(fig.axes[0])
    v = schedule.stages_per_rank
    want = {str(a): (rank, start / v, end / v) for rank, spans in enumerate(planned.spans) for a, start, end in spans}
    assert sorted(drawn) == sorted(want), f"missing {sorted(set(want) - set(drawn))[:3]}"
    for name, (rank, start, end) in want.items():
        box = drawn[name]
        assert box.get_x() == pytest.approx(float(start)), f"{name} at x={box.get_x()} != {start}"
        assert box.get_width() == pytest.approx(float(end - start)), name
        assert schedule.n_ranks - 1 - rank < box.get_y() < schedule.n_ranks - rank, f"{name} not on rank {rank}'s row"
    plt.close(fig)


def test_white_area_is_the_bubble_of_the_formula():
    """1F1B p=4, m=8: (p−1)/(m+p−1) = 3/11 of the area is white, read off the boxes. Planted bug: every box one
    unit wide (B drawn as long as F): '0.5 != 0.2727'."""
    fig = draw_plan(plan(one_f_one_b(4, 8)))
    ax = fig.axes[0]
    width = sum(b.get_width() for b in boxes(ax).values())
    right = max(b.get_x() + b.get_width() for b in boxes(ax).values())
    assert 1 - width / (4 * right) == pytest.approx(3 / 11)
    assert "bubble 27.3% (= the formula)" in ax.get_title()
    plt.close(fig)


def test_each_rank_says_its_peak():
    """1F1B p=3, m=4: peaks 3, 2, 1 (min(p−r, m)); ZB-H1 also says what it holds until W (3 on every rank).
    Planted bug: the label reads peak_activations[0] for every rank: ['peak 3', 'peak 3', 'peak 3']."""
    fig = draw_plan(plan(one_f_one_b(3, 4)))
    texts = [t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("peak")]
    assert texts == ["peak 3", "peak 2", "peak 1"]
    fig2 = draw_plan(plan(zb_h1(3, 4)))
    texts = [t.get_text() for t in fig2.axes[0].texts if t.get_text().startswith("peak")]
    assert texts == ["peak 3", "peak 2\n(3 until W)", "peak 1\n(3 until W)"]
    plt.close(fig), plt.close(fig2)


def test_plan_above_the_measured_run():
    """Two ranks, hand-made spans: length 4 ms, compute 2 + 3 ms -> bubble 1 − 5/8. Planted bug: measured bubble
    divided by the step length only (not ranks × length): '-0.25 != 0.375'."""
    spans = [Span(0, "forward", "F0@s0", 0.000, 0.001), Span(0, "backward", "B0@s0", 0.003, 0.004),
             Span(1, "forward", "F0@s1", 0.001, 0.002), Span(1, "backward", "B0@s1", 0.002, 0.004),
             Span(1, "idle", "RECV_F0@s1", 0.000, 0.001)]
    assert measured_bubble(spans).bubble == pytest.approx(1 - 5 / 8)
    fig = draw_plan_and_measured(plan(one_f_one_b(2, 1)), spans, title="1f1b on 2 ranks")
    top, bottom = fig.axes[:2]
    assert sorted(boxes(top)) == ["B0@s0", "B0@s1", "F0@s0", "F0@s1"]
    assert "bubble 37.5%" in bottom.get_title() and "1f1b on 2 ranks" in bottom.get_title()
    assert top.get_title().startswith("planned: 1f1b, p = 2, m = 1")
    plt.close(fig)


def test_describe_gives_bubble_and_peaks_per_rank():
    """1F1B p=4, m=8: 3/11 = 27.3%, peaks 4, 3, 2, 1; ZB-H1 p=3, m=4: until B 3, 2, 1, until W 3 on every rank.
    Planted bug: the peaks read from peak_in_flight (the same for 1F1B; ZB-H1 says '3, 3, 3' twice)."""
    from coursekit.widgets.pipeline import describe

    text = describe("1f1b", 4, 8)
    assert "Bubble 27.3% of the GPU time (formula 27.3%)" in text
    assert "rank 0: 4, rank 1: 3, rank 2: 2, rank 3: 1." in text
    text = describe("zb_h1", 3, 4)
    assert "rank 0: 3, rank 1: 2, rank 2: 1. Until W: rank 0: 3, rank 1: 3, rank 2: 3." in text
    assert describe("zb_h1", 4, 2).startswith("Not available: ZB-H1 needs m >= p")


def test_explorer_draws_its_default_state_and_redraws(monkeypatch):
    """Planted bugs: no ``redraw()`` at construction ('0 == 1'); the dropdown not observed ('1 == 2')."""
    import coursekit.widgets.pipeline as explorer

    drawn = []
    real = explorer.draw_plan
    monkeypatch.setattr(explorer, "draw_plan", lambda planned, **k: drawn.append(planned) or real(planned, **k))
    box = explorer.schedule_explorer()
    assert len(drawn) == 1 and drawn[0].schedule.name == "1f1b"  # drawn at once, without waiting for an event
    names, chunks = box.children[0].children
    ranks, micro = box.children[1].children
    sentence = box.children[2]
    assert chunks.disabled  # v only means something for interleaved
    names.value = "interleaved"
    assert len(drawn) == 2 and drawn[-1].schedule.stages_per_rank == 2 and not chunks.disabled
    assert "formula 15.8%" in sentence.value  # 3/(2*8+3)
    names.value = "zb_h1"
    micro.value = 2
    assert len(drawn) == 3 and sentence.value.startswith("Not available")  # no chart for m < p
    ranks.value = 2
    assert len(drawn) == 4 and drawn[-1].schedule.n_ranks == 2 and "formula 14.3%" in sentence.value  # 1/(1+6)


def drawn_length(ax) -> float:
    return max(b.get_x() + b.get_width() for b in boxes(ax).values())


def test_interleaved_is_drawn_shorter_than_1f1b_on_one_axis():
    """p = 4, m = 8: 1F1B lasts (m + p − 1)·3 = 33 full-stage units; interleaved (v = 2) runs v·m chunk actions
    of 3/v units each on the busiest rank plus a bubble of (p − 1)·3/v: (v·m + p − 1)·3/v = 28.5 -- shorter, and
    drawn shorter on the shared axis. Planted bug seen failing: the interleaved plan drawn in chunk units
    (no division by v): 'interleaved drawn 57.0 long, 1F1B 33.0'."""
    p, m, v = 4, 8, 2
    fig = draw_plans([plan(one_f_one_b(p, m)), plan(interleaved_1f1b(p, m, v))])
    first, second = fig.axes[:2]
    assert drawn_length(first) == pytest.approx((m + p - 1) * 3)
    assert drawn_length(second) == pytest.approx((v * m + p - 1) * 3 / v), \
        f"interleaved drawn {drawn_length(second)} long, 1F1B {drawn_length(first)}"
    assert drawn_length(second) < drawn_length(first)
    assert first.get_xlim() == second.get_xlim(), "not one time axis"
    plt.close(fig)


def colours(patches) -> set:
    return {tuple(round(c, 3) for c in p.get_facecolor()) for p in patches}


def legend_colours(ax) -> set:
    handles = ax.get_legend().legend_handles
    return colours(h for h in handles if h.get_label() != "empty = bubble")


@pytest.mark.parametrize("schedule", CASES[:4], ids=lambda s: s.name)
def test_the_legend_names_every_colour_drawn_and_no_other(schedule):
    """W (ZB-H1), the second chunk's paler shade (interleaved) and B: one legend entry per colour the boxes use.
    Planted bugs seen failing: the legend built from the ops only (no entry for the second chunk's shade):
    'drawn but not in the legend: {(0.298, 0.447, 0.69, 0.55), ...}'."""
    fig = draw_plan(plan(schedule))
    ax = fig.axes[0]
    drawn, named = colours(boxes(ax).values()), legend_colours(ax)
    assert drawn == named, f"drawn but not in the legend: {drawn - named}; in the legend, not drawn: {named - drawn}"
    plt.close(fig)


def test_one_legend_for_all_panels_covers_every_colour():
    """Four schedules stacked: exactly one legend, naming the union of the panels' colours (F, B, W, both
    chunks' shades). Planted bug seen failing: the legend of the first panel's plan only (GPipe): 3 colours
    missing."""
    fig = draw_plans([plan(gpipe(4, 8)), plan(one_f_one_b(4, 8)), plan(interleaved_1f1b(4, 8, 2)), plan(zb_h1(4, 8))])
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) == 1
    drawn = set().union(*(colours(boxes(ax).values()) for ax in fig.axes))
    named = legend_colours(next(ax for ax in fig.axes if ax.get_legend() is not None))
    assert drawn == named, f"missing {len(drawn - named)} colours: {drawn - named}"
    plt.close(fig)


def test_the_stacked_legend_has_one_entry_per_colour_and_every_label_is_legible():
    """The four schedules stacked: GPipe's "forward (F)" and interleaved's "forward (F), chunk 1" are one colour,
    so one entry; B and ZB-H1's "input gradient (B)" share one too. And no text under 8 pt, legend included.
    Planted bugs, seen failing: the entries concatenated without merging (two entries share a colour); the boxes'
    micro-batch numbers back at 6 pt."""
    fig = draw_plans([plan(gpipe(4, 8)), plan(one_f_one_b(4, 8)), plan(interleaved_1f1b(4, 8, 2)), plan(zb_h1(4, 8))])
    legend = next(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)
    shades = [colours([h]).pop() for h in legend.legend_handles]
    assert len(shades) == len(set(shades)), [t.get_text() for t in legend.get_texts()]
    labels = [t.get_text() for t in legend.get_texts()]
    assert "backward (B) / input gradient (B)" in labels and "forward (F)" in labels, labels
    small = sorted({(t.get_fontsize(), t.get_text()[:20]) for t in fig.findobj(matplotlib.text.Text)
                    if t.get_text() and t.get_fontsize() < 8})
    assert not small, f"text under 8 pt: {small[:5]}"
    plt.close(fig)


def test_the_plan_above_a_measured_run_has_its_own_legend():
    """Planted bug seen failing: the plan panel drawn with ``legend=False`` (as before): 'no legend on the plan'."""
    spans = [Span(0, "forward", "F0@s0", 0.000, 0.001), Span(0, "backward", "B0@s0", 0.003, 0.004),
             Span(1, "forward", "F0@s1", 0.001, 0.002), Span(1, "backward", "B0@s1", 0.002, 0.004)]
    fig = draw_plan_and_measured(plan(one_f_one_b(2, 1)), spans)
    top = fig.axes[0]
    assert top.get_legend() is not None, "no legend on the plan"
    assert colours(boxes(top).values()) == legend_colours(top)
    plt.close(fig)


@pytest.mark.parametrize("schedule", CASES, ids=lambda s: f"{s.name}-p{s.n_ranks}")
def test_the_title_says_each_number_once(schedule):
    """Planted bug seen failing: the formula appended even when equal to the plan:
    '1f1b: p = 4, m = 8 — bubble 27.3% (formula 27.3%)' says 27.3% twice."""
    fig = draw_plan(plan(schedule), title=f"{schedule.name}, p = {schedule.n_ranks}")
    title = fig.axes[0].get_title()
    numbers = re.findall(r"\d+(?:\.\d+)?%?", title)
    percentages = [n for n in numbers if n.endswith("%")]
    assert len(percentages) == len(set(percentages)) == 1, title
    plt.close(fig)


@pytest.mark.parametrize("schedule", [one_f_one_b(2, 4), zb_h1(3, 5), interleaved_1f1b(2, 4, 2)], ids=lambda s: s.name)
def test_the_legend_covers_neither_the_axis_label_nor_a_box(schedule):
    """Rendered: the legend's box does not overlap the x-axis label's nor the axes' (exercise 04's legend sat on
    its x label). Planted bug seen failing: the legend back under the axes at bbox_to_anchor=(0.5, -0.3):
    'legend overlaps the x-axis label'."""
    fig = draw_plan(plan(schedule))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(renderer)
    assert not legend.overlaps(ax.xaxis.label.get_window_extent(renderer)), "legend overlaps the x-axis label"
    assert not legend.overlaps(ax.get_window_extent(renderer)), "legend overlaps the chart"
    plt.close(fig)
