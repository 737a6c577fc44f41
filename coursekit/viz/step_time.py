"""Chapter 08's figures of where a step's time goes: a merged profiler trace of every rank, this machine's roofline
with the course's operations on it, and what each recomputation policy keeps against what it costs. They read measurements and draw; each returns
its figure.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

__all__ = ["draw_roofline", "draw_recompute", "draw_trace", "draw_waits"]


def draw_roofline(roofline, points: dict[str, tuple[float, float]]):
    """The roof ``min(peak, I × bandwidth)`` on log axes, and each measured op at (its intensity, its FLOP/s)."""
    fig, ax = plt.subplots(figsize=(7.2, 4.2))
    intensities = [i for i, _ in points.values()]
    low, high = min(intensities + [roofline.ridge]) / 4, max(intensities + [roofline.ridge]) * 4
    grid = np.geomspace(low, high, 200)
    ax.loglog(grid, [roofline.attainable(i) / 1e9 for i in grid], "k-", lw=2, label="the roof: min(peak, I × bandwidth)")
    ax.axvline(roofline.ridge, color="grey", ls=":", lw=1)
    ax.text(roofline.ridge, roofline.peak / 1e9 * 1.15, f"ridge {roofline.ridge:.1f} FLOP/B", ha="center", fontsize=8)
    for (name, (intensity, flops)), marker in zip(points.items(), "osD^v<>ph*"):
        bound = "compute" if intensity >= roofline.ridge else "memory"
        ax.loglog(intensity, flops / 1e9, marker, ms=7, label=f"{name} ({bound}-bound)")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("GFLOP/s, one core")
    ax.set_title("the roofline of this machine, one core, fp32", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def draw_recompute(rows):
    """Per policy: the bytes a layer keeps for backward (measured, the cost model's dashed), and the step's FLOPs."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.3))
    names = [r.variant for r in rows]
    x = np.arange(len(rows))
    left.bar(x, [r.saved_per_layer / 2**20 for r in rows], color="tab:blue", label="measured")
    left.scatter(x, [(r.model_per_layer + r.left_out) / 2**20 for r in rows], marker="_", s=600, color="black",
                 label="cost model + LayerNorm's statistics")
    left.set_ylabel("kept for backward, MiB per layer")
    left.legend(fontsize=7)
    right.bar(x, [r.flops / 1e9 for r in rows], color="tab:orange")
    right.set_ylabel("GFLOP per step (forward + backward)")
    for ax in (left, right):
        ax.set_xticks(x, names)
        ax.set_xlabel("recomputation")
    fig.suptitle("what a layer keeps, and what recomputing it costs", fontsize=10)
    fig.tight_layout()
    return fig


def draw_trace(trace: dict, windows: dict[int, list], flights: dict[int, list], step: tuple[float, float]):
    """Two rows per rank over ``step`` (µs, from the trace's zero): its main thread's backward windows and its
    gradient all-reduces from issue to end (:func:`coursekit.measure.trace_reading.backward_windows`,
    :func:`~coursekit.measure.trace_reading.gradient_all_reduces`), read from a merged trace."""
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.9 * len(windows)))
    start, end = step
    labels = []
    for row, rank in enumerate(sorted(windows)):
        y = 2 * (len(windows) - 1 - row)
        clip = lambda spans: [(max(a, start), min(b, end) - max(a, start)) for a, b in spans  # noqa: E731
                              if b > start and a < end]
        ax.broken_barh([(a - start, w) for a, w in clip(windows[rank])], (y + 1, 0.8), color="tab:blue",
                       label="backward (main thread)" if row == 0 else None)
        ax.broken_barh([(a - start, w) for a, w in clip([(i, e) for i, _, e in flights[rank]])], (y, 0.8),
                       color="tab:orange", alpha=0.8, label="gradient all-reduce, issue to end" if row == 0 else None)
        labels += [(y + 0.4, f"rank {rank}: all-reduce"), (y + 1.4, f"rank {rank}: backward")]
    ax.set_yticks([y for y, _ in labels], [name for _, name in labels])
    ax.set_xlabel("µs into the step")
    ax.set_xlim(0, end - start)
    ax.set_title("one training step, read from the merged profiler trace", fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def draw_waits(panels: list[tuple[str, dict[int, tuple[list, list]], tuple[float, float]]]):
    """One panel per ``(title, {rank: (computing, in_flight)}, (start, end))``: per rank, when its main thread
    computed and when gloo had its messages or collectives in flight (µs intervals of a merged trace,
    :func:`coursekit.measure.trace_reading.computing` and :func:`~coursekit.measure.trace_reading.in_flight`),
    over one step, drawn in ms; the white between the blue bars is the rank waiting."""
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.6 + 1.5 * len(panels)), squeeze=False)
    for ax, (title, ranks, (start, end)) in zip(axes[:, 0], panels):
        labels = []
        for row, rank in enumerate(sorted(ranks)):
            y = 2 * (len(ranks) - 1 - row)
            busy, flying = ranks[rank]
            clip = lambda spans: [((max(a, start) - start) / 1e3, (min(b, end) - max(a, start)) / 1e3)  # noqa: E731
                                  for a, b in spans if b > start and a < end]
            ax.broken_barh(clip(busy), (y + 1, 0.8), color="tab:blue", label="main thread computing" if row == 0 else None)
            ax.broken_barh(clip(flying), (y, 0.8), color="tab:orange", alpha=0.8,
                           label="gloo: in flight" if row == 0 else None)
            labels += [(y + 0.4, f"rank {rank}: gloo"), (y + 1.4, f"rank {rank}: main")]
        ax.set_yticks([y for y, _ in labels], [name for _, name in labels])
        ax.set_xlim(0, (end - start) / 1e3)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes[-1, 0].set_xlabel("ms into the step")
    fig.tight_layout()
    return fig
