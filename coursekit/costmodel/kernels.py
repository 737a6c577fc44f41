"""A GPU's step priced kernel by kernel, by each kernel's shape: what a single efficiency cannot say.

One share of peak for a whole step cannot price steps of different widths: on Korthikanti et al. 2022's eight
A100 iterations (Table 5) the share each row needs runs from 0.50 (22B, each GPU's matmuls 768 wide) to 0.75
(530B), and a share measured end to end already holds the bubble and the communication that
:func:`~.step.step_time` adds again. Here each kernel of a layer is priced on its own, as Calculon does
(Isaev et al. 2023, calculon-ai/calculon, calculon/llm/layers.py, its ``no_overlap`` processing mode):

* a **matmul** of ``F`` FLOPs: ``F / (peak · e(F))`` with ``e`` the hardware's ``matmul_efficiency`` curve (a
  768-wide matmul of one sequence does fewer FLOPs a launch, and reaches less of peak), plus its two inputs and
  its output through memory;
* a **memory-bound** kernel of ``B`` bytes (norms, softmax, dropout, GELU, the residual adds, the optimizer):
  ``B / (bandwidth · e_mem(B))``;
* attention with a **flash kernel** (where the hardware has an ``attention_efficiency``): its FLOPs at that share,
  the ``s×s`` scores never in memory, the causal mask's masked half skipped (a decoder's; the kernels' measured
  TFLOP/s count the same half: Shah et al. 2024); without one, as Megatron-LM ran it in 2022: two batched matmuls (``QKᵀ``,
  ``AV``) and the fused scale-mask-softmax and dropout over the ``b·(a/t)·s²`` scores.

The kernels of one layer, one micro-batch, on one rank (``T = b·s`` tokens, ``t`` = tp, ``h' = h/t`` with
Megatron's sequence parallelism, else ``h``; 16-bit tensors, a dropout mask a byte an element)::

    matmuls      qkv T×h×3h/t   proj T×(h/t)×h   fc1 T×h×f/t   fc2 T×(f/t)×h   QKᵀ, AV: b·a/t of s×d×s, s×s×d
                 (grouped-query attention: qkv T×h×(h + 2·kv_width)/t; SwiGLU: fc1 T×h×2f/t, f = ffn)
    forward      2 layer norms (read, write h'), softmax (read, write the scores), dropout (read, write, a mask),
                 2 bias-dropout-adds (read 2h', write h', a mask), bias-GELU (read, write 4h/t)
    backward     each matmul twice (the input's gradient, the weight's); the norms, softmax and GELU read what
                 they saved and the output's gradient, write the input's (3 tensors); dropout and the adds
                 read the gradient and the mask, write one or two gradients (as many bytes as forward)

Recomputation runs forward kernels again: ``"full"`` the whole layer's, ``"selective"`` attention's core
(Korthikanti et al. 2022: ``QKᵀ``, softmax, dropout, ``AV``). The last stage adds the head's matmul (``T×h×V/t``)
and the cross-entropy's passes over the logits; each step ends with the optimizer, Adam in mixed precision over
the rank's parameters (read the fp32 gradient, master weight, m and v; write all but the gradient, and the
16-bit copy: 30 bytes a parameter, Micikevicius et al. 2018's master weights and ZeRO's 16 bytes of states).

    >>> a100 = Hardware.a100()
    >>> flops = 2 * 8192 * 6144 * 2304                 # qkv of Korthikanti's 22B: 232 GFLOP, at 0.95 of peak
    >>> round(matmul_seconds(flops, a100) * 1e3, 4), round(flops / (312e12 * 0.95) * 1e3, 4)
    (0.7825, 0.7825)
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import Hardware, Layout, ModelConfig
from .params import params_per_rank, stage_layers

__all__ = ["ADAM_BYTES", "KernelTime", "curve_share", "matmul_seconds", "memory_seconds", "layer_seconds",
           "kernel_time"]

ADAM_BYTES = 30     # bytes one mixed-precision Adam step moves a parameter (module docstring)
ITEM = 2            # bytes of a 16-bit activation


def curve_share(curve: tuple[tuple[float, float], ...], size: float) -> float:
    """The share of an efficiency curve ((size, share), largest first) for a kernel of ``size``: that of the
    largest threshold at most ``size`` (Calculon's ``Processor.efficiency``, a step function).

        >>> curve_share(((128e9, 0.95), (16e9, 0.9), (0.0, 0.1)), 20e9)
        0.9
    """
    for threshold, share in curve:
        if size >= threshold:
            return share
    raise ValueError(f"the efficiency curve {curve!r} does not reach down to {size}: end it at 0.")


def memory_seconds(nbytes: float, hardware: Hardware) -> float:
    """A memory-bound kernel moving ``nbytes``: at ``memory_bandwidth`` × its size's ``memory_efficiency``."""
    return nbytes / (hardware.memory_bandwidth * curve_share(hardware.memory_efficiency, nbytes)) if nbytes else 0.0


def matmul_seconds(flops: float, hardware: Hardware, nbytes: float = 0.0) -> float:
    """A matmul of ``flops`` FLOPs: at peak × its size's ``matmul_efficiency``, plus ``nbytes`` (its inputs and
    output) through memory."""
    return flops / (hardware.flops * curve_share(hardware.matmul_efficiency, flops)) + memory_seconds(nbytes, hardware)


def _gemm(m: float, k: float, n: float, hardware: Hardware, batch: float = 1,
          weight: bool = True) -> tuple[float, float]:
    """(forward, backward) seconds of ``batch`` products of ``m×k`` by ``k×n``: backward is two of the same size,
    the input's gradient (``m×n · n×k``, its own 16-bit operands) and, for a ``weight``, the weight's
    (``k×m · m×n``), accumulated into an fp32 gradient: that ``k×n`` read and written at 4 bytes (Megatron-LM's
    ``main_grad``, mixed precision's fp32 master copy: Micikevicius et al. 2018); without a weight (attention's
    ``QKᵀ`` and ``AV``) the second product is as the first."""
    flops = 2 * m * k * n * batch
    forward = matmul_seconds(flops, hardware, ITEM * batch * (m * k + k * n + m * n))
    if not weight:
        return forward, 2 * forward
    return forward, forward + matmul_seconds(flops, hardware, ITEM * (m * k + m * n) + 8 * k * n)


@dataclass(frozen=True)
class LayerSeconds:
    """One layer, one micro-batch, one rank: ``forward``, ``backward`` and ``recompute`` seconds of kernels, and of
    them the matmuls' (``matmul``) -- the rest is memory-bound."""

    forward: float
    backward: float
    recompute: float
    matmul: float

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute


def layer_seconds(config: ModelConfig, layout: Layout, micro_batch: float, hardware: Hardware) -> LayerSeconds:
    """The kernels of one layer on one rank for one micro-batch of ``micro_batch`` sequences (module docstring)."""
    t, h, a, s = layout.tp, config.hidden, config.heads, config.seq_len / layout.sp
    T, f, d, up = micro_batch * s, config.ffn, h // a, 2 if config.gated else 1
    norm = T * (h / t if layout.sequence_parallel else h)         # elements of a norm-region tensor
    linear = [_gemm(T, h, (h + 2 * config.kv_width) / t, hardware), _gemm(T, h / t, h, hardware),
              _gemm(T, h, up * f / t, hardware), _gemm(T, f / t, h, hardware)]
    mem = lambda elements: memory_seconds(ITEM * elements, hardware)  # noqa: E731
    # the s×s part: each rank's queries against all s·sp keys (ring attention's blocks, one after another)
    scores = micro_batch * a / t * s * config.seq_len
    if hardware.attention_efficiency:       # one fused kernel; backward recomputes the scores: 2.5× forward
        # causal: the kernel skips the masked half of the s×s blocks (its measured TFLOP/s count that half too)
        core_f = 2 * micro_batch * s * config.seq_len * h / t / (hardware.flops * hardware.attention_efficiency)
        core = core_mm = (core_f, 2.5 * core_f)
    else:                                   # batched matmuls, then softmax and dropout through memory
        qk = _gemm(s, d, config.seq_len, hardware, micro_batch * a / t, weight=False)
        av = _gemm(s, config.seq_len, d, hardware, micro_batch * a / t, weight=False)
        core = (qk[0] + av[0] + mem(2 * scores) + mem(2.5 * scores), qk[1] + av[1] + mem(3 * scores) + mem(2.5 * scores))
        core_mm = (qk[0] + av[0], qk[1] + av[1])
    # the table's elements a kernel moves, forward | backward: norm 2 | 3, bias-dropout-add 3.5 | 3.5, GELU 2 | 3
    # (SwiGLU reads two f-wide inputs: one more tensor each way)
    around = (2 * mem(2 * norm) + 2 * mem(3.5 * norm) + mem((1 + up) * T * f / t),
              2 * mem(3 * norm) + 2 * mem(3.5 * norm) + mem((2 + up) * T * f / t))
    linear_f, linear_b = sum(x for x, _ in linear), sum(x for _, x in linear)
    forward, backward = linear_f + core[0] + around[0], linear_b + core[1] + around[1]
    recompute = {"none": 0.0, "selective": core[0], "full": forward}[layout.recompute]
    again = layout.recompute != "none"                         # full and selective both run the core again
    matmul = (2 if layout.recompute == "full" else 1) * linear_f + linear_b + (1 + again) * core_mm[0] + core_mm[1]
    return LayerSeconds(forward, backward, recompute, matmul)


@dataclass(frozen=True)
class KernelTime:
    """One rank's step in kernels: ``pipelined`` (its micro-batches' layers and ends, what a pipeline's bubble
    stretches; of it ``matmul`` the matmuls'), and ``optimizer`` (once a step, after the flush)."""

    pipelined: float
    matmul: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.pipelined + self.optimizer


def kernel_time(config: ModelConfig, layout: Layout, hardware: Hardware, global_batch: int) -> KernelTime:
    """The busiest pipeline stage's step: ``m`` micro-batches of ``global_batch / (dp · m)`` sequences through its
    layers (and the head and loss on the last stage), then Adam over its parameters (over ``dp`` with ZeRO).

        >>> gpt, a100 = ModelConfig(51200, 2048, 6144, 48, 64), Hardware.a100()     # Korthikanti's 22B on 8
        >>> t = kernel_time(gpt, Layout(tp=8, recompute="full"), a100, 4)
        >>> per_rank = params_per_rank(gpt, tp=8).total                       # Adam: 30 bytes each, at 0.9
        >>> round(t.optimizer * 1e3, 2), round(30 * per_rank / (2039e9 * 0.9) * 1e3, 2)
        (45.31, 45.31)
    """
    if not hardware.by_shape:
        raise ValueError(f"{hardware.name} has no matmul_efficiency curve: kernel_time prices kernels by shape; "
                         f"use Hardware.a100() or Hardware.h100(), or compute_time for one efficiency.")
    m = layout.micro_batches
    b = global_batch / (layout.dp * m)
    layer = layer_seconds(config, layout, b, hardware)
    T, V = b * config.seq_len / layout.sp, config.vocab / layout.tp
    head_f, head_b = _gemm(T, config.hidden, V, hardware)
    loss = memory_seconds(ITEM * 5 * T * V, hardware)         # the logits read and written through softmax, twice
    best = None
    for stage in range(layout.pp):
        last, layers = stage == layout.pp - 1, stage_layers(config.layers, layout.pp, stage)
        seconds = m * (layers * layer.total + (head_f + head_b + loss if last else 0.0))
        params = params_per_rank(config, layout.tp, layout.pp, stage).total / (layout.dp if layout.zero else 1)
        candidate = KernelTime(seconds, m * layers * layer.matmul, memory_seconds(ADAM_BYTES * params, hardware))
        if best is None or candidate.total > best.total:
            best = candidate
    return best
