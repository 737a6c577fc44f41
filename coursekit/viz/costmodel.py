"""Chapter 08's calculator drawn: memory per GPU and step time for the planner's ranked layouts.

Two stacked-bar charts over the same layouts, side by side, read from :mod:`coursekit.costmodel` (this module
computes nothing of its own):

* :func:`draw_memory_per_gpu` -- parameters, gradients, optimizer state, activations and buffers (ZeRO-3's
  gathered layer) on the most loaded GPU of each layout (:func:`coursekit.costmodel.memory_per_gpu`), and
  the GPU's memory as a dashed line;
* :func:`draw_step_time` -- compute, the pipeline's bubble, and the communication left exposed
  (:func:`coursekit.costmodel.step_time`);
* :func:`draw_calculator` -- both, for one model on one machine: the fastest layouts that fit
  (:func:`coursekit.costmodel.plan`, one per choice of degrees) and plain data parallelism beside them.

A layout that does not fit is drawn hatched and pale in both charts, its value label says "does not fit" and
each legend says what the hatching means (its step is priced: what fitting costs). Every text is 8 pt or more at
the figure's own size; a value label never crosses the memory line (the line's name is in the legend, above the
chart); the layouts' labels slant when they would touch.

    >>> from coursekit.viz.costmodel import PRESETS, draw_calculator
    >>> from coursekit.costmodel import Hardware
    >>> fig = draw_calculator(PRESETS["GPT-2 small"], Hardware(), gpus=8, global_batch=64)
"""

from __future__ import annotations

from dataclasses import replace

import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..costmodel import Candidate, Hardware, Layout, ModelConfig, evaluate, plan

__all__ = ["PRESETS", "MEMORY_COLOURS", "TIME_COLOURS", "CALCULATOR_FIGSIZE", "layout_label", "calculator_candidates",
           "draw_memory_per_gpu", "draw_step_time", "draw_calculator"]

# The vocabulary of GPT-2 and GPT-3 (50,257) is padded so that a tensor-parallel degree divides it: GPT-2's to
# 50,304 = 128 · 393 (nanoGPT's; Megatron-LM's --make-vocab-size-divisible-by 128), GPT-3's to 51,200, the size
# Narayanan et al. 2021 use for all their GPT models (and tests/test_costmodel_planner.py).
# The Llama-style models are the *GPT shape* at Llama's sizes (Touvron et al. 2023: h, layers, heads,
# vocabulary 32,000, untied head, no biases): an approximation -- Llama's SwiGLU MLP (3 matrices of
# 11,008 for 7B, 28,672 for 70B) and 70B's grouped-query attention are not this shape; the GPT shape's
# 4h MLP gives 6.7 B parameters for "7B" and 65.0 B for "70B".
PRESETS = {
    "course transformer": ModelConfig.course(),
    "GPT-2 small": replace(ModelConfig.gpt2_small(), vocab=50304),
    "Llama-style 7B": ModelConfig(32000, 4096, 4096, 32, 32, tied=False, qkv_bias=False,
                                  name="Llama-style 7B (GPT shape)"),
    "Llama-style 70B": ModelConfig(32000, 4096, 8192, 80, 64, tied=False, qkv_bias=False,
                                   name="Llama-style 70B (GPT shape)"),
    "GPT-3 175B": replace(ModelConfig.gpt3_175b(), vocab=51200),
}

MEMORY_COLOURS = {"params": "#4C72B0", "grads": "#55A868", "optimizer": "#C44E52", "activations": "#8172B2",
                  "buffers": "#937860"}
TIME_COLOURS = {"compute": "#4C72B0", "bubble": "#DD8452", "exposed communication": "#C44E52"}
CALCULATOR_FIGSIZE = (13, 5.4)     # inches: at 100% every text is 8 pt or more and the tick labels do not overlap


def layout_label(layout: Layout) -> str:
    """Two short lines: the degrees that are not 1 (mesh order pp, dp, sp, tp), then the ZeRO stage (``Z1``), the
    schedule and micro-batches (``m`` alone without a pipeline: gradient accumulation), recomputation, Megatron's
    sequence parallelism (``SP``).

        >>> layout_label(Layout(dp=4, tp=2, zero=1, micro_batches=2, sequence_parallel=True))
        'dp4 tp2\\nZ1 m2 SP'
    """
    degrees = " ".join(f"{axis}{getattr(layout, axis)}" for axis in ("pp", "dp", "sp", "tp")
                       if getattr(layout, axis) > 1) or "1 GPU"
    details = [f"Z{layout.zero}"] if layout.zero else []
    if layout.pp > 1:
        details.append(f"{layout.schedule} m{layout.micro_batches}")
    elif layout.micro_batches > 1:
        details.append(f"m{layout.micro_batches}")          # gradient accumulation over m micro-batches
    if layout.recompute != "none":
        details.append({"selective": "sel", "full": "full rc"}[layout.recompute])
    if layout.sequence_parallel:
        details.append("SP")
    return degrees + "\n" + (" ".join(details) or "-")


FONT = 8                     # the smallest text of these figures: legible at 100% (issue 43)
NO_FIT = "does not fit"
NO_FIT_HATCH = "///"


def _gb(n: float) -> str:
    if n >= 1e12:
        return f"{n / 1e12:.3g} TB"
    return f"{n / 1e9:.3g} GB" if n >= 1e8 else f"{n / 1e6:.3g} MB"


def _axes(ax, figsize=(6.5, 4.4)):
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
    return ax


def _pale(colour: str) -> tuple[float, float, float]:
    """``colour`` mixed with two parts of white: the bars of a layout that does not fit."""
    return tuple(0.35 * c + 0.65 for c in to_rgb(colour))


def _handles(colours: dict[str, str], candidates: list[Candidate]) -> list:
    """The legend's entries: each kind's colour (as a fitting bar shows it), and the hatching when a bar has it."""
    handles = [Patch(facecolor=colour, label=kind) for kind, colour in colours.items()]
    if not all(c.fits for c in candidates):
        handles.append(Patch(facecolor="white", edgecolor="#444444", hatch=NO_FIT_HATCH, linewidth=0.5,
                             label=f"hatched: {NO_FIT} in GPU memory"))
    return handles


def _stacked(ax, candidates: list[Candidate], parts: dict[str, list[float]], colours: dict[str, str]):
    """The stacked bars, one per candidate; a candidate that does not fit is hatched and pale, in both charts."""
    bottoms = [0.0] * len(candidates)
    for kind, values in parts.items():
        bars = ax.bar(range(len(candidates)), values, bottom=bottoms, color=colours[kind], label=kind,
                      edgecolor="white", linewidth=0.5)
        for bar, c in zip(bars, candidates):
            if not c.fits:       # the hatch takes the edge's colour (matplotlib < 3.10 has no hatch colour)
                bar.set_facecolor(_pale(colours[kind]))
                bar.set_edgecolor("#444444")
                bar.set_hatch(NO_FIT_HATCH)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    labels = [layout_label(c.layout) for c in candidates]
    ax.set_xticks(range(len(candidates)))
    ax.set_xticklabels(labels, fontsize=FONT)
    ax.tick_params(axis="y", labelsize=FONT + 1)
    # Horizontal where each label's longest line fits its bar's slot (about 0.6 em a character), else slanted.
    slot = ax.get_position().width * ax.figure.get_figwidth() * 72 / max(len(candidates), 1)
    widest = max((len(line) for label in labels for line in label.split("\n")), default=0)
    if widest * 0.6 * FONT > 0.85 * slot:
        for tick in ax.get_xticklabels():
            tick.set_rotation(25)
            tick.set_horizontalalignment("right")
            tick.set_rotation_mode("anchor")
    return bottoms


def _legend(ax, handles, title: str, ncol: int) -> None:
    """The legend above the chart, the chart's title as its title: never over a bar, a label or the limit line."""
    ax.legend(handles=handles, title=title, title_fontsize=10, fontsize=FONT, ncol=ncol, loc="lower center",
              bbox_to_anchor=(0.5, 1.0), frameon=False, columnspacing=1.2, handlelength=1.6)


def _value_label(ax, x: float, y: float, text: str, fits: bool, inside: bool) -> None:
    """A bar's value at ``y``: on a white box just under it when ``inside`` (the top of a tall bar), else just
    above it; red and "does not fit" when the layout does not fit."""
    ax.annotate(text + ("" if fits else f"\n{NO_FIT}"), (x, y), xytext=(0, -3 if inside else 2),
                textcoords="offset points", ha="center", va="top" if inside else "bottom", fontsize=FONT,
                color="black" if fits else "#B00000", gid="value label",
                bbox=dict(boxstyle="square,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85))


def draw_memory_per_gpu(candidates: list[Candidate], hardware: Hardware, ax=None):
    """Stacked bars of each candidate's bytes on its most loaded GPU, the GPU's memory as a dashed line; a
    layout that does not fit is hatched, its label says so."""
    ax = _axes(ax)
    kinds = ("params", "grads", "optimizer", "activations", "buffers")
    parts = {kind: [getattr(c.memory, kind) / 1e9 for c in candidates] for kind in kinds}
    tops = _stacked(ax, candidates, parts, MEMORY_COLOURS)
    line = hardware.memory / 1e9
    limit = max(line, min(max(tops), 2 * line)) * 1.25        # a bar far over the line is cut, its label says how far
    ax.set_ylim(0, limit)
    for x, (top, c) in enumerate(zip(tops, candidates)):
        # The label never crosses the line: a fitting bar's label hangs inside the bar from its top (which is under
        # the line), above it only when the bar is too short to hold it (under 15% of the chart: the line is at 40%
        # or more); a bar over the line has its label above it (the line is under it), or inside its top when cut.
        if top > 0.8 * limit:
            _value_label(ax, x, min(top, limit), _gb(c.memory.total), c.fits, inside=True)
        else:
            _value_label(ax, x, top, _gb(c.memory.total), c.fits, inside=c.fits and top >= 0.15 * limit)
    ax.axhline(line, color="red", linestyle="--", linewidth=1.2, gid="memory limit")
    ax.set_ylabel("GB on the most loaded GPU", fontsize=FONT + 1)
    handles = _handles(MEMORY_COLOURS, candidates)
    handles.insert(len(MEMORY_COLOURS), Line2D([], [], color="red", linestyle="--", linewidth=1.2,
                                               label=f"GPU memory {line:.0f} GB"))
    _legend(ax, handles, "memory per GPU", ncol=4)
    return ax.figure


def draw_step_time(candidates: list[Candidate], ax=None):
    """Stacked bars of each candidate's step: compute, bubble, exposed communication (seconds); a layout that does
    not fit is priced too (what fitting costs), hatched, its label says it does not fit."""
    ax = _axes(ax)
    parts = {"compute": [c.time.compute for c in candidates], "bubble": [c.time.bubble for c in candidates],
             "exposed communication": [c.time.exposed_communication for c in candidates]}
    tops = _stacked(ax, candidates, parts, TIME_COLOURS)
    for x, (top, c) in enumerate(zip(tops, candidates)):
        _value_label(ax, x, top, f"{top * 1e3:.3g} ms" if top < 1 else f"{top:.3g} s", c.fits, inside=False)
    ax.set_ylim(0, max(tops + [1e-9]) * 1.25)
    ax.set_ylabel("seconds per step", fontsize=FONT + 1)
    _legend(ax, _handles(TIME_COLOURS, candidates), "step time", ncol=2)
    return ax.figure


def calculator_candidates(config: ModelConfig, hardware: Hardware, gpus: int, global_batch: int, top: int = 5,
                          **assumptions) -> list[Candidate]:
    """What the calculator draws: the fastest fitting layout of each of the ``top`` fastest choices of degrees
    (:func:`~coursekit.costmodel.plan`), then plain data parallelism over every GPU when it is valid and not
    among them (to show what the others save; it may not fit)."""
    ranked, seen = [], set()
    for candidate in plan(config, hardware, gpus, global_batch, top=10 * top, **assumptions):
        layout = candidate.layout
        degrees = (layout.dp, layout.tp, layout.pp, layout.sp)
        if degrees not in seen and len(ranked) < top:
            seen.add(degrees)
            ranked.append(candidate)
    if (gpus, 1, 1, 1) not in seen:
        try:
            ranked.append(evaluate(config, Layout(dp=gpus), hardware, global_batch, **assumptions))
        except ValueError:
            pass          # global_batch does not split over every GPU: no plain data parallelism to show
    return ranked


def draw_calculator(config: ModelConfig, hardware: Hardware, gpus: int, global_batch: int, top: int = 5, fig=None,
                    candidates: list[Candidate] | None = None, **assumptions):
    """Memory per GPU and step time side by side for :func:`calculator_candidates` (or ``candidates``, when
    already computed); ``fig`` is cleared and reused."""
    if fig is None:
        fig = plt.figure(figsize=CALCULATOR_FIGSIZE)
    fig.clear()
    memory_ax, time_ax = fig.subplots(1, 2)
    if candidates is None:
        candidates = calculator_candidates(config, hardware, gpus, global_batch, top, **assumptions)
    title = (f"{config.name}, s = {config.seq_len}, global batch {global_batch}, {gpus} GPUs of "
             f"{hardware.memory / 1e9:.0f} GB ({hardware.gpus_per_node} per node)")
    if not candidates:
        for ax in (memory_ax, time_ax):
            ax.text(0.5, 0.5, "no valid layout", ha="center", va="center", transform=ax.transAxes)
    else:
        draw_memory_per_gpu(candidates, hardware, ax=memory_ax)
        draw_step_time(candidates, ax=time_ax)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig
