"""The cost model against published H100 throughput (coursekit/costmodel/published.py): torchtitan's Llama 3.1
8B on 8 GPUs, Llama 3 405B on 8,192 and 16,384 GPUs, and NVIDIA's DGX Cloud benchmarks of NeMo (Megatron Core),
BF16: Llama 3.1 8B on 8 and 128 GPUs (CP 2) and 70B on 64 (TP 4 × PP 4, VP 5, CP 2), each priced as Llama
(grouped-query attention, SwiGLU, untied head) on :meth:`Hardware.h100`, by shape (issue 59).

Predicted / published: 405B 1.007 and 0.904, NeMo 8B 1.079 and 1.071, NeMo 70B 1.117 -- within ±15%, asserted;
torchtitan's eager and compiled runs 1.74 and 1.50, the one miss, asserted as such (test_torchtitan_is_the_miss
says its cause).

The inputs are recounted by hand here (GPU counts, tokens a batch, the real models' N, the MFU the published
throughput implies, the config's parameters against Meta's counts), and the parts of the steps (tp's and CP's
traffic, the flash kernel's seconds, the bubble's relation between the 405B's two runs) from the formulas, not
the code.

Planted, seen failing (each put in by hand, these tests run, the bug taken out):

* the causal half not skipped (``kernels.layer_seconds`` prices ``4·b·s·S·h``) -> test_flash_attention_by_hand;
* Calculon's A100 curve kept for the H100 (``H100_MATMUL`` = 0.95 / 0.9 / 0.6 / 0.1) -> test_h100_preset;
* grouped-query attention dropped (``published.llama`` without ``kv_heads``) -> test_nemo_8b_cp_by_hand,
  test_the_config_is_llama;
* NeMo 70B's ``tp_comm_overlap`` dropped -> test_nemo_70b_hides_tp (its ratio test still passes: 1.02);
* hidden traffic free (``step._usage`` returns 0) -> test_h100_runs_within_15_percent[nemo-70B] (1.151),
  test_nemo_70b_hides_tp, test_nemo_8b_cp_by_hand;
* the GPU count without CP (``_dgxc`` divides the job's tokens/s by ``gpus // sp``) -> every NeMo test of its
  inputs and ratio.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from coursekit.costmodel import Hardware, Layout, mfu, num_params
from coursekit.costmodel.kernels import layer_seconds
from coursekit.costmodel.published import (LLAMA3_405B_8K, LLAMA3_405B_16K, NEMO_8B, NEMO_8B_128, NEMO_70B, RUNS,
                                           TORCHTITAN_8B, TORCHTITAN_8B_COMPILED, predict)

H100_PEAK = 989e12                      # H100 SXM, bf16 dense
NVLINK = 450e9 * 0.65                   # per direction, at Calculon's share (systems/h100_80g_nvl8.json)


def _within(run, band):
    p = predict(run)
    assert 1 - band <= p.ratio <= 1 + band, (f"{run.name}: predicted {p.tokens_per_gpu:.1f} tokens/s/GPU, published "
                                             f"{run.tokens_per_gpu:.1f}, ratio {p.ratio:.3f} outside ±{band:.0%}")
    return p


@pytest.mark.parametrize("run", [LLAMA3_405B_8K, LLAMA3_405B_16K, NEMO_8B, NEMO_8B_128, NEMO_70B],
                         ids=["405B-8192", "405B-16384", "nemo-8B-8", "nemo-8B-128", "nemo-70B"])
def test_h100_runs_within_15_percent(run):
    """Issue 59's band: 1.007, 0.904, 1.079, 1.071 and 1.117 predicted / published. The 70B's tp traffic (TP 4 with
    sequence parallelism, 2.4 s a step) is hidden by its ``ub_tp_comm_overlap`` but not free: its compute loses
    0.15 of that time (Calculon's NVLink ``processor_usage``); free, the 70B would be 1.151, exposed 1.02."""
    _within(run, 0.15)


def test_torchtitan_is_the_miss():
    """5,762 tokens/s/GPU eager, 6,667 compiled: one step, one prediction (9,999: 1.74 and 1.50 of them), the
    one miss (issue 59 allows it, with its cause). Its published MFU, 33-39%, is far under NeMo's 58-60% on the
    same model: what the model does not price is (i) the 500 W HBM2e card's lower clock ("between SXM and NVL",
    torchtitan's footnote 2; its peak is not published, 989 TFLOP/s is assumed), (ii) eager PyTorch's launches and
    unfused RMSNorm, SwiGLU and RoPE passes (compile's 16% between the two runs is only part of them), and (iii)
    FSDP2's gathers and casts on the critical path of a step of two sequences. No single prediction can be
    within ±15% of both unless it lies in [0.85 · 6,667, 1.15 · 5,762] = [5,667, 6,626]."""
    eager, compiled = predict(TORCHTITAN_8B), predict(TORCHTITAN_8B_COMPILED)
    assert eager.tokens_per_gpu == compiled.tokens_per_gpu, "one step, two published speeds"
    assert eager.tokens_per_gpu > 1.15 * 6667, "no longer a miss: move torchtitan into the ±15% test"
    assert TORCHTITAN_8B.hardware.attention_efficiency == pytest.approx(3.5 / (H100_PEAK / 333e12
                                                                               + 2.5 * H100_PEAK / 318e12))


def test_the_bubble_is_why_16k_is_slower():
    """The same batch on twice the GPUs: m = 16 micro-batches for p = 16 stages instead of 32. Published: 400 / 430
    = 0.93 of the tokens/s per GPU; the model 0.835."""
    eight, sixteen = predict(LLAMA3_405B_8K), predict(LLAMA3_405B_16K)
    drop = sixteen.tokens_per_gpu / eight.tokens_per_gpu
    assert 0.80 <= drop <= 0.95, f"16,384 GPUs at {drop:.3f} of 8,192's tokens/s per GPU: no bubble left to slow it?"


def test_405b_tp_and_bubble_by_hand():
    """tp per micro-batch: 33 ring all-reduces of b·s·h (2 a layer forward and backward over the busiest stage's 8
    layers, + the head's input gradient) and 3 of b·s (the vocabulary-parallel loss), each 2(t − 1) steps of N/t on
    NVLink at 0.65 of 450 GB/s, 5 µs. The bubble, (p − 1)/(v·m) of a micro-batch's whole time: the same seconds on
    8,192 and 16,384 GPUs (m 32 and 16, each micro-batch one sequence of the same work), and on 8,192 GPUs 15/64 of
    the micro-batches' kernels and exposed tp."""
    h, s, t = 16384, 8192, 8

    def ring(n):
        return 2 * (t - 1) * (5e-6 + n / t * 2 / NVLINK)
    eight, sixteen = predict(LLAMA3_405B_8K).step, predict(LLAMA3_405B_16K).step
    for step, m in ((eight, 32), (sixteen, 16)):
        tp = m * (33 * ring(s * h) + 3 * ring(s))
        assert step.exposed.tp == pytest.approx(tp, rel=1e-9), f"tp {step.exposed.tp:.3f} s exposed, by hand {tp:.3f} s"
    assert sixteen.bubble == pytest.approx(eight.bubble, rel=1e-9), (eight.bubble, sixteen.bubble)
    # the optimizer is the same on both (ZeRO-1 over dp halves it: small); the micro-batches' part is m times one
    one = (eight.compute - sixteen.compute) / 16 + eight.exposed.tp / 32          # one micro-batch, kernels + tp
    assert eight.bubble == pytest.approx(15 / 2 * one, rel=0.01), f"bubble {eight.bubble:.3f} s, by hand {15 / 2 * one:.3f}"
    # asynchronous sends (Llama 3, section 3.3.2), between nodes: hidden, 0.02 of their time off the compute
    assert eight.exposed.pp == pytest.approx(0.02 * eight.communication.pp) and eight.communication.pp > 0


def test_gpu_counts_and_batches_are_the_sources():
    """GPUs = TP·PP·DP·CP; Llama 3's 16M tokens a batch = batch/DP 32 (and 16) × DP × 8,192; torchtitan's local
    batch 2 × 8 ranks = 16."""
    assert [r.layout.gpus for r in RUNS] == [8, 8, 8 * 16 * 64, 8 * 16 * 128, 8, 128, 64]
    for run, per_dp in ((LLAMA3_405B_8K, 32), (LLAMA3_405B_16K, 16)):
        assert run.global_batch == per_dp * run.layout.dp and run.layout.micro_batches == per_dp
        assert run.global_batch * 8192 == 16 * 2**20
    assert TORCHTITAN_8B.global_batch == 2 * 8 and TORCHTITAN_8B.layout.micro_batches == 1
    assert TORCHTITAN_8B.layout.recompute == "selective" and LLAMA3_405B_8K.layout.recompute == "none"


def test_published_throughput_implies_the_published_mfu():
    """By hand: N of Llama 3.1 8B, 70B and 405B (q, o h²; k, v h·1,024; SwiGLU 3·h·f; the untied head v·h), the
    FLOPs a token 6N + 12·L·h·s, and tokens/s × F / 989 TFLOP/s within a point of the printed MFU."""
    n8 = 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 128256 * 4096
    n405 = 126 * (2 * 16384**2 + 2 * 16384 * 1024 + 3 * 16384 * 53248) + 128256 * 16384
    n70 = 80 * (2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672) + 128256 * 8192
    f8, f405 = 6 * n8 + 12 * 32 * 4096 * 8192, 6 * n405 + 12 * 126 * 16384 * 8192
    f70 = 6 * n70 + 12 * 80 * 8192 * 8192
    assert (TORCHTITAN_8B.flops_per_token, LLAMA3_405B_8K.flops_per_token) == (f8, f405)
    assert NEMO_8B.flops_per_token == f8 and NEMO_70B.flops_per_token == f70
    for run in RUNS:
        implied = run.tokens_per_gpu * run.flops_per_token / H100_PEAK
        assert implied == pytest.approx(run.mfu, abs=0.01), f"{run.name}: implies MFU {implied:.3f}, printed {run.mfu}"
        assert mfu(run.tokens_per_gpu * run.layout.gpus, run.flops_per_token, H100_PEAK, run.layout.gpus) == \
            pytest.approx(implied)
    assert LLAMA3_405B_8K.tokens_per_gpu * f405 == pytest.approx(430e12)


@pytest.mark.parametrize("run,real,ffn", [(TORCHTITAN_8B, 8_030_261_248, 14336),
                                          (LLAMA3_405B_8K, 405_853_388_800, 53248), (NEMO_70B, 70_553_706_496, 28672)],
                         ids=["8B", "405B", "70B"])
def test_the_config_is_llama(run, real, ffn):
    """The config's parameters against Meta's count (matrices, an untied embedding and head, two RMSNorms a layer
    and a final one): what is left is GPT's learned positions (s·h) and the biases and norm shifts the config keeps
    (per layer the SwiGLU's 2f, proj's and out's h, the two norms' 2h; the final norm's h), under 0.5%."""
    c = run.config
    h, L, s = c.hidden, c.layers, c.seq_len
    assert (c.kv_width, c.ffn, c.gated, c.tied) == (1024, ffn, True, False)
    assert num_params(c).total - real == s * h + L * (2 * ffn + 4 * h) + h
    assert (num_params(c).total - real) / real < 0.005


def test_h100_preset():
    """989 TFLOP/s, NVLink 450 GB/s, 50 GB/s a NIC, 80 GB, HBM3 3.35 TB/s; the matmul curve's top is the measured
    794.5 TFLOP/s (stas00/ml-engineering's MAMF table), the rest Calculon's shares scaled alike; cuDNN's attention
    from the FlashAttention-3 paper's 529 (forward) and 518 (backward, 2.5× the FLOPs) TFLOP/s."""
    h100 = Hardware.h100()
    assert (h100.flops, h100.intra_bandwidth, h100.bandwidth, h100.gpus_per_node, h100.memory, h100.memory_bandwidth) \
        == (989e12, 450e9, 50e9, 8, 80e9, 3.35e12)
    scale = 794.5 / 989 / 0.95
    assert [share for _, share in h100.matmul_efficiency] == pytest.approx([0.95 * scale, 0.9 * scale, 0.6 * scale,
                                                                           0.1 * scale])
    assert h100.matmul_efficiency[0][1] == pytest.approx(0.8033, abs=1e-4)
    assert h100.attention_efficiency == pytest.approx(3.5 / (989 / 529 + 2.5 * 989 / 518))
    assert h100.by_shape and Hardware().efficiency == 0.5
    assert (h100.intra_processor_usage, h100.net_processor_usage) == (0.15, 0.02)    # Calculon's processor_usage
    with pytest.raises(ValueError, match="attention is one of"):
        Hardware.h100("flash3")
    with pytest.raises(ValueError, match="intra_processor_usage is a share"):
        Hardware(intra_processor_usage=1.0)


def test_flash_attention_by_hand():
    """The fused kernel's seconds for one NeMo 8B layer (CP 2: 4,096 queries against 8,192 keys, one sequence):
    forward 2·s·S·h FLOPs (the causal half of 4·s·S·h) at the kernel's share, backward 2.5× it. Read as the
    difference between the kernel at its share and at 1.5 times it (a third of its time) (everything else in the layer the same)."""
    h100 = Hardware.h100()
    config, layout = NEMO_8B.config, Layout(sp=2)
    slow = layer_seconds(config, layout, 1, h100)
    fast = layer_seconds(config, layout, 1, replace(h100, attention_efficiency=1.5 * h100.attention_efficiency))
    forward = 2 * 4096 * 8192 * 4096 / (989e12 * h100.attention_efficiency)
    assert 3 * (slow.forward - fast.forward) == pytest.approx(forward, rel=1e-9)
    assert 3 * (slow.backward - fast.backward) == pytest.approx(2.5 * forward, rel=1e-9)


# NVIDIA's DGX Cloud benchmarks (dgxc-benchmarking, NeMo 24.12 on Megatron Core), BF16: printed step, tokens/s of
# the whole job, MFU, and the header's degrees -- (run, GPUs, TP, PP, CP, VP, GA, GBS, step s, tokens/s, MFU)
NEMO_TABLES = [(NEMO_8B, 8, 1, 1, 2, 1, 32, 128, 12.78, 82028, 0.5999),
               (NEMO_8B_128, 128, 1, 1, 2, 1, 32, 2048, 13.16, 1275155, 0.5828),
               (NEMO_70B, 64, 4, 4, 2, 5, 64, 128, 14.61, 71756, 0.5452)]


@pytest.mark.parametrize("row", NEMO_TABLES, ids=["8B-8", "8B-128", "70B-64"])
def test_nemo_inputs_are_the_tables(row):
    """GPUs = TP·PP·CP·DP with DP what the header leaves; m = GBS/DP = GA micro-batches of one sequence (MBS 1);
    the printed step × tokens/s = GBS × 8,192 (the step rounded to 10 ms); the MFU the tokens/s imply on
    6N + 12·L·h·s within half a point of the printed one (the README's model FLOPs a sequence, 4.74e14 and
    3.94e15, are 8,192 times it); Megatron's distributed optimizer ZeRO-1; no recomputation; cuDNN attention."""
    run, gpus, tp, pp, cp, vp, ga, gbs, step, tokens, printed = row
    lay = run.layout
    assert (lay.tp, lay.pp, lay.sp, lay.chunks) == (tp, pp, cp, vp)
    assert lay.gpus == gpus == tp * pp * cp * lay.dp
    assert run.global_batch == gbs == lay.dp * lay.micro_batches and lay.micro_batches == ga
    assert step * tokens == pytest.approx(gbs * 8192, rel=0.002)
    assert run.tokens_per_gpu * lay.gpus == tokens and run.mfu == printed
    assert run.tokens_per_gpu * run.flops_per_token / H100_PEAK == pytest.approx(printed, abs=0.005)
    assert (lay.zero, lay.recompute) == (1, "none") and (pp == 1 or lay.schedule == "interleaved")
    assert lay.sequence_parallel == (tp > 1)                            # the launcher's 70B config
    assert run.hardware == Hardware.h100("cudnn")
    assert run.flops_per_token * 8192 == pytest.approx({32: 4.74e14, 80: 3.94e15}[run.config.layers], rel=0.002)


def test_nemo_8b_cp_by_hand():
    """8 GPUs, CP 2 × DP 4, 32 micro-batches of one sequence a rank. CP's traffic, exposed: per micro-batch and
    layer one hop of K and V forward (2·s/2·1,024: grouped-query attention's 8 heads of 128), one of K, V and their
    gradients backward (4·s/2·1,024) and the gradients' last hop (2·s/2·1,024), each a send on NVLink, then the
    gradients summed over the 2 CP ranks once (an all-reduce of Ψ: 2 steps of Ψ/2), Ψ the config's parameters
    counted by hand; no tp, no pipeline, dp's reduce (inside the node) behind the last micro-batch's backward, its
    compute losing 0.15 of the reduce's time."""
    h, L, s, v, f, m = 4096, 32, 8192, 128256, 14336, 32
    params = 2 * v * h + s * h + L * (2 * h * h + 2 * h * 1024 + 3 * h * f + 2 * f + 6 * h) + 2 * h
    block = s // 2 * 1024

    def send(n):
        return 5e-6 + n * 2 / NVLINK
    sp = m * L * (send(2 * block) + send(4 * block) + send(2 * block)) + 2 * send(params / 2)
    step = predict(NEMO_8B).step
    assert step.exposed.sp == pytest.approx(sp, rel=1e-9), f"CP {step.exposed.sp:.3f} s exposed, the hand count {sp:.3f} s"
    assert step.bubble == step.exposed.tp == step.exposed.pp == 0.0
    assert step.communication.dp > 0 and step.exposed.dp == pytest.approx(0.15 * step.communication.dp)


def test_nemo_70b_hides_tp():
    """TP 4 with NeMo's ``ub_tp_comm_overlap``: tp's traffic hidden, but 0.15 of its time taken from the compute
    (NVLink's ``processor_usage``, Calculon's H100 file); CP's exposed; the interleaved bubble (p − 1)/(v·m) = 3/320
    of a micro-batch's whole time, about 1% of the compute."""
    step = predict(NEMO_70B).step
    assert step.communication.tp > 0 and step.exposed.tp == pytest.approx(0.15 * step.communication.tp)
    assert step.exposed.sp > 0
    assert 0 < step.bubble < step.compute * 3 / 320 * 1.05


def test_weak_scaling_is_what_hiding_dp_misses():
    """Llama 3.1 8B on 8 and on 128 GPUs, the same TP, PP, CP and GA: only DP (4 -> 64) and the batch grow.
    Published: 0.972 of the 8-GPU tokens/s per GPU (13.16 s a step against 12.78). Derived overlap hides dp's
    reduce only behind the last micro-batch's backward: on 128 GPUs part of it is left (inter-node), so the model
    predicts a slower step too."""
    small, large = predict(NEMO_8B), predict(NEMO_8B_128)
    assert large.tokens_per_gpu < small.tokens_per_gpu
    assert large.step.exposed.dp > small.step.exposed.dp > 0
    published = NEMO_8B_128.tokens_per_gpu / NEMO_8B.tokens_per_gpu
    assert published == pytest.approx(12.78 / 13.16, abs=0.001)
