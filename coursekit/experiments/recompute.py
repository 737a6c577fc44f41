"""Activation recomputation measured: none / selective / full on the course transformer, beside Table 2.

For each policy of :func:`coursekit.parallel.recompute.apply_recompute` (and the course model as it is, its
fused ``scaled_dot_product_attention``: ``"fused"``), one training step's forward + backward of the whole
model and its loss, measured four ways:

* **saved bytes per layer** -- what autograd keeps for one block's backward, counted by chapter 06's
  :func:`~coursekit.parallel.sequence.saved_bytes` (saved-tensor hooks, each storage once, the parameters
  left out), beside the cost model's :func:`~coursekit.costmodel.activation_bytes_per_layer` (fp32, no
  dropout) and what it leaves out: LayerNorm's mean and 1/std, 4 floats a token, and the fused kernel's
  log-sum-exp, a floats a token;
* **peak** -- the most bytes live at once during the step, exactly (:class:`~coursekit.measure.live_memory.
  LiveMemory`: every storage the step's ops create, from birth to free; the gradients of the parameters
  left out), and the plateau at the end of the forward;
* **step time** -- the median of ``repeats`` forward + backward, on one thread;
* **FLOPs** -- ``torch.utils.flop_counter.FlopCounterMode`` (matrix products: 2·m·n·k each) over the step;
  recomputed = the policy's minus ``"none"``'s. Twice: as PyTorch runs it (non-reentrant checkpoint stops
  recomputing as soon as backward has every tensor it needs -- the region's last matmul, whose output no one
  saved, is skipped) and with ``set_checkpoint_early_stop(False)``: one whole forward of the region, what
  Korthikanti et al. and the cost model's :func:`~coursekit.costmodel.compute_flops` count.

    >>> rows = recompute_table()                        # doctest: +SKIP
    >>> print(format_table(rows))                       # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

from ..costmodel import activation_bytes_per_layer
from ..measure.live_memory import LiveMemory
from ..models import LanguageData, loss_fn, tiny_transformer
from ..parallel.recompute import POLICIES, apply_recompute
from ..parallel.sequence import saved_bytes

__all__ = ["VARIANTS", "RecomputeRow", "course_model", "layer_saved_bytes", "step_flops", "step_memory",
           "step_ms", "recompute_table", "table2_share", "format_table"]

VARIANTS = ("fused",) + POLICIES   # "fused": the course model as it is (no apply_recompute)


def course_model(variant: str, d_model: int = 64, n_heads: int = 4, n_layers: int = 2, max_seq_len: int = 64,
                 seed: int = 0) -> torch.nn.Module:
    """The course transformer, under ``variant`` (a policy, or ``"fused"``: untouched)."""
    model = tiny_transformer(seed=seed, d_model=d_model, n_heads=n_heads, n_layers=n_layers, max_seq_len=max_seq_len)
    return model if variant == "fused" else apply_recompute(model, variant)


def layer_saved_bytes(variant: str, batch: int, seq: int, d_model: int = 64, n_heads: int = 4) -> int:
    """Bytes autograd keeps for one block's backward (its input included, as Table 2 counts it)."""
    block = course_model(variant, d_model, n_heads, 1, max(seq, 64)).blocks[0]
    x = torch.randn(batch, seq, d_model, generator=torch.Generator().manual_seed(0), requires_grad=True)
    with saved_bytes(block.parameters()) as meter:
        block(x)
    return meter.bytes


def step_flops(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, early_stop: bool = True) -> int:
    """Forward + backward FLOPs of one step (matrix products), as counted by ``FlopCounterMode``."""
    stop = contextlib.nullcontext() if early_stop else set_checkpoint_early_stop(False)
    with stop, FlopCounterMode(display=False) as counter:
        loss_fn(model(inputs), targets).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def step_memory(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
    """(plateau at the end of the forward, peak) of one step's live bytes, the parameters' gradients left out."""
    with LiveMemory(params=model.parameters()) as mem:
        loss = loss_fn(model(inputs), targets)
        mem.mark("forward")
        loss.backward()
    model.zero_grad(set_to_none=True)
    return mem.marks["forward"], mem.peak


def step_ms(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, repeats: int = 7) -> float:
    """Median milliseconds of forward + backward on one thread (after one warm-up step)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = []
        for _ in range(repeats + 1):
            begin = time.perf_counter()
            loss_fn(model(inputs), targets).backward()
            times.append(time.perf_counter() - begin)
            model.zero_grad(set_to_none=True)
    finally:
        torch.set_num_threads(threads)
    return 1e3 * statistics.median(times[1:])


@dataclass(frozen=True)
class RecomputeRow:
    """One variant's step: bytes per layer (measured, the cost model's, what the model leaves out), live bytes,
    milliseconds, FLOPs, and FLOPs recomputed (beyond ``"none"``) with and without PyTorch's early stop."""

    variant: str
    saved_per_layer: int
    model_per_layer: int
    left_out: int
    plateau: int
    peak: int
    ms: float
    flops: int
    recomputed: int | None
    recomputed_whole: int | None


def recompute_table(batch: int = 4, seq: int = 31, d_model: int = 64, n_heads: int = 4, n_layers: int = 2,
                    repeats: int = 7) -> list[RecomputeRow]:
    """Every variant of :data:`VARIANTS` at one shape (default: the course's, 4 sequences of 31 tokens)."""
    inputs, targets = LanguageData(seq_len=seq + 1).batch(step=0, batch_size=batch)
    stats, flops = 4 * 2 * batch * seq, {}
    rows = []
    for variant in ("none",) + tuple(v for v in VARIANTS if v != "none"):
        model = course_model(variant, d_model, n_heads, n_layers, max(seq, 64))
        flops[variant] = (step_flops(model, inputs, targets), step_flops(model, inputs, targets, early_stop=False))
        recompute = "selective" if variant == "fused" else variant
        formula = activation_bytes_per_layer(seq, batch, d_model, n_heads, recompute=recompute, bytes_per_element=4,
                                             dropout=False).total
        left_out = {"full": 0, "fused": 2 * stats + 4 * n_heads * batch * seq}.get(variant, 2 * stats)
        plateau, peak = step_memory(model, inputs, targets)
        rows.append(RecomputeRow(variant, layer_saved_bytes(variant, batch, seq, d_model, n_heads), formula, left_out,
                                 plateau, peak, step_ms(model, inputs, targets, repeats), flops[variant][0],
                                 *_recomputed(variant, flops)))
    return sorted(rows, key=lambda r: VARIANTS.index(r.variant))


def _recomputed(variant: str, flops: dict) -> tuple:
    """FLOPs beyond ``"none"``'s, both ways; None for ``"fused"``: FlopCounterMode has no formula for the CPU
    flash kernel, so its attention (forward, and the recomputation inside its backward) counts 0."""
    if variant == "fused":
        return None, None
    return flops[variant][0] - flops["none"][0], flops[variant][1] - flops["none"][1]


def table2_share(seq: int, hidden: int, heads: int, dropout: bool = True, bytes_per_element: int = 2) -> float:
    """The share of a layer's activations that selective recomputation removes: the scores' term over the whole.

    Table 2's 16-bit layer with dropout: (5as/h)/(34 + 5as/h) -- GPT-3 (a 96, s 2048, h 12,288): 80/114 = 70%.

        >>> round(table2_share(2048, 12288, 96), 3)
        0.702
    """
    whole = activation_bytes_per_layer(seq, 1, hidden, heads, bytes_per_element=bytes_per_element, dropout=dropout)
    return whole.scores / whole.total


def format_table(rows: list[RecomputeRow]) -> str:
    """A markdown table of :func:`recompute_table`'s rows."""
    lines = ["| variant | saved B/layer (measured) | cost model + left out | peak B | plateau B | step ms | "
             "GFLOP | recomputed GFLOP (torch / whole forward) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        redone = ("not counted (fused kernel)" if r.recomputed is None
                  else f"{r.recomputed / 1e9:.4f} / {r.recomputed_whole / 1e9:.4f}")
        lines.append(f"| {r.variant} | {r.saved_per_layer:,} | {r.model_per_layer:,} + {r.left_out:,} | {r.peak:,} | "
                     f"{r.plateau:,} | {r.ms:.2f} | {r.flops / 1e9:.4f} | {redone} |")
    return "\n".join(lines)
