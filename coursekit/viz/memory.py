"""Memory per rank as stacked bars: parameters, gradients, optimiser state (measured or by formula).

    >>> from coursekit.viz.memory import draw_memory, draw_memory_formula
    >>> fig = draw_memory({"DP": {"params": 40, "grads": 40, "optimizer": 80}}, formula={"DP": 160})
    >>> fig = draw_memory_formula(psi=7.5e9, world_size=64, precision="mixed", gpu_bytes=80e9)
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from ..measure.memory import formula_bytes

KIND_COLOURS = {"params": "#4C72B0", "grads": "#55A868", "optimizer": "#C44E52"}
STAGE_LABELS = {0: "DP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def _human(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def draw_memory(bars: dict[str, dict[str, float]], formula: dict[str, float] | None = None, ax=None,
                title: str = "bytes held per rank", gpu_bytes: float | None = None, highlight: str | None = None):
    """Stacked bars, one per label; ``formula`` adds a black tick at the formula's total for each label."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3.6))
    else:
        fig = ax.figure
    labels = list(bars)
    for x, label in enumerate(labels):
        bottom = 0.0
        for kind, colour in KIND_COLOURS.items():
            value = bars[label].get(kind, 0)
            ax.bar(x, value, bottom=bottom, color=colour, edgecolor="black" if label == highlight else "white",
                   linewidth=2 if label == highlight else 0.5, label=kind if x == 0 else None)
            bottom += value
        ax.text(x, bottom, _human(bottom), ha="center", va="bottom", fontsize=8)
        if formula and label in formula:
            ax.plot([x - 0.4, x + 0.4], [formula[label]] * 2, color="black", linewidth=1.5,
                    label="formula" if x == 0 else None)
    if gpu_bytes:
        ax.axhline(gpu_bytes, color="red", linestyle="--", linewidth=1, label=f"GPU memory ({_human(gpu_bytes)})")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    ax.set_ylabel("bytes")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def draw_memory_formula(psi: float, world_size: int, precision: str = "mixed", gpu_bytes: float | None = None,
                        stage: int | None = None, ax=None):
    """The ZeRO paper's per-rank model-state memory for plain DP and ZeRO-1/2/3 (``stage`` highlighted)."""
    bars = {STAGE_LABELS[s]: formula_bytes(psi, world_size, s, precision) for s in range(4)}
    title = f"Ψ = {psi / 1e9:.3g} B parameters, N = {world_size} GPUs, {precision} Adam: model state per GPU"
    return draw_memory(bars, ax=ax, title=title, gpu_bytes=gpu_bytes,
                       highlight=None if stage is None else STAGE_LABELS[stage])
