"""The m-sweep of :func:`coursekit.parallel.pipeline.pipeline_sweep` drawn against m: P7 in two panels.

    >>> result = pipeline_sweep([1, 2, 4, 8, 16])      # doctest: +SKIP
    >>> fig = draw_sweep(result)                       # doctest: +SKIP

Left: the step time of 1F1B and GPipe beside both baselines -- one process running the *same* micro-batches,
and one process on the whole batch -- and the ideal pipeline, the same work spread perfectly over p stages
with its bubble, the same-work time × (m + p − 1)/(p·m). Right: 1F1B's measured bubble beside the formula
(p − 1)/(m + p − 1). m on a log₂ axis: each point doubles it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .timeline import COLOURS

SERIES = (("1f1b", "1F1B", COLOURS["forward"], "o", "-"), ("gpipe", "GPipe", COLOURS["backward"], "s", "-"),
          ("same_work", "one process, same micro-batches", "0.35", "^", ":"),
          ("whole_batch", "one process, whole batch", "0.6", "v", ":"))


def draw_sweep(result, fig=None):
    """Two panels against m: step times beside both baselines and the ideal, measured vs planned bubble.

    Each line's ``gid`` is its label (``"1F1B"``, ``"GPipe"``, ``"one process, same micro-batches"``, ``"one
    process, whole batch"``, ``"ideal"``, ``"measured"``, ``"formula"``), so a test can find which is which.
    """
    rows, p = result.rows, result.p
    ms = [row["m"] for row in rows]
    if fig is None:
        fig = plt.figure(figsize=(11, 4.2))
    speed, bubble = fig.subplots(1, 2)
    for key, label, colour, marker, style in SERIES:
        speed.plot(ms, [1e3 * row["step"][key] for row in rows], style, marker=marker, color=colour, label=label,
                   gid=label)
    speed.plot(ms, [1e3 * row["step"]["same_work"] / row["ideal"] for row in rows], "k--",
               label=f"ideal pipeline of the same work, p = {p}", gid="ideal")
    speed.set(xscale="log", xlabel="micro-batches m", ylabel="ms a step (median)", ylim=(0, None),
              title=f"step time, p = {p} ranks against one process")
    bubble.plot(ms, [100 * row["bubble"] for row in rows], marker="o", color=COLOURS["forward"],
                label="measured (1F1B)", gid="measured")
    bubble.plot(ms, [100 * row["bubble_formula"] for row in rows], "k--", label="formula (p−1)/(m+p−1)",
                gid="formula")
    bubble.set(xscale="log", xlabel="micro-batches m", ylabel="bubble (% of p × step)", ylim=(0, None),
               title="idle share, measured and planned")
    for ax in (speed, bubble):
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.minorticks_off()
        ax.legend(loc="best", fontsize=9)
        ax.title.set_fontsize(11)
    fig.tight_layout()
    return fig
