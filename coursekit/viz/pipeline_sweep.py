"""The m-sweep of :func:`coursekit.parallel.pipeline.pipeline_sweep` drawn against m: P7 in two panels.

    >>> result = pipeline_sweep([1, 2, 4, 8, 16])      # doctest: +SKIP
    >>> fig = draw_sweep(result)                       # doctest: +SKIP

Left: the speed-up of 1F1B and GPipe over one process running the *same* micro-batches (median of the
paired ratios, the bars from the lowest to the highest), beside the ideal p·m/(m + p − 1). Right: 1F1B's
measured bubble beside the formula (p − 1)/(m + p − 1). m on a log₂ axis: each point doubles it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .timeline import COLOURS

SERIES = (("speedup_1f1b", "1F1B", COLOURS["forward"], "o"), ("speedup_gpipe", "GPipe", COLOURS["backward"], "s"))


def _errorbar(ax, ms, triples, label, colour, marker):
    medians = [t[0] for t in triples]
    below = [t[0] - t[1] for t in triples]
    above = [t[2] - t[0] for t in triples]
    container = ax.errorbar(ms, medians, yerr=[below, above], label=label, color=colour, marker=marker, capsize=3)
    container.lines[0].set_gid(label)  # the line through the medians
    return container


def draw_sweep(result, fig=None):
    """Two panels against m: speed-up vs the ideal, measured vs planned bubble. Returns the figure.

    Each line's ``gid`` is its label (``"1F1B"``, ``"GPipe"``, ``"ideal"``, ``"measured"``, ``"formula"``),
    so a test can find which is which.
    """
    rows, p = result.rows, result.p
    ms = [row["m"] for row in rows]
    if fig is None:
        fig = plt.figure(figsize=(10, 3.8))
    speed, bubble = fig.subplots(1, 2)
    for key, label, colour, marker in SERIES:
        _errorbar(speed, ms, [row[key] for row in rows], label, colour, marker)
    speed.plot(ms, [row["ideal"] for row in rows], "k--", label=f"ideal p·m/(m+p−1), p = {p}", gid="ideal")
    speed.axhline(1.0, color="grey", linewidth=0.8)
    speed.set(xscale="log", xlabel="micro-batches m", ylabel="speed-up (bars: lowest, highest)",
              title=f"p = {p} against one process, same micro-batches")
    bubble.plot(ms, [100 * row["bubble"] for row in rows], marker="o", color=COLOURS["forward"],
                label="measured (1F1B)", gid="measured")
    bubble.plot(ms, [100 * row["bubble_formula"] for row in rows], "k--", label="formula (p−1)/(m+p−1)",
                gid="formula")
    bubble.set(xscale="log", xlabel="micro-batches m", ylabel="bubble (% of p × window)", ylim=(0, None),
               title="idle share, measured and planned")
    for ax in (speed, bubble):
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.minorticks_off()
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig
