"""The measured bubble has the plan's definition: idle share of p × (first compute action -> last one), with
the step's tail (optimizer, end-of-step synchronisation) reported apart, not counted as bubble.

Each test names the bug planted by hand (in coursekit/parallel/pipeline/measured.py) to see it fail.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from coursekit.parallel.pipeline import bubble_formula, measured_bubble, one_f_one_b, plan  # noqa: E402
from coursekit.measure.trace import Span  # noqa: E402
from coursekit.viz.pipeline import draw_plan_and_measured  # noqa: E402

MS = 1e-3


def one_f_one_b_step(early_receive: bool = False) -> list[Span]:
    """1F1B on 2 ranks, m = 1, F = 1 ms and B = 2 ms, then the end of the step; built by hand.

    rank 0: F0 [0, 1], waits for the gradient [1, 4], B0 [4, 6]; tied gradients summed [6, 7], optimizer [7, 8].
    rank 1: waits for the activation [0, 1], F0 [1, 2], B0 [2, 4]; waits for rank 0's tied gradient [4, 7]
    (it sends at 6; the loop's sync ends together), optimizer [7, 7.5].
    Compute: 1 + 2 on each rank = 6 ms in 2 ranks × 6 ms (0 to 6): bubble 1 − 6/12 = 1/2, the formula's
    (p−1)/(m+p−1) = 1/2. The tail: 8 − 6 = 2 ms of an 8 ms step, a quarter.
    """
    recv_start = -0.5 if early_receive else 0.0  # rank 1 came early from the step before
    rank0 = [Span(0, "forward", "F0@s0", 0, 1), Span(0, "comm", "SEND_F0@s0", 1, 1),
             Span(0, "comm", "RECV_B0@s0", 1, 4), Span(0, "idle", "RECV_B0@s0", 1, 4),
             Span(0, "backward", "B0@s0", 4, 6), Span(0, "idle", "tied gradients", 6, 7),
             Span(0, "optimizer", "step", 7, 8)]
    rank1 = [Span(1, "comm", "RECV_F0@s1", recv_start, 1), Span(1, "idle", "RECV_F0@s1", recv_start, 1),
             Span(1, "forward", "F0@s1", 1, 2), Span(1, "backward", "B0@s1", 2, 4),
             Span(1, "comm", "SEND_B0@s1", 4, 4), Span(1, "idle", "tied gradients", 4, 7),
             Span(1, "optimizer", "step", 7, 7.5)]
    return [Span(s.rank, s.kind, s.name, s.start * MS, s.end * MS) for s in rank0 + rank1]


def test_the_bubble_is_measured_over_the_schedules_actions_and_the_tail_apart():
    """Planted bugs seen failing: the old window, first span to last (the optimizer step included): 'bubble 0.625,
    by hand 0.5'; a window per rank (each rank's own first to last compute): 'bubble 0.333, by hand 0.5'."""
    result = measured_bubble(one_f_one_b_step())
    assert float(bubble_formula("1f1b", 2, 1)) == 0.5  # the hand count above is the formula's
    assert result.bubble == pytest.approx(0.5), (
        f"bubble {result.bubble:.3f}, by hand 0.5: 6 ms of compute in 2 ranks × 6 ms, the first forward's start "
        f"to the last backward's end on any rank; the optimizer and the sync after it are the tail, not bubble")
    assert (result.start, result.end) == (pytest.approx(0.0), pytest.approx(6 * MS)), (result.start, result.end)
    assert result.tail == pytest.approx(2 * MS), f"tail {result.tail * 1e3:.2f} ms, by hand 2 ms (6 -> 8 ms)"
    assert result.tail_share == pytest.approx(0.25), f"tail share {result.tail_share:.3f}, by hand 2/8"
    assert result.ranks == 2


def test_a_wait_posted_before_anything_computes_is_not_the_pipelines_bubble():
    """The plan's clock starts at the first forward: a receive rank 1 posted 0.5 ms earlier (it finished the step
    before sooner) changes nothing. Planted bug seen failing: the window from the first action of any kind
    (receives too): 'bubble 0.538, by hand 0.5'."""
    result = measured_bubble(one_f_one_b_step(early_receive=True))
    assert result.bubble == pytest.approx(0.5), f"bubble {result.bubble:.3f}, by hand 0.5"
    assert result.window == pytest.approx(6 * MS)


def test_a_step_with_no_compute_has_no_bubble_to_measure():
    result = measured_bubble([Span(0, "optimizer", "step", 0.0, 1.0)])
    assert result.bubble != result.bubble and result.tail == 0.0  # NaN: nothing to measure, not 0 % or 100 %


def test_the_figure_says_bubble_and_tail_and_marks_where_the_actions_end():
    """Planted bugs seen failing: the timeline's own title kept ('of communication hidden behind backward' in it);
    the dashed line drawn at the step's end: 'dashed line at [8.0] ms; the last action ends at 6 ms'."""
    spans = one_f_one_b_step()
    fig = draw_plan_and_measured(plan(one_f_one_b(2, 1)), spans, title="1f1b on 2 ranks")
    bottom = fig.axes[1]
    title = bottom.get_title()
    assert "bubble 50.0%" in title and "tail 25.0% of the step" in title, title
    assert "hidden behind backward" not in title, title
    lines = [line.get_xdata()[0] for line in bottom.get_lines() if line.get_linestyle() == "--"]
    assert lines == [pytest.approx(6.0)], f"dashed line at {lines} ms; the last action ends at 6 ms"
    plt.close(fig)
