"""Models as they are (coursekit/costmodel/config.py's kv_heads, ffn_hidden, gated): Llama priced as Llama.

Sources: Llama 3.1 8B's shape (meta-llama/Llama-3.1-8B, config.json: hidden 4,096, 32 layers, 32 heads, 8
key-value heads, intermediate 14,336, vocabulary 128,256, untied) and its parameter count, 8,030,261,248
(the same repository's model.safetensors.index.json, total_size 16,060,522,496 bytes of bf16). GPT-shaped counts:
Korthikanti et al. 2022's ``12h²`` a layer.

Planted and seen failing: K and V at h wide on the ring ("(4.0, Collective(... numel=33554432.0 ...))": 4× the
hand count); layer_matrices with two MLP matrices for SwiGLU ("assert 159383552 == 218103808"); the kernels' qkv
at 3h/t wide ("1.0882 of the hand count").
"""

import pytest

from coursekit.costmodel import Hardware, Layout, ModelConfig, matmul_params, num_params, step_collectives
from coursekit.costmodel.kernels import layer_seconds

LLAMA_8B = ModelConfig(128256, 8192, 4096, 32, 32, tied=False, qkv_bias=False, name="Llama 3.1 8B", kv_heads=8,
                       ffn_hidden=14336, gated=True)


def test_llama_8b_matrices_are_metas_count():
    """Per layer q and o 4,096², k and v 4,096 × 1,024 (8 heads of 128), SwiGLU 3 × 4,096 × 14,336; the head
    128,256 × 4,096; with the token embedding and the 65 RMSNorm weights (2 a layer + the final one) the
    published 8,030,261,248."""
    h, kv, f, v, L = 4096, 8 * 128, 14336, 128256, 32
    layer = 2 * h * h + 2 * h * kv + 3 * h * f
    assert LLAMA_8B.layer_matrices == layer == 218_103_808
    assert matmul_params(LLAMA_8B) == L * layer + v * h
    assert matmul_params(LLAMA_8B) + v * h + (2 * L + 1) * h == 8_030_261_248
    gpt = ModelConfig(128256, 8192, 4096, 32, 32)
    assert gpt.layer_matrices == 12 * h * h and gpt.kv_width == h and gpt.ffn == 4 * h


def test_context_parallel_sends_k_and_v_at_their_width():
    """Ring attention over sp = 2: each rank's K and V block is b·s/G × kv_width = 1 · 4,096 × 1,024 (not × 4,096),
    sent G − 1 = 1 time forward a layer: 2 · 4,096 · 1,024 elements, 32 layers."""
    rows = step_collectives(LLAMA_8B, Layout(sp=2), micro_batch=1)
    forward = next(r for r in rows if r.axis == "sp" and "forward" in r.what)
    assert (forward.numel, forward.count) == (2 * 4096 * 1024, 1 * 32), (forward.numel / (2 * 4096 * 1024), forward)


def test_kernels_run_the_real_shapes_matmuls():
    """With every matmul at peak and memory free, one layer's forward is its FLOPs over peak: 2·T·layer_matrices/t
    for the weights (qkv (h + 2·kv)/t wide, SwiGLU's fc1 2f/t) and 4·b·s²·h/t for QKᵀ and AV, by hand."""
    ideal = Hardware(flops=1e15, memory_bandwidth=1e30, matmul_efficiency=((0.0, 1.0),))
    t, T, s, h = 4, 8192, 8192, 4096
    layer = layer_seconds(LLAMA_8B, Layout(tp=t), 1, ideal)
    by_hand = (2 * T * (2 * h * h + 2 * h * 1024 + 3 * h * 14336) / t + 4 * s * s * h / t) / 1e15
    assert layer.forward == pytest.approx(by_hand, rel=1e-6), f"{layer.forward / by_hand:.4f} of the hand count"


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="kv_heads must divide heads"):
        ModelConfig(16, 8, 64, 1, 8, kv_heads=3)
    with pytest.raises(ValueError, match="ffn_hidden must be >= 1"):
        ModelConfig(16, 8, 64, 1, 8, ffn_hidden=0)


def test_h100_hbm2e_holds_96_gb():
    assert Hardware.h100_hbm2e().memory == 96e9 and Hardware.h100_hbm2e().flops == Hardware.h100().flops
    assert num_params(LLAMA_8B).head == 128256 * 4096
