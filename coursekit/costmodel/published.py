"""The cost model against published throughput: runs on H100s whose layout, batch and speed are in print.

Each run is data (:class:`PublishedRun`): the model in this config's terms, the layout, the hardware, the
global batch, the published tokens/s per GPU and MFU, and where they are printed. :func:`predict` prices its
step with :func:`~.step.step_time` and turns it into tokens/s per GPU and MFU (:func:`~.mfu.mfu`, the model's
FLOPs per token counted on the real model's shape). The target: predicted / published within [0.75, 1.25].

**The runs.**

* torchtitan, Llama 3.1 8B on 8 H100s, FSDP (pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md,
  Table 1): local batch 2, global 16, sequence 8,192 (its llama3_8b.toml), selective activation checkpointing,
  bf16; 5,762 tokens/s/GPU eager, 6,667 with torch.compile ("33% to 39% MFU").
* Llama 3 405B (Dubey et al. 2024, "The Llama 3 Herd of Models", arXiv:2407.21783, section 3.3.2 and Table
  4): TP 8 × CP 1 × PP 16 × DP 64 on 8,192 H100s, 430 TFLOP/s per GPU, 43% MFU; DP 128 on 16,384, 400 TFLOP/s,
  41%; sequence 8,192, 16M tokens a batch (batch/DP 32 and 16). Table 4 gives TFLOP/s, not tokens: the
  published tokens/s is TFLOP/s over the PaLM/torchtitan count ``6N + 12·L·h·s`` (a causal count, 4% smaller
  here, would raise it 4%). Its 131K-context row (CP 16, 380 TFLOP/s, 38%) is left out: its MFU hinges on
  whether Meta counted the s×s scores causally, which at 131K moves the FLOPs a third.
* Megatron-LM's weak-scaling table (README, "Training Speed and Scalability": vocabulary 131,072, sequence
  4,096, 41% to 47-48% MFU on up to 6,144 H100s) is **not here**: its rows (sizes, TP, PP, batch) exist only
  as an image (images/model_table.png) and no stored text transcribes them; a run without its layout cannot be
  priced without guessing it.

**The shape.** Llama is not GPT-shaped: grouped-query attention (8 key-value heads: K and V are ``h × 1024``,
not ``h × h``), a SwiGLU MLP (three ``h × f`` matrices, f = 14,336 or 53,248, not two of 4h), RoPE and RMSNorm
(no learned positions, no biases), an untied head. :func:`llama` keeps ``h``, ``L``, heads, ``v``, ``s`` and
the untied head, and leaves the layers GPT's ``12h²``. What that leaves, in FLOPs a token against the real
model's ``6N + 12·L·h·s`` (tests/test_costmodel_published.py recounts them):

* the layers' matrices: 12h² against Llama's 13h² (8B: -7.7% of them, -5.6% of the FLOPs) or 11.875h² (405B:
  +1.05%, +0.97%);
* the untied token embedding, which :func:`~.compute.compute_flops` prices as a matmul (its ``6·P``): +5.4%
  (8B), +0.5% (405B); positions, biases and norms: +0.4%, +0.04%;
* in all, the step's FLOPs are +0.24% (8B) and +1.5% (405B) of the real model's. Traffic is unchanged: tp's
  and pp's messages are ``b·s·h`` either way. dp's ``Ψ``, the parameters, is -6.3% (8B) and +1.1% (405B) of
  the real count (8,030,261,248 and 405,853,388,800), but dp's traffic is hidden here (``dp_overlap``).

**The assumptions**, chosen from the sources before any ratio was seen, the same for every run:

* ``efficiency`` 0.5: :class:`~.config.Hardware`'s default (Narayanan et al. 2021: 44-52% of an A100's peak,
  norms and launches inside it);
* ``dp_overlap`` 1: all three hide the data-parallel traffic behind compute (torchtitan's FSDP2 prefetches
  the next all-gather; Megatron-LM ``--overlap-grad-reduce --overlap-param-gather``; Llama 3's FSDP does not
  reshard after forward, section 3.3.2); what is left, the last bucket, is a layer's worth;
* ``pp_overlap`` 1: point-to-point sends asynchronous (Llama 3 section 3.3.2; Megatron-LM "enabled by
  default"); ``tp_overlap`` 0: tp's all-reduces on the critical path (Llama 3 names no overlap of them);
  (Table 4's figures are checked against a second transcription, Balaji's SC'24 slide at
  glennklockwood.com/garden/llama-3.1; the section 3.3.2 statements here were not re-checked against a copy)
* recomputation as each run says: torchtitan's Table 1 selective, Llama 3's 8K pre-training none (section
  3.3.2, which pre-trains its 8K sequences without activation checkpointing);
* the pipeline: Llama 3's interleaved schedule with two model chunks a rank, the only ``v`` the paper shows
  (Figure 6: 8 stages on 4 ranks); micro-batches of one sequence, so ``m`` = batch/DP;
* :meth:`~.config.Hardware.h100`: the SXM peak, 989 TFLOP/s. torchtitan's cards were 500 W HBM2e ones whose
  peak lies "between SXM and NVL" (its footnote 2; NVL: 835 TFLOP/s): the prediction is for a full SXM card.

    >>> run = LLAMA3_405B_8K
    >>> run.layout.tp * run.layout.pp * run.layout.dp, run.global_batch * run.config.seq_len
    (8192, 16777216)
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import Hardware, Layout, ModelConfig
from .mfu import flops_per_token, mfu
from .step import TrainingStepTime, step_time

__all__ = ["PublishedRun", "Prediction", "RUNS", "ASSUMPTIONS", "TORCHTITAN_8B", "TORCHTITAN_8B_COMPILED",
           "LLAMA3_405B_8K", "LLAMA3_405B_16K", "llama", "llama_matmul_params", "predict"]

# the same for every run (module docstring: why each)
ASSUMPTIONS = {"dp_overlap": 1.0, "pp_overlap": 1.0, "tp_overlap": 0.0}
LLAMA_VOCAB = 128_256


def llama(hidden: int, layers: int, heads: int, seq_len: int, name: str) -> ModelConfig:
    """A Llama 3 model in this config's terms: its h, L, heads, vocabulary and sequence, untied, no qkv bias
    (the layers GPT's 12h²: the module docstring says what that leaves and how much)."""
    return ModelConfig(LLAMA_VOCAB, seq_len, hidden, layers, heads, tied=False, qkv_bias=False, name=name)


def llama_matmul_params(hidden: int, layers: int, ffn: int, kv_heads: int = 8, head_dim: int = 128,
                        vocab: int = LLAMA_VOCAB) -> int:
    """``N`` of a real Llama 3 (the weights a token is multiplied by): per layer q and o ``h²`` each, k and v
    ``h × kv_heads·head_dim`` each, SwiGLU ``3·h·ffn``; the untied head ``v·h`` (not the embedding: a lookup).

        >>> llama_matmul_params(4096, 32, 14336)                    # Llama 3.1 8B (tests/test_mfu.py)
        7504658432
    """
    kv = kv_heads * head_dim
    return layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn) + vocab * hidden


@dataclass(frozen=True)
class PublishedRun:
    """One published training run: ``tokens_per_gpu`` (tokens/s per GPU) and ``mfu`` as printed in ``source``;
    ``matmul_params``: the real model's ``N`` (for its FLOPs a token, :func:`flops_per_token`)."""

    name: str
    config: ModelConfig
    layout: Layout
    hardware: Hardware
    global_batch: int
    tokens_per_gpu: float
    mfu: float
    matmul_params: int
    source: str

    @property
    def flops_per_token(self) -> float:
        """``6N + 12·L·h·s``: the real model's, as torchtitan and PaLM count MFU (non-causal)."""
        c = self.config
        return flops_per_token(self.matmul_params, c.layers, c.hidden, c.seq_len)


@dataclass(frozen=True)
class Prediction:
    """What the cost model says of a run: its step, tokens/s per GPU, MFU, and each over the published."""

    run: PublishedRun
    step: TrainingStepTime
    tokens_per_gpu: float
    mfu: float

    @property
    def ratio(self) -> float:
        return self.tokens_per_gpu / self.run.tokens_per_gpu


def predict(run: PublishedRun, **assumptions) -> Prediction:
    """Price ``run``'s step (:func:`step_time` with :data:`ASSUMPTIONS`, or ``assumptions`` over them) and turn it
    into tokens/s per GPU (``global_batch · s / step / gpus``) and MFU (:func:`mfu` on the real model's FLOPs)."""
    step = step_time(run.config, run.layout, run.hardware, run.global_batch, **{**ASSUMPTIONS, **assumptions})
    gpus = run.layout.gpus
    tokens = run.global_batch * run.config.seq_len / step.total / gpus
    return Prediction(run, step, tokens, mfu(tokens * gpus, run.flops_per_token, run.hardware.flops, gpus))


_TORCHTITAN = ("pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md, Table 1 (FSDP, 8 GPUs, local "
               "batch 2, global 16, selective activation checkpointing; sequence 8,192 from llama3_8b.toml)")
_LLAMA3 = "Dubey et al. 2024, The Llama 3 Herd of Models (arXiv:2407.21783), section 3.3.2, Table 4"
_8B = llama(4096, 32, 32, 8192, "Llama 3.1 8B")
_405B = llama(16384, 126, 128, 8192, "Llama 3.1 405B")
_N_8B, _N_405B = llama_matmul_params(4096, 32, 14336), llama_matmul_params(16384, 126, 53248)


def _titan(tokens: float, mfu_: float, what: str) -> PublishedRun:
    # FSDP = ZeRO-3 over dp = 8 (one node, NVLink); no gradient accumulation: one micro-batch of 2 a rank
    return PublishedRun(f"torchtitan Llama 3.1 8B, FSDP 8, {what}", _8B,
                        Layout(dp=8, zero=3, recompute="selective"), Hardware.h100(), 16, tokens, mfu_, _N_8B,
                        _TORCHTITAN)


def _llama3(dp: int, tflops: float, mfu_: float) -> PublishedRun:
    # 16M tokens a batch = 2,048 sequences of 8,192; batch/DP micro-batches of one sequence each; FSDP over dp
    # without resharding after forward: one reduce-scatter and one all-gather a step (ZeRO-1's volume), hidden
    batch = 2048
    run = PublishedRun(f"Llama 3 405B, TP 8 × PP 16 × DP {dp} on {8 * 16 * dp:,} GPUs", _405B,
                       Layout(dp=dp, tp=8, pp=16, zero=1, schedule="interleaved", micro_batches=batch // dp,
                              chunks=2), Hardware.h100(), batch, 0.0, mfu_, _N_405B, _LLAMA3)
    # Table 4 prints TFLOP/s per GPU: its tokens/s are those over the FLOPs a token
    return PublishedRun(**{**run.__dict__, "tokens_per_gpu": tflops * 1e12 / run.flops_per_token})


TORCHTITAN_8B = _titan(5762, 0.33, "eager")
TORCHTITAN_8B_COMPILED = _titan(6667, 0.39, "torch.compile")
LLAMA3_405B_8K = _llama3(64, 430, 0.43)
LLAMA3_405B_16K = _llama3(128, 400, 0.41)
RUNS = (TORCHTITAN_8B, TORCHTITAN_8B_COMPILED, LLAMA3_405B_8K, LLAMA3_405B_16K)
