"""Model and hardware FLOPs utilisation: the share of a chip's peak that a training run turns into model work.

One number per token, counted once (:func:`model_flops_per_token`)::

    F = 6·N + 12·L·h·s        N: the weights a token is multiplied by (below), L layers, h hidden, s sequence

and the two utilisations over ``gpus`` chips of ``peak_flops`` each, at ``tokens_per_second`` for the whole
run (all GPUs together)::

    MFU = tokens_per_second · F / (gpus · peak_flops)                 (Chowdhery et al. 2022, PaLM, appendix B)
    HFU = tokens_per_second · F_hardware / (gpus · peak_flops)        (F_hardware: F + what recomputation adds)

**Where the terms come from.** A matmul of ``m×k`` by ``k×n`` is ``2mkn`` FLOPs forward (a multiply and an
add per term) and twice that backward (the gradients of both inputs), so every weight a token goes through
costs it ``2 + 4 = 6`` FLOPs (Kaplan et al. 2020, section 2.1). Attention's two ``s×s`` products (``QKᵀ`` and
``AV``) have no weights: per token and layer ``2·s·h`` each forward, ``4·s·h``, and ``12·s·h`` with the
backward. PaLM's appendix B writes the same per token as ``6N + 12LHQT`` (``H`` heads of size ``Q``: ``H·Q
= h``, ``T`` = s); torchtitan's ``get_num_flop_per_token`` computes ``6 * num_params + 12 * l * h * q * t``
(torchtitan/utils.py, end of 2024; its comment: "we follow the convention and do not account for sparsity
in causal attention"); nanoGPT's ``estimate_mfu`` is the same. **Non-causal**: the whole score matrix is
counted, as PaLM, torchtitan and Narayanan et al. 2021 do; ``causal=True`` halves the attention term, as
FlashAttention's benchmarks count a causal kernel (Dao 2023). The flash kernel's recomputation of the scores
in the backward is not model work and is never counted here, not even in HFU.

**N, the weights a token is multiplied by**: per layer ``qkv 3h² + proj h² + MLP 8h²`` = ``12h²``, and the
output head ``v·h`` once (tied or not: tied, the head *is* the embedding matrix, and its matmul is real
work). Not the token embedding (a lookup, no FLOPs), not the learned positions (an add), not the biases and
LayerNorms (elementwise; torchtitan counts its norms in ``num_params``, 0.004% of Llama 3 8B). An MoE layer:
``4h²`` of attention, the router ``E·h``, and the ``k`` experts a token goes to, ``k·2hf`` -- *not* all
``E`` (Fedus et al. 2021's "FLOPs per token" are the active parameters'; torchtitan's MoE models count
``nparams_experts * top_k // num_experts``).

**Recomputation** (HFU only: MFU counts the model's work, whatever the hardware repeats). Full: one more
forward of every layer, ``2·N_layers + 4·L·h·s`` more per token (Narayanan et al. 2021's 96 in place of 72;
the head is not recomputed); selective: attention's core only, ``4·L·h·s`` more (Korthikanti et al. 2022).
:func:`~.compute.compute_flops` adds the same, over a step.

    >>> gpt3 = ModelConfig.gpt3_175b()
    >>> round(model_flops_per_token(gpt3) / 1e9, 1)       # 6 · 174.6 G + 12 · 96 · 12,288 · 2,048
    1076.4
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .config import RECOMPUTE, ModelConfig

__all__ = ["matmul_params", "attention_flops_per_token", "flops_per_token", "model_flops_per_token",
           "hardware_flops_per_token", "mfu", "hfu", "Mistake", "MISTAKES"]


def matmul_params(config: ModelConfig, experts: int | None = None) -> int:
    """``N``: the weights one token is multiplied by, forward -- ``L·12h² + v·h`` dense; an MoE layer
    ``4h² + E·h + k·2hf``. ``experts``: how many experts a token is counted through (default ``top_k``).

        >>> matmul_params(ModelConfig.course())               # 2 · 12 · 64² + 16 · 64 (the tied head)
        99328
    """
    h = config.hidden
    if config.experts:
        used = config.top_k if experts is None else experts
        layer = 4 * h * h + config.experts * h + used * 2 * h * config.expert_ffn
    else:
        layer = config.layer_matrices          # 12h² for a GPT block; Llama's GQA and SwiGLU otherwise
    return config.layers * layer + config.vocab * h


def attention_flops_per_token(config: ModelConfig, seq_len: int | None = None, causal: bool = False) -> float:
    """``12·L·h·s`` (forward ``4·L·h·s``: ``QKᵀ`` and ``AV``, ``2·s·h`` each), halved with ``causal=True``."""
    s = config.seq_len if seq_len is None else seq_len
    return 12 * config.layers * config.hidden * s / (2 if causal else 1)


def flops_per_token(matmul_params: float, layers: int, hidden: int, seq_len: int, causal: bool = False) -> float:
    """PaLM's and torchtitan's form for any model: ``6·N + 12·L·h·s`` (``h`` = heads × head size).

        >>> round(flops_per_token(7_504_658_432, 32, 4096, 8192) / 1e9, 2)   # Llama 3.1 8B, 8,192 tokens (tests)
        57.91
    """
    return 6 * matmul_params + 12 * layers * hidden * seq_len / (2 if causal else 1)


def model_flops_per_token(config: ModelConfig, seq_len: int | None = None, causal: bool = False) -> float:
    """Training FLOPs per token, forward and backward: ``6·N + 12·L·h·s`` (module docstring)."""
    return 6 * matmul_params(config) + attention_flops_per_token(config, seq_len, causal)


def hardware_flops_per_token(config: ModelConfig, recompute: str = "none", seq_len: int | None = None,
                             causal: bool = False) -> float:
    """What the hardware computes per token: the model's FLOPs plus one more forward of what is recomputed --
    ``"full"``: the layers (``2·N_layers``) and attention's core (``4·L·h·s``); ``"selective"``: the core."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE} (got {recompute!r}).")
    core = attention_flops_per_token(config, seq_len, causal) / 3      # one forward of QKᵀ and AV
    layers = matmul_params(config) - config.vocab * config.hidden       # the head is not recomputed
    extra = {"none": 0.0, "selective": core, "full": 2 * layers + core}[recompute]
    return model_flops_per_token(config, seq_len, causal) + extra


def _per_token(model: ModelConfig | float, seq_len: int | None) -> float:
    return model_flops_per_token(model, seq_len) if isinstance(model, ModelConfig) else float(model)


def _check(tokens_per_second: float, peak_flops: float, gpus: int) -> None:
    if tokens_per_second < 0 or peak_flops <= 0 or gpus < 1:
        raise ValueError(f"need tokens_per_second >= 0, peak_flops > 0, gpus >= 1 (got {tokens_per_second}, "
                         f"{peak_flops}, {gpus}).")


def mfu(tokens_per_second: float, model: ModelConfig | float, peak_flops: float, gpus: int = 1,
        seq_len: int | None = None) -> float:
    """Model FLOPs utilisation: ``tokens_per_second · F / (gpus · peak_flops)``.

    ``tokens_per_second``: the whole run's (all ``gpus`` together; a per-GPU figure times ``gpus``);
    ``peak_flops``: *one* chip's dense peak at the precision trained (H100 SXM bf16: 989e12, not the 1,979e12
    of 2:4 sparsity); ``model``: a :class:`ModelConfig`, or FLOPs per token already counted
    (:func:`flops_per_token`, for a model this config cannot describe).

        >>> round(mfu(8 * 5_762, flops_per_token(7_504_658_432, 32, 4096, 8192), 989e12, gpus=8), 3)
        0.337
    """
    _check(tokens_per_second, peak_flops, gpus)
    return tokens_per_second * _per_token(model, seq_len) / (gpus * peak_flops)


def hfu(tokens_per_second: float, config: ModelConfig, peak_flops: float, gpus: int = 1,
        recompute: str = "none", seq_len: int | None = None) -> float:
    """Hardware FLOPs utilisation: as :func:`mfu`, counting what ``recompute`` makes the hardware do again
    (≥ MFU; equal without recomputation)."""
    _check(tokens_per_second, peak_flops, gpus)
    return tokens_per_second * hardware_flops_per_token(config, recompute, seq_len) / (gpus * peak_flops)


# ------------------------------------------------------------------------------------------- the usual mistakes
@dataclass(frozen=True)
class Mistake:
    """A wrong way to compute MFU: ``wrong`` takes :func:`mfu`'s arguments (a :class:`ModelConfig`)."""

    name: str
    why: str
    wrong: Callable[..., float]


def _with_flops(per_token: Callable[[ModelConfig, int | None], float]) -> Callable[..., float]:
    def wrong(tokens_per_second, config, peak_flops, gpus=1, seq_len=None):
        return mfu(tokens_per_second, per_token(config, seq_len), peak_flops, gpus)
    return wrong


def _embedding(config, seq_len):
    return model_flops_per_token(config, seq_len) + 6 * config.vocab * config.hidden


def _head_dropped(config, seq_len):
    return model_flops_per_token(config, seq_len) - 6 * config.vocab * config.hidden


def _all_experts(config, seq_len):
    return 6 * matmul_params(config, experts=config.experts) + attention_flops_per_token(config, seq_len)


def _no_attention(config, seq_len):
    return 6 * matmul_params(config)


MISTAKES = (
    Mistake("embedding counted", "the token embedding's lookup counted as a v×h matmul (tied: the shared "
            "matrix counted twice, as embedding and head): 6·(N + v·h)", _with_flops(_embedding)),
    Mistake("tied head dropped", "'excluding the embedding' from a tied model drops the head, whose v×h matmul "
            "is real: 6·(N − v·h)", _with_flops(_head_dropped)),
    Mistake("all experts", "an MoE's E experts counted, not the k a token goes to",
            _with_flops(_all_experts)),
    Mistake("no attention", "6·N alone: attention's s×s products left out (large at long sequences)",
            _with_flops(_no_attention)),
    Mistake("per-GPU tokens, global peak", "one GPU's tokens/s against all the GPUs' peak: gpus× too low",
            lambda t, c, p, gpus=1, seq_len=None: mfu(t / gpus, c, p, gpus, seq_len)),
    Mistake("global tokens, one GPU's peak", "the whole run's tokens/s against one GPU's peak: gpus× too high",
            lambda t, c, p, gpus=1, seq_len=None: mfu(t, c, p, 1, seq_len)),
    Mistake("sparse peak", "the 2:4 sparsity peak (2× the dense one) for a dense run: half the MFU",
            lambda t, c, p, gpus=1, seq_len=None: mfu(t, c, 2 * p, gpus, seq_len)),
    Mistake("recomputation counted", "full recomputation's extra forward counted as model work: that is HFU",
            lambda t, c, p, gpus=1, seq_len=None: hfu(t, c, p, gpus, "full", seq_len)),
)
