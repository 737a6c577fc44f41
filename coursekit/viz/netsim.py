"""Figures of the network model (:mod:`coursekit.netsim`): all-reduce time against G and against size.

Every function draws times it is given or asks :mod:`coursekit.netsim` for; none runs an algorithm.

    >>> from coursekit.netsim import Network
    >>> from coursekit.viz.netsim import draw_explorer
    >>> fig = draw_explorer(2**22, 1024, Network(50e9, 10e-6, 8, 450e9, 2e-6))   # the widget's picture
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from ..netsim import COLLECTIVES, Network, closed_form_time, crossover
from .collectives import size_label

COLOURS = {"naive": "#d1495b", "master": "#edae49", "ring": "#2e86ab", "hierarchical": "#3b8b5a"}
WORLD_SIZES = tuple(2 ** i for i in range(1, 11))            # 2 … 1,024
SIZES = tuple(2 ** i for i in range(12, 35, 2))              # 4 KiB … 16 GiB


def _seconds(value: float, _position=None) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if value >= scale:
            return f"{value / scale:g} {unit}"
    return f"{value * 1e9:g} ns"


def _names(network: Network) -> list[str]:
    """The hierarchical all-reduce needs nodes of k ≥ 2 GPUs; the others always apply."""
    return [n for n in COLLECTIVES if n != "hierarchical" or (network.gpus_per_node or 1) > 1]


def _fits(name: str, world_size: int, network: Network) -> bool:
    k = network.gpus_per_node
    return name != "hierarchical" or (k is not None and k > 1 and world_size % k == 0 and world_size > k)


def plot_time_against_g(nbytes: int, network: Network, ax=None, recorded: Mapping | None = None,
                        world_sizes=WORLD_SIZES, itemsize: int = 4, terms: bool = True, mark: int | None = None):
    """Modeled all-reduce time of ``nbytes`` against G (log-log): closed forms as lines, the model's
    replayed traces as dots (``recorded[name][G] = seconds``), the ring's latency and bandwidth
    terms dashed, ``mark`` a vertical line at one G."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4))
    numel = nbytes // itemsize
    dots_labelled = False
    for name in _names(network):
        gs = [g for g in world_sizes if _fits(name, g, network)]
        ax.plot(gs, [closed_form_time(name, g, numel, network, itemsize) for g in gs], "-", color=COLOURS[name],
                label=name)
        if recorded and recorded.get(name):
            points = sorted(recorded[name].items())
            ax.plot([g for g, _ in points], [t for _, t in points], "o", color=COLOURS[name], markersize=5,
                    label=None if dots_labelled else "dots: a recorded trace replayed")
            dots_labelled = True
    if terms:
        latency = replace(network, bandwidth=math.inf, intra_bandwidth=math.inf)
        bandwidth = replace(network, latency=0.0, intra_latency=0.0)
        # darker and on top: where one term is nearly the whole time its dashes still show on the ring's line
        ax.plot(world_sizes, [closed_form_time("ring", g, numel, latency, itemsize) for g in world_sizes], ":",
                color="#123c5a", linewidth=2, zorder=3, label="ring: latency term 2(G−1)·α")
        ax.plot(world_sizes, [closed_form_time("ring", g, numel, bandwidth, itemsize) for g in world_sizes], "--",
                color="#123c5a", linewidth=1.6, zorder=3, label="ring: bandwidth term")
    return _modeled_time_axes(ax, mark, list(world_sizes), lambda v, _p: f"{v:g}", "G (GPUs)",
                              f"all-reduce of {size_label(nbytes)}")


def plot_time_against_size(world_size: int, network: Network, ax=None, sizes=SIZES, itemsize: int = 4,
                           mark: int | None = None):
    """Modeled time against message size at one G (log-log), each algorithm's line; ``mark`` one size."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4))
    for name in _names(network):
        if _fits(name, world_size, network):
            ax.plot(sizes, [closed_form_time(name, world_size, max(world_size, s // itemsize), network, itemsize)
                            for s in sizes], "-", color=COLOURS[name], label=name)
    return _modeled_time_axes(ax, mark, list(sizes[::2]), size_label, "message size", f"G = {world_size}")


def _modeled_time_axes(ax, mark, xticks: list, xlabel_of, xlabel: str, title: str):
    """The two modeled-time plots' axes: log-log, ``mark`` as a grey line, seconds on y, a legend."""
    if mark:
        ax.axvline(mark, color="#777777", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xticks)
    ax.xaxis.set_major_formatter(FuncFormatter(xlabel_of))
    ax.yaxis.set_major_formatter(FuncFormatter(_seconds))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("modeled time")
    ax.set_title(title, fontsize=11)
    _plain_log_axes(ax)
    ax.legend(fontsize=8)
    return ax


def _plain_log_axes(ax) -> None:
    """No minor ticks (they cost most of the drawing time), a decade per major tick, a light grid."""
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_locator(LogLocator(base=10, numticks=12))
    ax.grid(alpha=0.3)


def summary(nbytes: int, world_size: int, network: Network, itemsize: int = 4) -> str:
    """One paragraph: each algorithm's time at this G and size, the fastest, and where it stops being so."""
    numel = max(world_size, nbytes // itemsize)
    times = {n: closed_form_time(n, world_size, numel, network, itemsize)
             for n in _names(network) if _fits(n, world_size, network)}
    best = min(times, key=times.get)
    parts = ", ".join(f"{n} {_seconds(t)}" for n, t in times.items())
    text = f"G = {world_size}, {size_label(nbytes)}: {parts}. Fastest: {best}."
    latency = replace(network, bandwidth=math.inf, intra_bandwidth=math.inf)
    ring_latency = closed_form_time("ring", world_size, numel, latency, itemsize)
    text += f" The ring's latency term alone is {_seconds(ring_latency)} ({ring_latency / times['ring']:.0%} of its time)."
    others = [n for n in times if n != best]
    unit = world_size * network.channels(world_size)      # crossover's sizes: multiples of it, up to 2^30
    for other in others:
        if closed_form_time(best, world_size, unit << 30, network, itemsize) > \
                closed_form_time(other, world_size, unit << 30, network, itemsize):
            # best only below some size (the hierarchical against the channelled ring): where the other wins
            at = crossover(other, best, world_size, network, itemsize)
            text += f" {other.capitalize()} beats {best} from {size_label(at * itemsize)} on."
            continue
        at = crossover(best, other, world_size, network, itemsize)
        if at is not None and at > unit:
            text += f" {best.capitalize()} beats {other} from {size_label(at * itemsize)} on."
    return text


def draw_explorer(nbytes: int, world_size: int, network: Network, fig: Figure | None = None,
                  recorded: Mapping | None = None, itemsize: int = 4) -> Figure:
    """The widget's picture: time against G at this size (left), against size at this G (right)."""
    if fig is None:
        fig = plt.figure(figsize=(12, 4.4))
    fig.clf()
    left, right = fig.subplots(1, 2)
    plot_time_against_g(nbytes, network, ax=left, recorded=recorded, mark=world_size, itemsize=itemsize)
    plot_time_against_size(world_size, network, ax=right, mark=nbytes, itemsize=itemsize)
    k = network.gpus_per_node
    level = f"{network.bandwidth * 8 / 1e9:g} Gb/s, α = {network.latency * 1e6:g} µs between nodes"
    inside = "" if not k or k == 1 else (f"; {k} GPUs per node, {network.level('intra')[0] / 1e9:g} GB/s, "
                                         f"α = {network.level('intra')[1] * 1e6:g} µs inside")
    fig.suptitle(f"Network model: {level}{inside}", fontsize=11)
    fig.subplots_adjust(left=0.07, right=0.985, bottom=0.13, top=0.86, wspace=0.22)
    return fig
