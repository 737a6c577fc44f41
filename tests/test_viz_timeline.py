"""The Gantt chart draws what it is given: one bar per span, lanes per rank."""

import matplotlib

matplotlib.use("agg")

from coursekit.measure.trace import Span
from coursekit.viz.timeline import COLOURS, draw_timeline, draw_timelines

SPANS = [Span(0, "forward", "", 0.000, 0.010), Span(0, "backward", "", 0.010, 0.030),
         Span(0, "comm", "bucket 0", 0.015, 0.025), Span(0, "optimizer", "", 0.030, 0.032),
         Span(1, "forward", "", 0.001, 0.011), Span(1, "backward", "", 0.011, 0.031),
         Span(1, "comm", "bucket 0", 0.031, 0.040), Span(1, "idle", "wait", 0.031, 0.040)]


def test_one_bar_per_span_and_a_row_per_rank():
    fig = draw_timeline(SPANS, title="test")
    ax = fig.axes[0]
    assert len(ax.collections) == len(SPANS)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    # rank 0 hides 10 of 10 ms, rank 1 none: 50% on average, written in the title
    assert "50% of communication hidden" in ax.get_title()
    colours = {tuple(c.get_facecolor()[0][:3]) for c in ax.collections}
    assert len(colours) == len({s.kind for s in SPANS}) <= len(COLOURS)


def test_stacked_timelines_share_the_time_axis():
    fig = draw_timelines({"a": SPANS, "b": [s for s in SPANS if s.rank == 0]})
    assert len(fig.axes) == 2
    assert fig.axes[0].get_xlim() == fig.axes[1].get_xlim()


def test_hidden_share_can_be_left_out_of_the_title_where_it_means_nothing():
    """Chapter 03's chain has no communication to hide: its title must not claim "0% hidden". Planted bug (seen
    failing): the option not passed on by draw_timelines (the suffix is back on the stacked chart)."""
    assert draw_timeline(SPANS, title="chain", hidden_share=False).axes[0].get_title() == "chain"
    fig = draw_timelines({"chain": SPANS}, hidden_share=False)
    assert fig.axes[0].get_title() == "chain"


def test_every_kind_has_a_colour_and_w_is_drawn_as_in_the_plan():
    """Every span kind is coloured and in the legend; W (kind ``weight``) in the plan figures' W colour, and in the
    legend only where a W is drawn (the other chapters' timelines have none).

    Planted bugs, seen failing: no colour for ``weight`` (``KeyError: 'weight'`` drawing a W span); ``weight``
    always in the legend (in the timeline without W)."""
    from coursekit.measure.trace import KINDS
    from coursekit.viz.pipeline import OP_COLOURS

    assert set(COLOURS) == set(KINDS)
    assert COLOURS["weight"] == OP_COLOURS["W"]
    fig = draw_timeline(SPANS + [Span(0, "weight", "W0@s0", 0.032, 0.040)])
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == list(KINDS)
    without = draw_timeline(SPANS)
    assert [t.get_text() for t in without.axes[0].get_legend().get_texts()] == [k for k in KINDS if k != "weight"]
