"""Figures for chapter 01: a ring step, traffic against its formula, per-rank load, timings.

Every function draws what it is given (a recorded or simulated run); none runs an algorithm.

    >>> from coursekit.collectives import ring_walkthrough
    >>> from coursekit.viz.collectives import draw_ring_step
    >>> fig = draw_ring_step(ring_walkthrough(4), 1)      # after iteration 1 of reduce-scatter
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator

PHASE_COLOURS = {"reduce-scatter": "#d1495b", "all-gather": "#2e86ab"}


def _short(terms: tuple, world_size: int) -> str:
    """The seed's sum, written out (a₁+b₁+c₁ …, R5) at every G: four terms per line, never Σ."""
    lines = ["+".join(terms[i:i + 4]) for i in range(0, len(terms), 4)]
    return "+\n".join(lines)


def ring_figsize(world_size: int) -> tuple[float, float]:
    """Inches for :func:`draw_ring_step`: room for two lines of the seed's sums in every cell."""
    return 1.6 * world_size + 2.2, 0.8 * world_size + 1.6


def draw_ring_step(steps: list, index: int, fig: Figure | None = None) -> Figure:
    """Each GPU's segments after step ``index`` (0 = before the first step) and that step's transfers.

    ``steps`` is :func:`coursekit.collectives.ring_walkthrough` (or ``replay`` of a real run).
    A cell's shade says how many GPUs' values it already sums; arrows are the transfers of the step.
    """
    world_size = len(steps[0].state)
    index = max(0, min(index, len(steps)))
    if index == 0:
        state = [[(chr(ord("a") + r) + _sub(k),) for k in range(world_size)] for r in range(world_size)]
        current = None
    else:
        current = steps[index - 1]
        state = current.state
    if fig is None:
        fig = plt.figure(figsize=ring_figsize(world_size))
    fig.clf()
    ax = fig.add_axes([0.1, 0.04, 0.86, 0.78])
    cmap = plt.get_cmap("YlOrRd")
    received = {(t[1], t[2]) for t in current.sends} if current else set()
    for r in range(world_size):
        y = world_size - 1 - r
        ax.text(-0.15, y + 0.5, f"GPU{r + 1}", ha="right", va="center", fontsize=13, weight="bold")
        for k in range(world_size):
            terms = state[r][k]
            shade = cmap(0.12 + 0.7 * (len(terms) - 1) / max(1, world_size - 1))
            edge = PHASE_COLOURS.get(current.phase, "k") if (r, k) in received else "#555555"
            ax.add_patch(Rectangle((k + 0.04, y + 0.08), 0.92, 0.84, facecolor=shade, edgecolor=edge,
                                   linewidth=2.5 if (r, k) in received else 0.8))
            dark = len(terms) > 0.6 * world_size and world_size > 2
            ax.text(k + 0.5, y + 0.5, _short(terms, world_size), ha="center", va="center",
                    fontsize=13 if world_size <= 4 else 11, color="white" if dark else "black", linespacing=1.1)
    if current:
        colour = PHASE_COLOURS.get(current.phase, "k")
        for src, dst, k, _ in current.sends:
            y0, y1 = world_size - 1 - src + 0.5, world_size - 1 - dst + 0.5
            wrap = dst < src  # the ring closes: last GPU back to the first
            x = k + (0.82 if not wrap else 0.18)
            ax.add_patch(FancyArrowPatch((x, y0), (x, y1), arrowstyle="-|>", mutation_scale=14, color=colour,
                                         linewidth=1.8, connectionstyle="arc3,rad=-0.35" if wrap else "arc3,rad=0",
                                         shrinkA=6, shrinkB=6, zorder=3))
    for k in range(world_size):
        ax.text(k + 0.5, world_size + 0.05, f"segment {k + 1}", ha="center", va="bottom", fontsize=11, color="#444444")
    ax.set_xlim(-0.05, world_size + 0.05)
    ax.set_ylim(-0.05, world_size + 0.4)
    ax.axis("off")
    total = len(steps)
    if current is None:
        title = f"G = {world_size}: before the ring starts (each GPU holds only its own gradients)"
    else:
        part = "phase 1, reduce-scatter (share-reduce)" if current.phase == "reduce-scatter" \
            else "phase 2, all-gather (share-only)"
        title = f"G = {world_size}, step {index}/{total}: {part}, iteration {current.step + 1}"
    fig.suptitle(title, fontsize=13, y=0.97)
    return fig


def _sub(k: int) -> str:
    return str(k + 1).translate(str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉"))


def plot_traffic(rows: list[dict], ax=None):
    """Elements moved against G (one line per algorithm): measured points over their formulas.

    ``rows``: dicts with ``algorithm``, ``G``, ``N``, ``measured``, ``formula``.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    colours = {"naive": "#d1495b", "master": "#edae49", "ring": "#2e86ab"}
    # master and ring move the same total: draw the master dashed with hollow markers so neither hides
    styles = {"naive": ("-", "o", 6), "master": ("--", "s", 9), "ring": ("-", "o", 5)}
    for name in colours:
        mine = sorted((r for r in rows if r["algorithm"] == name), key=lambda r: r["G"])
        if not mine:
            continue
        line, marker, size = styles[name]
        label = f"{name}{' (= ring)' if name == 'master' else ''}"
        ax.plot([r["G"] for r in mine], [r["formula"] for r in mine], line, color=colours[name], alpha=0.6,
                label=f"{label}: formula")
        ax.plot([r["G"] for r in mine], [r["measured"] for r in mine], marker, color=colours[name],
                markersize=size, markerfacecolor="none" if name == "master" else colours[name],
                label=f"{label}: counted")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # G is a whole number of GPUs
    ax.set_xlabel("G (GPUs)")
    ax.set_ylabel(f"elements moved (N = {rows[0]['N']})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


def plot_rank_load(loads: dict[str, dict[int, int]], ax=None):
    """Bars: elements each rank sent + received, per algorithm (the master's spike, the ring's flat line)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.4))
    names = list(loads)
    width = 0.8 / len(names)
    colours = {"naive": "#d1495b", "master": "#edae49", "ring": "#2e86ab"}
    for i, name in enumerate(names):
        ranks = sorted(loads[name])
        ax.bar([r + (i - (len(names) - 1) / 2) * width for r in ranks], [loads[name][r] for r in ranks],
               width=width, label=name, color=colours.get(name))
    ax.set_xlabel("rank")
    ax.set_ylabel("elements sent + received")
    ax.set_xticks(sorted(next(iter(loads.values()))))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over them
    ax.grid(alpha=0.3, axis="y")
    return ax


def plot_timings(rows: list[dict], fits: dict[str, tuple[float, float]] | None = None, ax=None):
    """Median time against message size (log-log) per algorithm, with fitted ``α + β·bytes`` lines."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4))
    colours = {"naive": "#d1495b", "master": "#edae49", "ring": "#2e86ab", "torch": "#333333"}
    for name, colour in colours.items():
        mine = sorted((r for r in rows if r["algorithm"] == name), key=lambda r: r["bytes"])
        if not mine:
            continue
        sizes = [r["bytes"] for r in mine]
        ax.plot(sizes, [r["seconds"] * 1e3 for r in mine], "o", color=colour, label=name)
        if fits and name in fits:
            alpha, beta = fits[name]
            ax.plot(sizes, [(alpha + beta * b) * 1e3 for b in sizes], "-", color=colour, alpha=0.6,
                    label=f"{name}: fitted α + β·bytes")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(size_label))
    for axis_ticks in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis_ticks(FuncFormatter(lambda value, _position: f"{value:g}"))  # 3, 10, 30 ms, not 3×10⁰
    ax.set_xlabel("message size")
    ax.set_ylabel("median time (ms)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return ax


def size_label(value: float, _position=None) -> str:
    """Axis label for a byte count: 4 KiB, 1 MiB, … (powers of two, as the sizes are)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:g} {unit}"
    return f"{value:g} B"
