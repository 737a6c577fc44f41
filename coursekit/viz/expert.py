"""Chapter 07's figures: where a router sends tokens, how balance evolves, what capacity drops, what travels.

They read results (counts, :class:`~coursekit.experiments.expert_balance.BalanceRun` lists, timings) and draw;
none runs an algorithm of its own. Each returns its figure.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

__all__ = ["draw_tokens_per_expert", "draw_balance", "draw_capacity", "draw_rows_sent", "draw_pace",
           "draw_ep_versus_tp"]

METHOD_COLOURS = {"no balancing": "tab:red", "balance loss": "tab:blue", "bias nudge": "tab:green"}


def draw_tokens_per_expert(panels: dict[str, list[int]], title: str = "tokens per expert"):
    """One bar chart per panel (its title -> each expert's count), the even share dashed."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), sharey=True, squeeze=False)
    for ax, (name, counts) in zip(axes[0], panels.items()):
        counts = np.asarray(counts, dtype=float)
        busiest = counts.argmax()
        ax.bar(range(len(counts)), counts, color=["tab:red" if e == busiest else "tab:grey"
                                                   for e in range(len(counts))])
        ax.axhline(counts.mean(), ls="--", color="black", lw=1, label="even share")
        ax.set_title(f"{name}\nbusiest / mean = {counts.max() / counts.mean():.2f}", fontsize=10)
        ax.set_xlabel("expert")
        ax.set_xticks(range(len(counts)))
    axes[0][0].set_ylabel("assignments")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def draw_balance(runs: dict[str, list]):
    """The imbalance over the training steps, one line per method: the mean over seeds, the band their range."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, seeds in runs.items():
        steps = seeds[0].steps
        values = np.array([run.imbalance for run in seeds])
        colour = METHOD_COLOURS.get(name)
        ax.plot(steps, values.mean(0), color=colour, label=name)
        ax.fill_between(steps, values.min(0), values.max(0), color=colour, alpha=0.2)
    ax.axhline(1, color="black", lw=0.8, ls=":")
    ax.set_xlabel("training step")
    ax.set_ylabel("busiest expert / mean")
    ax.set_title(f"load imbalance while training ({len(next(iter(runs.values())))} seeds: mean and range)",
                 fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def draw_capacity(results: dict[str, list]):
    """Per capacity factor: the share of assignments dropped and the evaluation loss, every seed a dot."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.3))
    names = list(results)
    for i, name in enumerate(names):
        runs = results[name]
        left.scatter([i] * len(runs), [100 * r.dropped for r in runs], color="tab:orange")
        right.scatter([i] * len(runs), [r.eval_loss for r in runs], color="tab:purple")
        left.bar(i, 100 * np.mean([r.dropped for r in runs]), color="tab:orange", alpha=0.3)
        right.bar(i, np.mean([r.eval_loss for r in runs]), color="tab:purple", alpha=0.3)
    for ax, label in ((left, "assignments dropped (%)"), (right, "evaluation loss (MSE)")):
        ax.set_xticks(range(len(names)), names)
        ax.set_xlabel("capacity factor")
        ax.set_ylabel(label)
    fig.suptitle("what a capacity limit drops, and what it costs (bars: mean over seeds)", fontsize=10)
    fig.tight_layout()
    return fig


def draw_rows_sent(matrix, title: str = "rows sent by dispatch"):
    """An ep × ep grid: how many token rows rank i (row) sent to rank j (column)."""
    matrix = np.asarray(matrix)
    fig, ax = plt.subplots(figsize=(3.6, 3.2))
    image = ax.imshow(matrix, cmap="Blues")
    dark = matrix.min() + 0.6 * (matrix.max() - matrix.min())    # white on the darkest cells, black elsewhere
    for i in range(matrix.shape[0]):
        for j in range(matrix.shape[1]):
            ax.text(j, i, f"{matrix[i, j]:,}", ha="center", va="center",
                    color="white" if matrix[i, j] > dark else "black")
    ax.set_xticks(range(matrix.shape[1]))
    ax.set_yticks(range(matrix.shape[0]))
    ax.set_xlabel("to rank (its experts)")
    ax.set_ylabel("from rank (its tokens)")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    return fig


def draw_pace(imbalances: list[float], ratios: list[tuple[float, float, float]], predicted: list[float]):
    """Step time over the even load's, against the imbalance: measured (median, range) and the prediction."""
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    median = [r[0] for r in ratios]
    low = [r[0] - r[1] for r in ratios]
    high = [r[2] - r[0] for r in ratios]
    ax.errorbar(imbalances, median, yerr=[low, high], fmt="o-", capsize=3, label="measured (median, range)")
    ax.plot(imbalances, predicted, "k--", label="the busiest rank's rows predict")
    ax.set_xlabel("imbalance: the busier rank's rows / the mean")
    ax.set_ylabel("step time / even load's")
    ax.set_title("the slowest rank sets the pace (2 ranks)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def draw_ep_versus_tp(ranks: list[int], curves: dict[str, list[float]], unit: str = "MiB"):
    """Bytes each rank sends for one MoE layer's forward, against the number of ranks, one line per method."""
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    for name, values in curves.items():
        ax.plot(ranks, values, "o-", label=name)
    ax.set_xlabel("ranks (ep or tp)")
    ax.set_ylabel(f"sent per rank, forward ({unit})")
    ax.set_xticks(ranks)
    ax.set_title("experts spread (EP) or each expert split (TP)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
