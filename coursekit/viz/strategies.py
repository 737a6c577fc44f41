"""Who holds what: model, data, tensor and pipeline parallelism side by side (P6, R8).

    >>> from coursekit.viz.strategies import layout, draw_strategies
    >>> layout("model", n_gpus=2, n_layers=4)["layers"]
    [0, 0, 1, 1]
    >>> fig = draw_strategies(n_gpus=4)

``layout`` is the plan (which GPU holds which layers, which slice of the
batch, which slice of each weight matrix); ``draw_strategies`` only draws it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from ..parallel.pipeline import one_f_one_b, plan

STRATEGIES = ("model", "data", "tensor", "pipeline")


def _contiguous_blocks(n_items: int, n_parts: int) -> list[int]:
    """Owner of each item when n_items are cut into n_parts contiguous, near-equal blocks."""
    owners = []
    for part in range(n_parts):
        size = n_items // n_parts + (1 if part < n_items % n_parts else 0)
        owners += [part] * size
    return owners


def layout(strategy: str, n_gpus: int, n_layers: int = 4, batch: int = 8, micro_batches: int = 4) -> dict:
    """Which GPU holds what under ``strategy``.

    Returns a dict with
      ``layers``: owner GPU of each layer (``None`` = every GPU has a copy),
      ``batch``: owner GPU of each sample (``None`` = every GPU sees it),
      ``columns``: for tensor parallelism, the owner of each block of every weight,
      ``split``: for tensor parallelism, how each weight is cut: ``"columns"``, then ``"rows"``, alternating
      (Megatron-LM's pairs: a column-parallel layer feeds a row-parallel one, one all-reduce per pair),
      ``schedule``: for pipeline parallelism, (stage, time step, micro-batch) of each forward.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if n_gpus < 1:
        raise ValueError("n_gpus must be at least 1")
    plan = {"strategy": strategy, "n_gpus": n_gpus, "layers": [None] * n_layers, "batch": [None] * batch,
            "columns": None, "split": None, "schedule": []}
    if strategy in ("model", "pipeline"):
        if n_gpus > n_layers:
            raise ValueError(f"{strategy} parallelism puts whole layers on GPUs: {n_layers} layers cannot use "
                             f"{n_gpus} GPUs. Use more layers or fewer GPUs.")
        plan["layers"] = _contiguous_blocks(n_layers, n_gpus)
    if strategy == "data":
        plan["batch"] = _contiguous_blocks(batch, n_gpus)
    if strategy == "tensor":
        plan["columns"] = list(range(n_gpus))
        plan["split"] = ["columns" if i % 2 == 0 else "rows" for i in range(n_layers)]
    if strategy == "pipeline":
        stages = n_gpus
        plan["schedule"] = [(stage, stage + m, m) for m in range(micro_batches) for stage in range(stages)]
    return plan


def _colour(gpu: int | None):
    return "0.85" if gpu is None else plt.get_cmap("tab10")(gpu % 10)


def _draw_layers(ax, owners, y, height=0.8, gpu_label=True):
    for i, gpu in enumerate(owners):
        ax.add_patch(Rectangle((i, y), 0.85, height, facecolor=_colour(gpu), edgecolor="black"))
        # the GPU under the layer where the box has room for it (colour says it anyway)
        text = f"L{i + 1}" + ("" if gpu is None or not gpu_label else f"\nGPU{gpu + 1}")
        ax.text(i + 0.425, y + height / 2, text, ha="center", va="center", fontsize=8)


def draw_strategies(n_gpus: int = 2, n_layers: int = 4, batch: int = 8, micro_batches: int = 4, fig=None):
    """Draw the four strategies for ``n_gpus`` GPUs in one figure (a Figure-1.1-like comparison, P6)."""
    fig = fig or plt.figure(figsize=(12, 3.6))
    fig.clear()
    axes = fig.subplots(1, 4)
    n_layers = max(n_layers, n_gpus)
    _model_panel(axes[0], n_gpus, n_layers, batch)
    _data_panel(axes[1], n_gpus, n_layers, batch)
    _tensor_panel(axes[2], n_gpus, n_layers)
    _pipeline_panel(axes[3], n_gpus, n_layers, batch, micro_batches)
    for ax in axes[:3]:
        ax.axis("off")
    for spine in axes[3].spines.values():
        spine.set_visible(False)
    fig.suptitle(f"{n_gpus} GPU{'s' if n_gpus > 1 else ''}: colour = which GPU holds it", fontsize=10)
    fig.tight_layout()
    return fig


def _model_panel(ax, n_gpus: int, n_layers: int, batch: int) -> None:
    """Model parallelism (P3): contiguous layers per GPU; the batch visits them in turn."""
    plan = layout("model", n_gpus, n_layers)
    _draw_layers(ax, plan["layers"], 0, gpu_label=n_layers <= 5)
    for i in range(n_layers - 1):
        if plan["layers"][i] != plan["layers"][i + 1]:
            ax.annotate("", xy=(i + 1.0, 0.4), xytext=(i + 0.85, 0.4), arrowprops=dict(arrowstyle="->", lw=2))
    ax.set_title("model parallelism\nlayers split, GPUs wait in a chain", fontsize=9)
    ax.set_xlim(-0.2, n_layers + 0.1)
    ax.set_ylim(-0.6, 1.4)
    ax.text(n_layers / 2, -0.35, f"whole batch of {batch} goes through GPU1 → … → GPU{n_gpus}", ha="center",
            fontsize=8)


def _data_panel(ax, n_gpus: int, n_layers: int, batch: int) -> None:
    """Data parallelism (P4): a full copy per GPU, each with its slice of the batch."""
    plan = layout("data", n_gpus, n_layers, batch)
    for gpu in range(n_gpus):
        y = n_gpus - 1 - gpu
        _draw_layers(ax, [gpu] * n_layers, y, gpu_label=n_gpus <= 4)  # more rows: the colour says which GPU
        samples = [i for i, owner in enumerate(plan["batch"]) if owner == gpu]
        span = f"samples {samples[0]}–{samples[-1]}" if samples else "no samples"
        ax.text(n_layers + 0.05, y + 0.4, span, va="center", fontsize=8)
    ax.set_title("data parallelism\nfull copy per GPU, batch split", fontsize=9)
    ax.set_xlim(-0.2, n_layers + 2.2)
    ax.set_ylim(-0.3, n_gpus + 0.1)


def _tensor_panel(ax, n_gpus: int, n_layers: int) -> None:
    """Tensor parallelism (P5): weights cut by columns, then by rows, in pairs (chapter 05's column then row)."""
    plan = layout("tensor", n_gpus, n_layers)
    for i, split in enumerate(plan["split"]):
        for gpu in range(n_gpus):
            if split == "columns":  # GPU g holds a block of output features: a vertical stripe of A = Wᵀ
                box = (i + gpu * 0.85 / n_gpus, 0), 0.85 / n_gpus, 1.6
            else:  # a block of input features: a horizontal stripe, top to bottom
                box = (i, 1.6 - (gpu + 1) * 1.6 / n_gpus), 0.85, 1.6 / n_gpus
            ax.add_patch(Rectangle(*box, facecolor=_colour(gpu), edgecolor="black", lw=0.6,
                                   gid=f"W{i + 1} {split} GPU{gpu + 1}"))
        ax.text(i + 0.425, 1.7, f"W{i + 1}", ha="center", fontsize=8)
        ax.text(i + 0.425, -0.2, split if n_layers <= 5 else split[:3], ha="center", fontsize=8)
    ax.set_title("tensor parallelism\nweights split by columns, then by rows", fontsize=9)
    ax.set_xlim(-0.2, n_layers + 0.1)
    ax.set_ylim(-0.3, 2.0)


def _pipeline_panel(ax, n_gpus: int, n_layers: int, batch: int, micro_batches: int) -> None:
    """Pipeline parallelism (P7): 1F1B's planned times -- forwards of some micro-batches while others go backward.

    Boxes come from :func:`coursekit.parallel.pipeline.plan` of ``one_f_one_b``
    (F = 1 unit, B = 2), so the empty cells are the real bubble, (p−1)/(m+p−1).
    """
    layout("pipeline", n_gpus, n_layers, batch, micro_batches)  # same size checks as the other panels
    planned = plan(one_f_one_b(n_gpus, micro_batches))
    for gpu, spans in enumerate(planned.spans):
        y = n_gpus - 1 - gpu
        for action, start, end in spans:
            ax.add_patch(Rectangle((float(start), y), float(end - start) - 0.05, 0.85, facecolor=_colour(gpu),
                                   alpha=1.0 if action.op == "F" else 0.45, edgecolor="black", lw=0.6,
                                   gid=str(action)))
            ax.text(float(start + end) / 2, y + 0.42, f"{action.micro_batch + 1}", ha="center",
                    va="center", fontsize=8)
    ax.set_yticks([n_gpus - 1 - s + 0.42 for s in range(n_gpus)], [f"GPU{s + 1}" for s in range(n_gpus)],
                  fontsize=8)
    ax.set_xticks([])
    ax.set_xlabel(f"time → (empty = bubble, {float(planned.bubble_fraction):.0%} of GPU time)", fontsize=8)
    ax.set_title(f"pipeline parallelism (1F1B)\n{micro_batches} micro-batches, solid F, pale B", fontsize=9)
    ax.set_xlim(0, float(planned.makespan))
    ax.set_ylim(-0.1, n_gpus)
