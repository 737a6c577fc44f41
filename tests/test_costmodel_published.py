"""The cost model against published H100 throughput (coursekit/costmodel/published.py): torchtitan's Llama 3.1
8B on 8 GPUs, Llama 3 405B on 8,192 and 16,384 GPUs, and NVIDIA's DGX Cloud benchmarks of NeMo (Megatron Core),
BF16: Llama 3.1 8B on 8 and 128 GPUs (CP 2) and 70B on 64 (TP 4 × PP 4, VP 5, CP 2) -- each predicted /
published within [0.75, 1.25] -- but torchtitan's eager run, which the model misses by +38%
(test_one_step_cannot_meet_both_torchtitan_runs says why). Megatron-LM's weak-scaling table is not checked: its
rows exist only as an image (the module docstring), and neither is the DGX Cloud 405B table (a proxy model).

The inputs are recounted by hand here (GPU counts, tokens a batch, the real models' N, the MFU the published
throughput implies), and the parts of the 405B, NeMo 8B and 70B steps (compute, bubble, tp, CP) from the
formulas, not the code.

Planted, seen failing (each put in by hand, these tests run, the bug taken out):

* the A100's peak in ``Hardware.h100`` (``flops=312e12``) -> every ratio test ("Llama 3 405B, TP 8 × PP 16 × DP
  64 on 8,192 GPUs: predicted 46.2 tokens/s/GPU, published 163.8, ratio 0.28 outside [0.75, 1.25]"), test_h100_preset;
* the bubble dropped (``compute_time`` returns ``ComputeTime(compute, 0.0)``) -> test_405b_step_by_hand
  ("bubble 0.000 s, (p − 1)/(v·m) of compute = 2.586 s"), test_the_bubble_is_why_16k_is_slower ("16,384 GPUs
  at 1.000 of 8,192's tokens/s per GPU: no bubble left to slow it"); the ratio tests alone still pass (1.02,
  1.10): the ±25% band cannot see a term of 17% (8,192 GPUs) to 30% (16,384) of the step, which is why the parts are checked by hand;
* tp's communication dropped (``communication_time`` skips the ``"tp"`` rows) -> test_405b_step_by_hand
  ("tp 0.000 s exposed, the hand count 1.183 s"); the ratio tests again pass (0.92, 0.83);
* CP's communication dropped (``communication_time`` skips the ``"sp"`` rows) -> test_nemo_8b_step_by_hand ("CP
  0.000 s exposed, the hand count 0.660 s"), test_nemo_70b_bubble_by_hand; the NeMo ratio tests pass
  (0.83 to 0.85: CP is 2-4% of those steps);
* the GPU count without CP (``_dgxc`` divides the job's tokens/s by ``gpus // sp``) -> every NeMo test of its
  inputs and ratio ("implies MFU 1.201, printed 0.5999"; "ratio 0.40 outside [0.75, 1.25]");
* the 70B's VP dropped (``chunks=1``, 1F1B) -> test_nemo_70b_bubble_by_hand ("bubble 0.721 s, (p − 1)/(v·m) of
  compute = 0.144 s"), test_nemo_inputs_are_the_tables[70B-64]; its ratio test passes (0.80).
"""

from __future__ import annotations

import pytest

from coursekit.costmodel import Hardware, compute_flops, mfu, num_params
from coursekit.costmodel.published import (ASSUMPTIONS, LLAMA3_405B_8K, LLAMA3_405B_16K, NEMO_8B, NEMO_8B_128,
                                           NEMO_70B, RUNS, TORCHTITAN_8B, TORCHTITAN_8B_COMPILED, predict)

H100_PEAK = 989e12                      # H100 SXM, bf16 dense


def _within(run, low=0.75, high=1.25):
    p = predict(run)
    assert low <= p.ratio <= high, (f"{run.name}: predicted {p.tokens_per_gpu:.1f} tokens/s/GPU, published "
                                    f"{run.tokens_per_gpu:.1f}, ratio {p.ratio:.2f} outside [{low}, {high}]")
    return p


def test_torchtitan_compiled_within_25_percent():
    """6,667 tokens/s/GPU with torch.compile: the run whose elementwise ops are fused, as the runs behind the
    efficiency of 0.5 (Megatron-LM's fused kernels, Narayanan et al. 2021) are."""
    _within(TORCHTITAN_8B_COMPILED)


def test_one_step_cannot_meet_both_torchtitan_runs():
    """5,762 tokens/s/GPU eager, 6,667 compiled: the same step, the same model; the cost model prices it once. The
    model misses the eager run (7,931 predicted, +38%: docs/benchmarks.md; not asserted as a band here, and not
    fudged): it has one efficiency (0.5 of peak) for a well-tuned step, and eager PyTorch runs every norm, SwiGLU
    and residual add as its own kernel, which torch.compile fuses. The cards were also 500 W HBM2e H100s whose
    peak is "between SXM and NVL" (torchtitan's footnote 2), not the SXM's 989 TFLOP/s assumed here. What *is*
    asserted: one prediction for both, and no single prediction can be within 25% of both unless it lies in
    [0.75 · 6,667, 1.25 · 5,762] = [5,000, 7,203] tokens/s/GPU."""
    eager, compiled = predict(TORCHTITAN_8B), predict(TORCHTITAN_8B_COMPILED)
    assert eager.tokens_per_gpu == compiled.tokens_per_gpu, "one step, two published speeds"
    assert 6667 / 5762 == pytest.approx(1.157, abs=0.001)


@pytest.mark.parametrize("run", [LLAMA3_405B_8K, LLAMA3_405B_16K], ids=["8192", "16384"])
def test_llama3_405b_within_25_percent(run):
    """Table 4's 430 and 400 TFLOP/s per GPU: predicted 0.85 and 0.77 of them (with two model chunks a rank, the
    only v the paper shows; with four the bubble halves and they are 0.93 and 0.91)."""
    _within(run)


def test_the_bubble_is_why_16k_is_slower():
    """The same batch on twice the GPUs: m = 16 micro-batches for p = 16 stages instead of 32, so the bubble,
    (p − 1)/(v·m) of the compute, doubles. Published: 400 / 430 = 0.93 of the tokens/s per GPU; the model 0.85."""
    eight, sixteen = predict(LLAMA3_405B_8K), predict(LLAMA3_405B_16K)
    drop = sixteen.tokens_per_gpu / eight.tokens_per_gpu
    assert 0.80 <= drop <= 0.95, f"16,384 GPUs at {drop:.3f} of 8,192's tokens/s per GPU: no bubble left to slow it?"


def test_405b_step_by_hand():
    """The 8,192-GPU step's parts from the formulas: compute = the step's FLOPs over the GPUs at 0.5 of 989
    TFLOP/s; bubble = (p − 1)/(v·m) of it; tp = per micro-batch 33 ring all-reduces of b·s·h (2 a layer forward
    and backward over 8 layers, + the head's input gradient) and 3 of b·s (the vocabulary-parallel loss), each
    2(t − 1) steps of N/t on NVLink (450 GB/s, 5 µs)."""
    h, L, s, v, m, t = 16384, 126, 8192, 128256, 32, 8
    params = h * (2 * v + s) + L * (12 * h * h + 10 * h) + 2 * h      # GPT-shaped, untied, no qkv bias
    tokens = 2048 * s
    compute = tokens * (6 * params + 12 * L * s * h) / 8192 / (0.5 * H100_PEAK)
    bubble = compute * 15 / (2 * m)

    def ring(n):
        return 2 * (t - 1) * (5e-6 + n / t * 2 / 450e9)
    tp = m * (33 * ring(s * h) + 3 * ring(s))
    step = predict(LLAMA3_405B_8K).step
    assert step.compute == pytest.approx(compute, rel=1e-9), (step.compute, compute)
    assert step.bubble == pytest.approx(bubble, rel=1e-9), \
        f"bubble {step.bubble:.3f} s, (p − 1)/(v·m) of compute = {bubble:.3f} s"
    assert step.exposed.tp == pytest.approx(tp, rel=1e-9), f"tp {step.exposed.tp:.3f} s exposed, the hand count {tp:.3f} s"
    assert step.exposed.dp == step.exposed.pp == 0.0                 # both overlapped (ASSUMPTIONS)


def test_gpu_counts_and_batches_are_the_sources():
    """GPUs = TP·PP·DP·CP; Llama 3's 16M tokens a batch = batch/DP 32 (and 16) × DP × 8,192; torchtitan's local
    batch 2 × 8 ranks = 16."""
    assert [r.layout.gpus for r in RUNS] == [8, 8, 8 * 16 * 64, 8 * 16 * 128, 8, 128, 64]
    assert LLAMA3_405B_8K.layout.gpus == 8192 and LLAMA3_405B_16K.layout.gpus == 16384
    for run, per_dp in ((LLAMA3_405B_8K, 32), (LLAMA3_405B_16K, 16)):
        assert run.global_batch == per_dp * run.layout.dp and run.layout.micro_batches == per_dp
        assert run.global_batch * 8192 == 16 * 2**20
    assert TORCHTITAN_8B.global_batch == 2 * 8 and TORCHTITAN_8B.layout.micro_batches == 1
    assert TORCHTITAN_8B.layout.recompute == "selective" and LLAMA3_405B_8K.layout.recompute == "none"


def test_published_throughput_implies_the_published_mfu():
    """By hand: N of Llama 3.1 8B and 405B (q, o h²; k, v h·1,024; SwiGLU 3·h·f; the untied head v·h), the
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


@pytest.mark.parametrize("run,share,real,params_share", [
    (TORCHTITAN_8B, 0.0024, 8_030_261_248, -0.063), (LLAMA3_405B_8K, 0.0148, 405_853_388_800, 0.011),
    (NEMO_70B, -0.0362, 70_553_706_496, -0.056)], ids=["8B", "405B", "70B"])
def test_the_shape_differences_are_the_docstrings(run, share, real, params_share):
    """The GPT-shaped config's step FLOPs (no recomputation) against the real model's 6N + 12·L·h·s: +0.24%,
    +1.5% and -3.6%, the module docstring's sum of its differences; its parameters against the real count (Meta's
    8.03 B, 405.85 B and 70.55 B: matrices, an untied embedding and head, two RMSNorms a layer and a final one)."""
    priced = compute_flops(run.config, 1, "none").total
    assert priced / run.flops_per_token - 1 == pytest.approx(share, abs=0.0002)
    h, L = run.config.hidden, run.config.layers
    assert real == run.matmul_params + 128256 * h + (2 * L + 1) * h
    assert num_params(run.config).total / real - 1 == pytest.approx(params_share, abs=0.001)


def test_predicted_mfu_follows_the_ratio():
    """MFU predicted on the real model's FLOPs: the same ratio to the printed MFU as the tokens/s (to rounding)."""
    for run in RUNS:
        p = predict(run)
        assert p.mfu / run.mfu == pytest.approx(p.ratio * run.tokens_per_gpu * run.flops_per_token
                                                / H100_PEAK / run.mfu)


def test_h100_preset():
    h100 = Hardware.h100()
    assert (h100.flops, h100.intra_bandwidth, h100.bandwidth, h100.gpus_per_node, h100.memory) == \
        (989e12, 450e9, 50e9, 8, 80e9)
    assert h100.efficiency == Hardware().efficiency == 0.5


# NVIDIA's DGX Cloud benchmarks (dgxc-benchmarking, NeMo 24.12 on Megatron Core), BF16: printed step, tokens/s of
# the whole job, MFU, and the header's degrees -- (run, GPUs, TP, PP, CP, VP, GA, GBS, step s, tokens/s, MFU)
NEMO_TABLES = [(NEMO_8B, 8, 1, 1, 2, 1, 32, 128, 12.78, 82028, 0.5999),
               (NEMO_8B_128, 128, 1, 1, 2, 1, 32, 2048, 13.16, 1275155, 0.5828),
               (NEMO_70B, 64, 4, 4, 2, 5, 64, 128, 14.61, 71756, 0.5452)]


@pytest.mark.parametrize("run", [NEMO_8B, NEMO_8B_128, NEMO_70B], ids=["8B-8", "8B-128", "70B-64"])
def test_nemo_runs_within_25_percent(run):
    """Predicted 0.80, 0.82 and 0.83 of the printed tokens/s: low, as every ratio here (docs/benchmarks.md says
    why: 54-60% MFU printed against a model that runs its matmuls at 50% of peak and prices CP's K and V
    h wide where Llama's are 1,024)."""
    _within(run)


@pytest.mark.parametrize("row", NEMO_TABLES, ids=["8B-8", "8B-128", "70B-64"])
def test_nemo_inputs_are_the_tables(row):
    """GPUs = TP·PP·CP·DP with DP what the header leaves; m = GBS/DP = GA micro-batches of one sequence (MBS 1);
    the printed step × tokens/s = GBS × 8,192 (the step rounded to 10 ms); the MFU the tokens/s imply on
    6N + 12·L·h·s within half a point of the printed one (the README's model FLOPs a sequence, 4.74e14 and
    3.94e15, are 8,192 times it); Megatron's distributed optimizer ZeRO-1; no recomputation; CP as ring
    attention (step_time's default: ASSUMPTIONS names no other)."""
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
    assert "attention" not in ASSUMPTIONS and "sp_overlap" not in ASSUMPTIONS
    assert run.flops_per_token * 8192 == pytest.approx({32: 4.74e14, 80: 3.94e15}[run.config.layers], rel=0.002)


def test_nemo_8b_step_by_hand():
    """8 GPUs, CP 2 × DP 4, 32 micro-batches of one sequence a rank: compute = the step's FLOPs over 8 GPUs at 0.5
    of 989 TFLOP/s; CP's traffic, exposed (no sp_overlap in ASSUMPTIONS): per micro-batch and layer one hop of K
    and V forward (2·s/2·h), one of K, V and their gradients backward (4·s/2·h) and the gradients' last hop
    (2·s/2·h), each a send on NVLink (450 GB/s, 5 µs), then the gradients summed over the 2 CP ranks once (an
    all-reduce of Ψ: 2 steps of Ψ/2); dp's ZeRO-1 traffic hidden; no tp, no pipeline."""
    h, L, s, v, m = 4096, 32, 8192, 128256, 32
    params = h * (2 * v + s) + L * (12 * h * h + 10 * h) + 2 * h      # GPT-shaped, untied, no qkv bias
    compute = 128 * s * (6 * params + 12 * L * s * h) / 8 / (0.5 * H100_PEAK)
    block = s // 2 * h

    def send(n):
        return 5e-6 + n * 2 / 450e9
    sp = m * L * (send(2 * block) + send(4 * block) + send(2 * block)) + 2 * send(params / 2)
    step = predict(NEMO_8B).step
    assert step.compute == pytest.approx(compute, rel=1e-9), (step.compute, compute)
    assert step.exposed.sp == pytest.approx(sp, rel=1e-9), f"CP {step.exposed.sp:.3f} s exposed, the hand count {sp:.3f} s"
    assert step.bubble == step.exposed.tp == step.exposed.pp == step.exposed.dp == 0.0
    assert step.communication.dp > 0


def test_nemo_70b_bubble_by_hand():
    """TP 4 × PP 4 with 5 model chunks a rank (VP 5) and 64 micro-batches: the interleaved bubble is (p − 1)/(v·m)
    = 3/320 of the compute; tp's and CP's traffic exposed, pp's and dp's hidden (ASSUMPTIONS)."""
    step = predict(NEMO_70B).step
    assert step.bubble == pytest.approx(step.compute * 3 / (5 * 64), rel=1e-9), \
        f"bubble {step.bubble:.3f} s, (p − 1)/(v·m) of compute = {step.compute * 3 / 320:.3f} s"
    assert step.exposed.tp > 0 and step.exposed.sp > 0 and step.exposed.pp == step.exposed.dp == 0.0
    assert step.communication.pp > 0


def test_weak_scaling_is_what_hiding_dp_misses():
    """Llama 3.1 8B on 8 and on 128 GPUs, the same TP, PP, CP and GA: only DP (4 -> 64) and the batch grow.
    Published: 0.972 of the 8-GPU tokens/s per GPU (13.16 s a step against 12.78). The model hides dp's traffic
    entirely (dp_overlap 1), so it predicts the same step: off by 2.9% on this pair (ties.LAYOUT_PAIRS)."""
    small, large = predict(NEMO_8B), predict(NEMO_8B_128)
    assert large.tokens_per_gpu == pytest.approx(small.tokens_per_gpu, rel=1e-12)
    assert large.step.communication.dp > small.step.communication.dp      # there, but hidden
    published = NEMO_8B_128.tokens_per_gpu / NEMO_8B.tokens_per_gpu
    assert published == pytest.approx(12.78 / 13.16, abs=0.001)
