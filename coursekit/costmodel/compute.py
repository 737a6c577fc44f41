"""Compute per training step: the FLOPs of a GPT-shaped transformer, their time, and the pipeline's bubble.

Every matrix multiply of ``m×k`` by ``k×n`` costs ``2mkn`` FLOPs forward and twice that backward (the
gradients of both inputs). Over a step of ``T`` tokens that is the well-known ``6·P·T`` for the
parameters' matmuls (Kaplan et al. 2020, section 2.1), and attention's two ``s×s`` products
(``QKᵀ`` and ``AV``, ``4·s·h`` per token and layer forward) add ``12·L·s·h`` per token. Narayanan et al.
2021 (section 5.1, eq. 3) write the same for ``B`` sequences of ``s`` tokens, ``P ≈ 12Lh²``::

    no recomputation:        72·B·s·L·h²·(1 + s/(6h) + V/(12hL))
    full recomputation:      96·B·s·L·h²·(1 + s/(6h) + V/(16hL))       (one more forward of every layer)

(the logit layer is not recomputed: its ``6·B·s·h·V`` is in both). Korthikanti et al. 2022's selective
recomputation recomputes attention's core only: one more forward of ``QKᵀ`` and ``AV``, ``4·L·s·h`` more
per token. (Their eq. 8 writes ``72·B·s·L·h²·(1 + s/(3h) + V/(12hL))``, three times that, and their Table 5's
hardware FLOPs utilisation follows eq. 8; their model FLOPs, eq. 7 = the 72 form above, are what
:func:`compute_flops` with ``recompute="none"`` reproduces: tests/test_costmodel_time.py.) Both papers count
the whole ``s×s`` score matrix (no causal halving); so does this module.

    >>> gpt3 = ModelConfig.gpt3_175b()
    >>> flops = compute_flops(gpt3, tokens=2048, recompute="none")      # one sequence
    >>> round(flops.total / 1e15, 3), round(72 * 2048 * 96 * 12288**2 * (1 + 2048/(6*12288)
    ...                                      + 50257/(12*12288*96)) / 1e15, 3)
    (2.205, 2.204)

(the 0.02% between them: ``P`` here counts the biases, LayerNorms and positions, which the paper's
``12Lh² + Vh`` leaves out).

A mixture of experts costs a token ``k`` experts, not ``E``: ``6·P·T`` counts the parameters a token *uses*,
every dense one and the router, and ``k`` of each layer's ``E`` experts (:func:`~.params.active_params`; the
Switch Transformer's "FLOPs per token" are those of its active parameters, Fedus et al. 2021, section 2).
The experts' share is kept apart (:attr:`Flops.experts`) because expert parallelism's busiest rank does more
of it than the mean: :func:`compute_time` scales it by the imbalance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..parallel.pipeline.planning import bubble_formula
from .config import RECOMPUTE, Hardware, Layout, ModelConfig
from .experts import expert_params, expert_rows
from .kernels import kernel_time
from .overhead import transformer_overhead
from .params import num_params

__all__ = ["Flops", "ComputeTime", "compute_flops", "compute_time", "bubble_fraction"]


@dataclass(frozen=True)
class Flops:
    """One step's FLOPs: the parameters' matmuls (``dense``), attention's ``s×s`` products, the recomputation;
    ``experts``: an MoE's experts' matmuls, ``k`` a token, forward, backward and recomputed (0 if dense)."""

    dense: float
    attention: float
    recompute: float = 0.0
    experts: float = 0.0

    @property
    def total(self) -> float:
        return self.dense + self.attention + self.recompute + self.experts


def compute_flops(config: ModelConfig, tokens: float, recompute: str = "none") -> Flops:
    """FLOPs of forward + backward over ``tokens`` tokens (sequences of ``config.seq_len``).

    ``dense = 6·P·tokens``, ``attention = 12·L·s·h·tokens``; recomputation adds one forward: ``"full"`` of
    every layer (``2·P_layers·tokens + 4·L·s·h·tokens``, Narayanan et al. 2021's 96 in place of 72),
    ``"selective"`` of attention's core (``4·L·s·h·tokens``, Korthikanti et al. 2022). An MoE: ``dense`` counts
    every parameter but the experts', ``experts = 6·L·k·2hf·tokens`` (``8·...`` with full recomputation).

        >>> compute_flops(ModelConfig.course(), tokens=64).dense == 6 * 104_832 * 64
        True
        >>> moe = ModelConfig.course(n_layers=2)
        >>> from dataclasses import replace
        >>> compute_flops(replace(moe, experts=8, top_k=2), tokens=64).experts == 6 * 2 * 2 * (2 * 64 * 256) * 64
        True
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE} (got {recompute!r}).")
    h, L, s = config.hidden, config.layers, config.seq_len
    attention_forward = 4 * L * s * h * tokens
    if config.experts:   # the dense part (attention, router, norms...) as above; k experts a token apart
        count = num_params(config)
        used = L * config.top_k * expert_params(config)                  # k of the E experts, every layer
        forwards = 4 if recompute == "full" else 3                        # forward + backward (2×), + one more
        extra = {"none": 0.0, "selective": attention_forward,
                 "full": 2 * (count.layers - count.experts) * tokens + attention_forward}[recompute]
        return Flops(6 * (count.total - count.experts) * tokens, 3 * attention_forward, extra,
                     2 * forwards * used * tokens)
    layers = num_params(config).layers          # L(12h² + 13h) for a GPT block
    extra = {"none": 0.0, "selective": attention_forward, "full": 2 * layers * tokens + attention_forward}[recompute]
    return Flops(6 * num_params(config).total * tokens, 3 * attention_forward, extra)


def bubble_fraction(layout: Layout) -> float:
    """The share of a pipelined step that a rank idles: chapter 04's
    :func:`coursekit.parallel.pipeline.bubble_formula` for the layout's schedule (0 without pipelining).

        >>> bubble_fraction(Layout(pp=4, micro_batches=8))            # (p − 1)/(m + p − 1)
        0.2727272727272727
    """
    if layout.pp == 1:
        return 0.0
    return float(bubble_formula(layout.schedule, layout.pp, layout.micro_batches, layout.chunks))


@dataclass(frozen=True)
class ComputeTime:
    """Seconds of one step on one GPU: its share of the FLOPs at the reached speed, and the pipeline's bubble."""

    compute: float
    bubble: float

    @property
    def total(self) -> float:
        return self.compute + self.bubble


def compute_time(config: ModelConfig, layout: Layout, hardware: Hardware, global_batch: int,
                 efficiency: float | None = None, imbalance: float = 1.0, itemsize: int = 2,
                 optimizer: str = "adam") -> ComputeTime:
    """``compute = compute_flops(global_batch·s).total / gpus / (flops · efficiency)``; the bubble on top.

    Every GPU does ``1/gpus`` of the work (dp splits the batch, tp the matrices, pp the layers, sp the
    tokens); ``efficiency`` (default ``hardware.efficiency``) is the share of peak the matmuls reach. The
    bubble is idle time: if a rank idles a fraction ``f`` of the step (:func:`bubble_fraction`), the step is
    ``compute/(1 − f)``, so ``bubble = compute·f/(1 − f)`` -- ``compute·(p − 1)/m`` for GPipe and 1F1B,
    Narayanan et al. 2021's bubble time fraction.

        >>> t = compute_time(ModelConfig.gpt3_175b(), Layout(dp=1, tp=8, pp=8, micro_batches=8), Hardware(), 8)
        >>> round(t.bubble / t.compute, 4)                            # (p − 1)/m = 7/8
        0.875

    An MoE with ``ep > 1``: the busiest rank's experts compute :func:`~.experts.expert_rows`' busiest rows, not
    the mean (``imbalance`` times more, at most the capacity's ``E·C``), and the step waits for it.

    With ``hardware.op_overhead`` or a finite ``hardware.memory_bandwidth`` (a CPU fitted by a probe), the
    busiest rank's ops and memory-bound bytes are added (:func:`~.overhead.transformer_overhead`; activations
    and optimizer state of ``itemsize`` bytes, ``optimizer`` ``"adam"`` or ``"sgd"``): the micro-batches' part
    to ``compute`` and to what the bubble stretches, the optimizer's to ``compute`` only (it runs after the flush).
    A GPU preset has both off: the result is the FLOPs' alone, to the bit.

    A hardware priced by shape (``hardware.by_shape``: :meth:`~.config.Hardware.a100`) and no ``efficiency`` given:
    the busiest rank's kernels, each at its size's efficiency (:func:`~.kernels.kernel_time`), the optimizer
    in ``compute``, the bubble ``f/(1 − f)`` of the micro-batches' part only.
    """
    if hardware.by_shape and efficiency is None:
        if config.experts:
            raise ValueError(f"{config.name} is a mixture of experts: its kernels are not priced by shape here; pass "
                             f"efficiency= (one share of peak) or a Hardware without a matmul_efficiency curve.")
        kernels = kernel_time(config, layout, hardware, global_batch)
        f = bubble_fraction(layout)
        return ComputeTime(kernels.total, kernels.pipelined * f / (1 - f))
    reached = hardware.flops * (hardware.efficiency if efficiency is None else efficiency)
    flops = compute_flops(config, global_batch * config.seq_len, layout.recompute)
    total = flops.total
    if flops.experts:
        tokens = global_batch // (layout.dp * layout.micro_batches) * config.seq_len / layout.sp
        rows = expert_rows(config, tokens, layout.ep, imbalance)
        total += flops.experts * (rows.busiest / (config.top_k * tokens) - 1)
    compute = total / layout.gpus / reached
    f = bubble_fraction(layout)
    if hardware.by_shape or (not hardware.op_overhead and math.isinf(hardware.memory_bandwidth)):
        return ComputeTime(compute, compute * f / (1 - f))
    pipelined, step = transformer_overhead(config, layout, global_batch, itemsize, optimizer).seconds(hardware)
    return ComputeTime(compute + pipelined + step, (compute + pipelined) * f / (1 - f))
