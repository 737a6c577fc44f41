"""Gantt charts of measured timelines: one row per rank, compute and communication on separate lanes.

    >>> from coursekit.viz.timeline import draw_timeline
    >>> fig = draw_timeline(spans, title="bucketed, overlapped")       # spans from Tracer.gather()

Communication runs on gloo's threads *while* the rank computes, so each rank
gets two lanes: its own work (forward, backward, a zero-bubble pipeline's weight
gradient W, optimiser, idle waits) on top, communication (issued -> completed)
just below. Where a comm bar sits under a backward bar, communication is hidden; where it sits under "idle",
the rank waits for it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ..measure.trace import KINDS, Span, hidden_fraction

COLOURS = {"forward": "#4C72B0", "backward": "#55A868", "weight": "#C44E52", "comm": "#DD8452",
           "optimizer": "#8172B3", "idle": "#DDDDDD"}


def draw_timeline(spans: list[Span], ax=None, title: str | None = None, start: float | None = None,
                  end: float | None = None, scale: float = 1e3, hidden_share: bool = True):
    """Draw ``spans`` (from :meth:`coursekit.measure.trace.Tracer.gather`); times shown in ms by default.

    ``start``/``end`` (seconds) crop the view, e.g. to the last steps. The title adds the share of
    communication hidden behind backward; ``hidden_share=False`` leaves it out where it means nothing
    (a chain whose only communication is the wait itself). Returns the figure.
    """
    ranks = sorted({s.rank for s in spans})
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 0.9 + 0.9 * len(ranks)))
    else:
        fig = ax.figure
    lo = min((s.start for s in spans), default=0.0) if start is None else start
    hi = max((s.end for s in spans), default=1.0) if end is None else end
    for row, rank in enumerate(ranks):
        y = (len(ranks) - 1 - row) * 1.0
        for s in spans:
            if s.rank != rank or s.end < lo or s.start > hi:
                continue
            lane = y + (0.05 if s.kind == "comm" else 0.45)
            ax.broken_barh([((s.start - lo) * scale, max(s.duration * scale, 0.02))], (lane, 0.38),
                           facecolors=COLOURS[s.kind], edgecolor="white", linewidth=0.3)
    ax.set_yticks([(len(ranks) - 1 - row) + 0.5 for row in range(len(ranks))])
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.set_xlim(0, (hi - lo) * scale)
    ax.set_ylim(-0.1, len(ranks))
    ax.set_xlabel("time (ms)" if scale == 1e3 else "time")
    fraction = hidden_fraction([s for s in spans if lo <= s.start <= hi])
    label = title or "timeline"
    if hidden_share and fraction == fraction:  # not NaN
        label += f"  —  {fraction:.0%} of communication hidden behind backward"
    ax.set_title(label, fontsize=10)
    drawn = {s.kind for s in spans}  # "weight" only where there is a W (zero bubble); the others always
    kinds = [k for k in KINDS if k != "weight" or k in drawn]
    ax.legend(handles=[Patch(color=COLOURS[k], label=k) for k in kinds], ncol=len(kinds), fontsize=8,
              loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(ranks) < 3 else -0.2), frameon=False)
    fig.tight_layout()
    return fig


def draw_timelines(named: dict[str, list[Span]], **kwargs):
    """Several timelines stacked on one shared time axis (e.g. naive vs overlapped)."""
    ranks = max(len({s.rank for s in spans}) for spans in named.values())
    fig, axes = plt.subplots(len(named), 1, figsize=(10, (1.3 + 0.8 * ranks) * len(named)), sharex=True)
    axes = [axes] if len(named) == 1 else list(axes)
    longest = max(max(s.end for s in spans) - min(s.start for s in spans) for spans in named.values())
    for ax, (name, spans) in zip(axes, named.items()):
        lo = min(s.start for s in spans)
        draw_timeline(spans, ax=ax, title=name, start=lo, end=lo + longest, **kwargs)
    for ax in axes[:-1]:
        legend = ax.get_legend()
        if legend is not None:
            legend.remove()
        ax.set_xlabel("")
    fig.tight_layout()
    return fig
