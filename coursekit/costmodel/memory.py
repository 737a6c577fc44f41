"""Memory per GPU: model states (the ZeRO paper), activations (Korthikanti et al. 2022) and what a pipeline holds.

Three terms, one function each (:func:`~.gpu_memory.memory_per_gpu` puts them together for a whole
:class:`~.config.Layout`):

* :func:`model_state_bytes` -- parameters, gradients and Adam's state per rank (Rajbhandari et al. 2020,
  section 3.1 and Figure 1), ZeRO stages 1-3 over ``dp``; chapter 02's :mod:`coursekit.measure.memory` is the
  same arithmetic for one data-parallel group and measures it.
* :func:`activation_bytes_per_layer` -- what one transformer layer keeps for its backward (Korthikanti
  et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Table 2), and
  :func:`logits_bytes` -- the output layer's inputs and the logits the loss keeps (their section 4.3).
* :func:`pipeline_activation_bytes` -- per-layer activations × layers on a stage × micro-batches in flight
  on a rank, the last from chapter 04's :func:`~coursekit.parallel.pipeline.peak_activations_formula`.

Each is checked against the published figures (the ZeRO paper's Figure 1, DeepSpeed's estimators,
Korthikanti et al.'s Figures 1 and 7 as Calculon reproduces them) and against what this course's runs
hold: the model states of chapters 02-05 and the activations of chapters 04-06 byte for byte, up to
small terms the papers leave out and the tests name (LayerNorm's statistics, attention's log-sum-exp).

    >>> model_state_bytes(7_500_000_000, dp=64, zero_stage=3).total / 1e9    # the ZeRO paper's 1.88 GB
    1.875
"""

from __future__ import annotations

from dataclasses import dataclass

from ..measure.memory import PRECISIONS as CHAPTER02_PRECISIONS
from ..measure.memory import exact_share, formula_bytes
from ..parallel.pipeline.planning import peak_activations_formula
from .config import RECOMPUTE
from .params import stage_layers

__all__ = ["PRECISIONS", "ModelStateBytes", "model_state_bytes", "ActivationBytes", "activation_bytes_per_layer",
           "split_bytes_per_token", "LogitsBytes", "logits_bytes", "PipelineActivations", "pipeline_activation_bytes"]

# bytes per parameter: (parameters, gradients, optimizer state). Chapter 02's fp32 (4, 4, 8) and mixed
# (2, 2, 12: the ZeRO paper's K = 12, an fp32 copy + m + v), and Megatron-LM's mixed precision, which keeps
# fp32 "main" gradients: 2 + 4 + 12 = 18 (theoretical_memory_usage.py; Korthikanti et al.'s Figure 1).
PRECISIONS = {**CHAPTER02_PRECISIONS, "mixed_fp32_grads": (2, 4, 12)}


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes per rank; ``live``: ZeRO-3's gathered parameters and their gradients (DeepSpeed's "largest layer")."""

    params: float
    grads: float
    optimizer: float
    live: float = 0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.live


def model_state_bytes(num_params: int, dp: int = 1, zero_stage: int = 0, precision: str = "mixed", tp: int = 1,
                      pp: int = 1, largest_layer: int = 0) -> ModelStateBytes:
    """Parameters, gradients and optimizer state per rank, with Adam (Rajbhandari et al. 2020, section 3.1).

    Ψ parameters cost 16Ψ bytes: fp32 4 + 4 + 8 (m, v), mixed precision 2 + 2 + K with K = 12 (an fp32
    copy, m and v); ``"mixed_fp32_grads"``, Megatron-LM's, keeps 4-byte gradients: 18Ψ. ZeRO over ``dp``
    ranks divides the optimizer state (stage 1), also the gradients (2), also the parameters (3): the
    paper's Figure 1, Ψ = 7.5 B on N_d = 64, is 120 / 31.4 / 16.6 / 1.88 GB.

    ``tp`` and ``pp`` simply divide Ψ (Ψ/(tp·pp) per rank). That ignores what they do not split: the
    LayerNorms and row-parallel biases every tp rank replicates, the uneven stages, and the embedding on
    the first stage (and a tied head's copy on the last) -- :func:`~.params.params_per_rank` counts those;
    pass its total with tp = pp = 1.

    ``largest_layer``: with ZeRO-3 a rank gathers a layer's full parameters to compute with it, and its
    full gradients appear before they are reduce-scattered: (parameter + gradient bytes) × largest_layer
    on top (DeepSpeed's ``estimate_zero3_model_states_mem_needs``: 4 · largest_layer_params in mixed
    precision). Ignored below stage 3.

        >>> model_state_bytes(1_000_000, dp=4, zero_stage=2, precision="fp32")
        ModelStateBytes(params=4000000, grads=1000000, optimizer=2000000, live=0)
        >>> model_state_bytes(7_500_000_000, dp=64, zero_stage=1).total / 1e9     # Figure 1's P_os
        31.40625
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0 (plain data parallelism), 1, 2 or 3 (got {zero_stage!r}).")
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {sorted(PRECISIONS)}.")
    for name, degree in (("dp", dp), ("tp", tp), ("pp", pp)):
        if degree < 1:
            raise ValueError(f"{name} must be >= 1 (got {degree}).")
    p, g, k = PRECISIONS[precision]
    states = formula_bytes(exact_share(num_params, tp * pp), dp, zero_stage, (p, g, k))  # chapter 02's formula
    live = (p + g) * largest_layer if zero_stage == 3 else 0
    return ModelStateBytes(states["params"], states["grads"], states["optimizer"], live)


@dataclass(frozen=True)
class ActivationBytes:
    """One layer's stored activations: ``hidden`` (terms in s·b·h) and ``scores`` (terms in a·s²·b)."""

    hidden: float
    scores: float

    @property
    def total(self) -> float:
        return self.hidden + self.scores


def activation_bytes_per_layer(seq_len: int, micro_batch: int, hidden: int, heads: int, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none",
                               bytes_per_element: int = 2, dropout: bool = True, kv_hidden: int | None = None,
                               ffn_hidden: int | None = None, gated: bool = False) -> ActivationBytes:
    """Bytes one transformer layer keeps for its backward: Korthikanti et al. 2022, Table 2.

    ================================  =========================
    no parallelism                    sbh(34 + 5as/h)
    tensor parallel (t)               sbh(10 + 24/t + 5as/(ht))
    tensor + sequence parallel        sbh(34/t + 5as/(ht))
    selective recomputation           the 5as/h term is gone
    full recomputation                2sbh (the layer's input)
    ================================  =========================

    The paper counts 16-bit activations and 1-byte dropout masks. Per layer, in elements of s·b·h:
    attention 5 (the qkv input, Q and K, V, the projection's input) and 1 mask, MLP 9 (the fc input, the
    GeLU input 4, the fc2 input 4) and 1 mask, the two LayerNorms' inputs 2: 16 elements at 2 bytes + 2
    masks = 34. Scores a·s²·b: the softmax output and its dropout output, 2 elements at 2 bytes, + 1 mask
    = 5. So with ``bytes_per_element=4`` the elements double and the masks do not: sbh(66 + 9as/h), not
    2 × 34. ``dropout=False`` (the course's model has none) drops the masks and the dropout's copy of the
    probabilities -- the second matmul then keeps the softmax output itself, one a·s²·b element, not two:
    sbh(32 + 2as/h) at 2 bytes, sbh(64 + 4as/h) at 4, what autograd keeps for the course block with explicit
    softmax attention (:mod:`coursekit.parallel.recompute`, tests/test_recompute.py) but LayerNorm's statistics.

    Tensor parallelism splits all but the LayerNorms' and the first matmuls' inputs and the two masks
    after the row-parallel layers (the 10: 4 elements + 2 masks); sequence parallelism splits those too,
    along the sequence. Full recomputation keeps the input, split along the sequence with sequence
    parallelism (Table 2 lists the unsplit 2sbh).

    A fused attention kernel (FlashAttention; PyTorch's ``scaled_dot_product_attention``, which the
    course model calls) never keeps the a·s²·b scores: it recomputes them in backward, so
    ``recompute="selective"`` is what it holds -- the course's runs, fp32 without dropout, measure
    exactly that plus the log-sum-exp (a·s·b floats) and LayerNorm's mean and 1/std (4·s·b floats).

    Llama's shapes (``kv_hidden``, ``ffn_hidden``, ``gated``): :func:`split_bytes_per_token`.

        >>> activation_bytes_per_layer(2048, 1, 12288, 96, tp=8).total / (2048 * 12288)   # GPT-3: 10 + 3 + 10
        23.0
        >>> activation_bytes_per_layer(2048, 1, 12288, 96, tp=8, sequence_parallel=True, recompute="selective").total / (2048 * 12288)
        4.25
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE} (got {recompute!r}).")
    if tp < 1 or heads % tp:
        raise ValueError(f"tp = {tp} must be >= 1 and divide the heads ({heads}): each rank takes whole heads.")
    e, mask = bytes_per_element, (1 if dropout else 0)
    sbh = seq_len * micro_batch * hidden
    if recompute == "full":
        return ActivationBytes(exact_share(e * sbh, tp) if sequence_parallel else e * sbh, 0)
    unsplit = (4 * e + 2 * mask) * sbh                  # 10 at 2 bytes with dropout
    split = seq_len * micro_batch * split_bytes_per_token(hidden, kv_hidden, ffn_hidden, gated, e)  # 24 for GPT
    probabilities = 2 if dropout else 1                 # the softmax output, and its dropout's output
    stored = exact_share(unsplit + split, tp) if sequence_parallel else unsplit + exact_share(split, tp)
    scores = 0 if recompute == "selective" else exact_share(heads * seq_len * seq_len * micro_batch * (probabilities * e + mask), tp)
    return ActivationBytes(stored, scores)


def split_bytes_per_token(hidden: int, kv_hidden: int | None = None, ffn_hidden: int | None = None,
                          gated: bool = False, bytes_per_element: int = 2) -> int:
    """What tensor parallelism splits of one token's stored activations, in bytes: Korthikanti et al. 2022's
    Table 2 (:func:`activation_bytes_per_layer`) at Llama's shapes. The table is for GPT: K and V ``h`` wide, a
    4h GeLU MLP. Per token the split elements are Q ``h``, K and V ``k`` each, the output projection's input
    ``h``, and the MLP's. A GeLU MLP ``f`` wide keeps the GeLU's input and the second matmul's input: ``2f``
    (Megatron-LM's ``theoretical_memory_usage.py`` writes the table as sbh(18 + 4f/h) for the same reason).
    SwiGLU (``gated``, Shazeer 2020) keeps the gate's and the up projection's outputs, which the product and
    SiLU's backward need, and the down projection's input: ``3f`` (Megatron Core's fused ``bias_swiglu`` keeps
    the gate and up outputs and recomputes SiLU). So the split term is ``(2h + 2k + 2f)·e`` a token, ``3f``
    gated: GPT's ``12h·e`` at ``k = h``, ``f = 4h``. Grouped-query attention (``kv_hidden = k``, kv heads × head
    size) takes ``2(h − k)·e`` off it; SwiGLU adds ``f·e``. The unsplit 10 (the LayerNorms' inputs, the first
    matmuls' input, two masks) and the a·s²·b scores (one per query head) do not change.

        >>> split_bytes_per_token(12288) / 12288, split_bytes_per_token(4096, 1024, 14336, gated=True)  # GPT, Llama 8B
        (24.0, 106496)
    """
    k = hidden if kv_hidden is None else kv_hidden
    f = 4 * hidden if ffn_hidden is None else ffn_hidden
    if not (0 < k <= hidden and f > 0):
        raise ValueError(f"kv_hidden must be in (0, hidden = {hidden}] and ffn_hidden > 0 (got {kv_hidden}, "
                         f"{ffn_hidden}): pass kv heads × head size and the MLP's width, or None for GPT's.")
    return bytes_per_element * (2 * hidden + 2 * k + (3 if gated else 2) * f)


@dataclass(frozen=True)
class LogitsBytes:
    """The output layer's stored inputs (final norm, head) and the logits the cross-entropy keeps."""

    inputs: float
    logits: float

    @property
    def total(self) -> float:
        return self.inputs + self.logits


def logits_bytes(seq_len: int, micro_batch: int, hidden: int, vocab: int, tp: int = 1,
                 sequence_parallel: bool = False, bytes_per_element: int = 2,
                 logits_bytes_per_element: int = 4) -> LogitsBytes:
    """What the last stage keeps after its head: s·b·v logits (the loss's softmax needs them) and the inputs.

    Korthikanti et al. 2022, section 4.3: the final LayerNorm's and the head's inputs, 2 · sbh · 2 bytes
    (split along the sequence with sequence parallelism), and the logits in fp32 for the cross-entropy,
    4sbv, split t ways by a vocabulary-parallel head: together 4sbh/t (1 + v/h) with tp + sp -- the term
    Megatron-LM's ``theoretical_memory_usage.py`` adds when pp = 1. Chapter 05's vocabulary-parallel loss
    holds s·b·v/t logits per rank the same way.

        >>> logits_bytes(1024, 8, 768, 50257)           # GPT-2 small: the logits dwarf the inputs
        LogitsBytes(inputs=25165824, logits=1646821376)
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1 (got {tp}).")
    sbh = seq_len * micro_batch * hidden
    inputs = 2 * bytes_per_element * sbh
    inputs = exact_share(inputs, tp) if sequence_parallel else inputs
    return LogitsBytes(inputs, exact_share(seq_len * micro_batch * vocab * logits_bytes_per_element, tp))


@dataclass(frozen=True)
class PipelineActivations:
    """``in_flight`` micro-batches (interleaved: chunk-micro-batches) of ``layers`` layers, ``per_layer`` bytes each."""

    per_layer: float
    layers: int
    in_flight: int

    @property
    def total(self) -> float:
        return self.per_layer * self.layers * self.in_flight


def pipeline_activation_bytes(per_layer: float, layers: int, pp: int = 1, micro_batches: int = 1,
                              schedule: str = "1f1b", chunks: int = 1, rank: int = 0) -> PipelineActivations:
    """Activations pipeline rank ``rank`` holds at its peak: per-layer bytes × its layers × micro-batches in flight.

    The micro-batches whose forward has run and whose backward has not, at most, from chapter 04's
    :func:`~coursekit.parallel.pipeline.peak_activations_formula`: GPipe m; 1F1B min(p − r, m), so rank 0
    holds p micro-batches of L/p layers, L layers' worth whatever p (Narayanan et al. 2021); ZB-H1 the
    same (Qi et al. 2023: its deferred weight gradients keep only the layers' inputs); interleaved with v
    chunks of L/(pv) layers, (v − 1)·p + 2(p − 1 − r) + 1 chunks on rank r (m a multiple of p): on rank
    0 L(1 + (p − 1)/(pv)) layers' worth, the factor of Korthikanti et al. 2022, section 4.2.3. Layers on a stage as
    :func:`~.params.stage_layers` (the first L mod p stages one more); per chunk, rounded up.

        >>> pipeline_activation_bytes(1.0, 96, pp=8, micro_batches=64, schedule="1f1b").total       # L layers
        96.0
        >>> pipeline_activation_bytes(1.0, 96, pp=8, micro_batches=64, schedule="interleaved", chunks=3).total
        124.0
    """
    if not 0 <= rank < pp:
        raise ValueError(f"rank must be 0 to pp - 1 = {pp - 1} (got {rank}).")
    v = chunks if schedule == "interleaved" else 1
    if layers < pp * v:
        raise ValueError(f"{layers} layers cannot fill {pp} stages × {v} chunks: each chunk needs at least one layer.")
    held = stage_layers(layers, pp, rank) if v == 1 else -(-layers // (pp * v))
    return PipelineActivations(per_layer, held, peak_activations_formula(schedule, pp, micro_batches, rank, v))
