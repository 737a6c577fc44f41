"""The m-sweep's figure (coursekit.viz.pipeline_sweep): each line where the sweep's numbers put it.

Each test names the bug planted by hand (in coursekit/viz/pipeline_sweep.py) to see it fail.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("agg")

import pytest  # noqa: E402

from coursekit.experiments import SweepResult  # noqa: E402
from coursekit.viz.pipeline_sweep import draw_sweep  # noqa: E402

MS = (1, 2, 4, 8)


def _result():
    rows = [{"m": m, "ideal": 2 * m / (m + 1), "bubble_formula": 1 / (m + 1), "bubble": 1 / (m + 1) + 0.05,
             "step": {"1f1b": 0.010 * m, "gpipe": 0.011 * m, "same_work": 0.012 * m, "whole_batch": 0.008}}
            for m in MS]
    return SweepResult(rows)


def _line(ax, gid):
    found = [line for line in ax.get_lines() if line.get_gid() == gid]
    assert found, f"no line {gid!r} in {[line.get_gid() for line in ax.get_lines()]}"
    return found[0]


def test_step_times_beside_both_baselines_and_bubble_beside_the_formula():
    """Planted bugs, seen failing: the ideal drawn as the same work times the speed-up instead of divided by it;
    the whole-batch baseline drawn from the same-work times; the bubble panel drawing the formula twice (measured
    y = formula)."""
    speed, bubble = draw_sweep(_result()).axes
    ideal = _line(speed, "ideal")
    assert list(ideal.get_xdata()) == list(MS)
    assert list(ideal.get_ydata()) == pytest.approx([12 * m / (2 * m / (m + 1)) for m in MS])  # ms: same work / p·m/(m+1)
    assert list(_line(speed, "1F1B").get_ydata()) == pytest.approx([10 * m for m in MS])
    assert list(_line(speed, "GPipe").get_ydata()) == pytest.approx([11 * m for m in MS])
    assert list(_line(speed, "one process, same micro-batches").get_ydata()) == pytest.approx([12 * m for m in MS])
    assert list(_line(speed, "one process, whole batch").get_ydata()) == pytest.approx([8] * len(MS))
    assert list(_line(bubble, "measured").get_ydata()) == pytest.approx([100 * (1 / (m + 1) + 0.05) for m in MS])
    assert list(_line(bubble, "formula").get_ydata()) == pytest.approx([100 / (m + 1) for m in MS])
