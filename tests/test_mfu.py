"""FLOPs per token, MFU and HFU (coursekit.costmodel.mfu): against a hand count, the course model's own
counted FLOPs, and a published MFU.

Planted, seen failing (each bug put into mfu.py by hand, the tests run, the bug taken out):

* attention term dropped (``model_flops_per_token`` returns ``6·N``) -> test_dense_against_a_hand_count
  "the code counts 8172 FLOPs a token, the hand count 9252", the MoE one likewise, the course model's
  counted FLOPs (``assert 88866816 == 595968 * 2 * 64``: FlopCounterMode sees the bmm's), test_hfu_full...;
* 6N with the embedding counted (``matmul_params`` adds ``v·h`` once more) -> the hand counts (9648.0 against
  9252), the counted FLOPs (``88866816 == 700416.0 * 2 * 64``), test_the_tied_head_is_counted_once
  (``1428 == 3 * 12 * 36 + 11 * 6``);
* an MoE counting all E experts (``used = config.experts``) -> test_moe_against_a_hand_count ("the code
  counts 13140.0 FLOPs a token, the hand count 8820 (k = 2 of E = 4 experts a token)") and the "all experts"
  mistake no longer differing from the right answer;
* per-GPU tokens against the global peak (``mfu`` divides ``tokens_per_second`` by ``gpus`` once more) ->
  test_published_mfu "MFU 0.0422 outside torchtitan's 33% (FSDP, no compile)", test_tokens_are_the_whole_runs
  "tokens_per_second is the whole run's", test_mistakes_by_their_factors.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from coursekit.costmodel import (MISTAKES, ModelConfig, compute_flops, flops_per_token, hardware_flops_per_token,
                                 hfu, matmul_params, mfu, model_flops_per_token)
from coursekit.models import tiny_transformer

# A tiny GPT with no two sizes alike, so a swapped h and s or v shows: v 11, s 5, h 6, 3 layers, 2 heads, tied.
TINY = ModelConfig(vocab=11, seq_len=5, hidden=6, layers=3, heads=2)


def test_dense_against_a_hand_count():
    """Written from first principles, not from the code: a matmul m×k by k×n is 2mkn FLOPs; per token
    (m = 1) forward, layer by layer; backward is twice the forward (gradients of both inputs)."""
    h, s, v, L = 6, 5, 11, 3
    qkv = 2 * h * (3 * h)          # x (1×h) by W_qkv (h×3h)
    proj = 2 * h * h               # attention output by W_proj
    fc = 2 * h * (4 * h)           # MLP up
    out = 2 * (4 * h) * h          # MLP down
    scores = 2 * s * h             # q (over all heads: h numbers) dotted with s keys
    mix = 2 * s * h                # s values weighted, h numbers out
    layer = qkv + proj + fc + out + scores + mix
    head = 2 * h * v               # logits: x by the (tied) embedding matrix
    forward = L * layer + head     # the embedding lookup and the positions' add: no matmul
    counted = model_flops_per_token(TINY)
    assert counted == 3 * forward, f"the code counts {counted} FLOPs a token, the hand count {3 * forward}"
    assert 3 * forward == 9252
    assert model_flops_per_token(TINY, causal=True) == 3 * (forward - L * (scores + mix) / 2)


def test_moe_against_a_hand_count():
    """An MoE layer: attention as above, a router h -> E, and k of the E experts (h -> f -> h) a token."""
    h, s, v, L, E, k, f = 6, 5, 11, 3, 4, 2, 10
    moe = ModelConfig(vocab=v, seq_len=s, hidden=h, layers=L, heads=2, experts=E, top_k=k, expert_hidden=f)
    attention = 2 * h * 3 * h + 2 * h * h + 2 * s * h + 2 * s * h
    router = 2 * h * E
    experts = k * (2 * h * f + 2 * f * h)
    forward = L * (attention + router + experts) + 2 * h * v
    counted = model_flops_per_token(moe)
    assert counted == 3 * forward, (f"the code counts {counted} FLOPs a token, the hand count {3 * forward} "
                                    f"(k = {k} of E = {E} experts a token)")
    assert 3 * forward == 8820


def test_the_course_models_counted_flops():
    """The course transformer, forward + backward, counted by torch's FlopCounterMode (every mm, addmm, bmm:
    docs.pytorch.org, torch.utils.flop_counter.FlopCounterMode; ``mm`` counts 2mkn). Attention on the math
    path, whose QKᵀ and AV are bmm's over the whole s×s (the CPU flash kernel has no FLOP formula); the
    causal mask does not shrink them, so this is the non-causal count."""
    config, batch = ModelConfig.course(), 2
    model = tiny_transformer(seed=0)
    tokens = torch.randint(0, config.vocab, (batch, config.seq_len))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(tokens).sum().backward()
    assert counter.get_total_flops() == model_flops_per_token(config) * batch * config.seq_len


def test_the_tied_head_is_counted_once():
    tied, untied = TINY, ModelConfig(vocab=11, seq_len=5, hidden=6, layers=3, heads=2, tied=False)
    assert matmul_params(tied) == matmul_params(untied) == 3 * 12 * 36 + 11 * 6


def test_published_mfu():
    """torchtitan's benchmark (pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md, Table 1):
    Llama 3.1 8B, FSDP on 8 H100s, bf16, 5,762 tokens/s/GPU without torch.compile, 6,667 with; "33% to 39%
    MFU" against the H100 SXM's dense bf16 peak, 989 TFLOP/s (torchtitan's get_peak_flops; its footnote: the
    cards were lower-power HBM2e ones, so the true MFU is a little higher). Sequence 8,192 (its llama3_8b.toml).

    N for Llama 3.1 8B, by hand: per layer q and o 4096², k and v 4096·1024 (8 KV heads), SwiGLU 3·4096·14,336;
    32 layers; the untied head 128,256·4096 (torchtitan's num_params less the embedding, less its 65 norms)."""
    n = 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 128256 * 4096
    assert n == 7_504_658_432
    per_token = flops_per_token(n, layers=32, hidden=4096, seq_len=8192)
    without, with_compile = (mfu(8 * tps, per_token, 989e12, gpus=8) for tps in (5762, 6667))
    assert 0.33 <= without <= 0.34, f"MFU {without:.4f} outside torchtitan's 33% (FSDP, no compile)"
    assert 0.385 <= with_compile <= 0.395, f"MFU {with_compile:.4f} outside torchtitan's 39% (with compile)"


def test_tokens_are_the_whole_runs():
    """8 GPUs at t tokens/s each: the same MFU as one GPU at t."""
    one = mfu(1000.0, TINY, 1e6)
    assert mfu(8 * 1000.0, TINY, 1e6, gpus=8) == pytest.approx(one), "tokens_per_second is the whole run's"


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_hfu_counts_recomputation(recompute):
    """HFU ≥ MFU, equal without recomputation; per token, the same extra FLOPs compute_flops adds per step
    for a dense model (Narayanan et al. 2021's 8N-ish full recompute, Korthikanti et al. 2022's selective)."""
    config = ModelConfig.gpt3_175b()
    model, hardware = mfu(100.0, config, 1e15), hfu(100.0, config, 1e15, recompute=recompute)
    assert hardware >= model
    assert (hardware == model) == (recompute == "none")
    extra = compute_flops(config, tokens=1, recompute=recompute).recompute
    assert hardware_flops_per_token(config, recompute) - model_flops_per_token(config) == pytest.approx(extra, rel=1e-4)


def test_hfu_full_recompute_is_about_8n():
    h, s, v, L = 6, 5, 11, 3
    layers = L * 12 * h * h
    assert hardware_flops_per_token(TINY, "full") == 8 * layers + 6 * v * h + 16 * L * h * s


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.name)
def test_each_mistake_gives_a_wrong_answer(mistake):
    """Each of the usual mistakes, on an MoE over 8 GPUs with full recomputation's counting, moves the MFU."""
    moe = ModelConfig(vocab=11, seq_len=5, hidden=6, layers=3, heads=2, experts=4, top_k=2, expert_hidden=10)
    right = mfu(8000.0, moe, 1e9, gpus=8)
    assert mistake.wrong(8000.0, moe, 1e9, gpus=8) != pytest.approx(right), mistake.why


def test_mistakes_by_their_factors():
    right = mfu(8000.0, TINY, 1e9, gpus=8)
    wrong = {m.name: m.wrong(8000.0, TINY, 1e9, gpus=8) for m in MISTAKES}
    assert wrong["per-GPU tokens, global peak"] == pytest.approx(right / 8)
    assert wrong["global tokens, one GPU's peak"] == pytest.approx(right * 8)
    assert wrong["sparse peak"] == pytest.approx(right / 2)
    assert wrong["all experts"] == pytest.approx(right)          # dense: nothing to get wrong


def test_nonsense_is_refused():
    with pytest.raises(ValueError, match="recompute"):
        hfu(1.0, TINY, 1.0, recompute="some")
    with pytest.raises(ValueError, match="gpus"):
        mfu(1.0, TINY, 1.0, gpus=0)
