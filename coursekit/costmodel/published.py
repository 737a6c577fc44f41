"""The cost model against published throughput: runs on H100s whose layout, batch and speed are in print.

Each run is data (:class:`PublishedRun`): the model in this config's terms, the layout, the hardware, the
global batch, the published tokens/s per GPU and MFU, and where they are printed. :func:`predict` prices its
step with :func:`~.step.step_time` and turns it into tokens/s per GPU and MFU (:func:`~.mfu.mfu`, the model's
FLOPs per token counted on the real model's shape). The target (issue 59): predicted / published within ±15%.

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
* NVIDIA's DGX Cloud benchmarks of NeMo 24.12 on Megatron Core (https://github.com/NVIDIA/dgxc-benchmarking
  at commit 8f5cbb3, llama3.1/README_8b.md and README_70b.md, "Expected Performance", the BF16 tables): Llama
  3.1 8B with TP 1, PP 1, CP 2, MBS 1, GA 32 on 8 H100s (GBS 128: 12.78 s a step, 82,028 tokens/s, 59.99% MFU)
  and 128 (GBS 2,048: 13.16 s, 1,275,155, 58.28%), so DP 4 and 64; Llama 3.1 70B with TP 4, PP 4, CP 2, VP 5,
  MBS 1, GA 64 on 64 (GBS 128: 14.61 s, 71,756, 54.52%), so DP 2; sequence 8,192.
  The tables print the whole job's tokens/s: per GPU over TP·PP·CP·DP. Their MFU counts FLOPs as here (the
  READMEs' "model flops" a sequence, 4.74e14 and 3.94e15, are 8,192 × ``6N + 12·L·h·s``). Recomputation (none)
  and the 70B's sequence parallelism are NeMo-Framework-Launcher's launcher_scripts/conf/training/llama/
  llama3_1_{8b,70b}.yaml, whose copies the benchmark overrides (its own copies are not in any stored text).
  Left out: the other columns (16 to 2,048 GPUs: the same layout, DP and the batch grown; the 128-GPU 8B run
  stands for them), the FP8 tables, the 24.09 version of the tables (within 1% of these), and the **405B**
  table (TP 8, PP 9, CP 2, VP 7 on 576 H100s, 17.50 s, 117,964 tokens/s, 54.85%): its model is a proxy, not
  Llama 3.1 405B -- the GPT-2 BPE tokenizer on synthetic data (README_405b.md: its vocabulary is not stated)
  and 16 query groups (the launcher's llama3_1_405b.yaml and the README's FLOP count; Llama has 8), so its N is
  not known, and it is not priced here.
* NVIDIA Megatron Bridge's performance summary (docs/performance-summary.md and performance-summary-archive.md,
  https://docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary.html, releases 25.09 to 26.06; NeMo's
  older docs/source/performance/performance_summary.md, NeMo 24.07) was read first: every one of its H100 Llama
  pre-training rows is FP8; its only H100 BF16 pre-training row is GPT-OSS 120B, a mixture of experts this
  module does not price. Its recipes (``llama3_70b_pretrain_64gpu_h100_bf16_config``: TP 4, PP 4, CP 2) have
  no published figure.
* Megatron-LM's weak-scaling table (README, "Training Speed and Scalability": vocabulary 131,072, sequence
  4,096, 41% to 47-48% MFU on up to 6,144 H100s) is **not here**: its rows (sizes, TP, PP, batch) exist only
  as an image (images/model_table.png) and no stored text transcribes them; a run without its layout cannot be
  priced without guessing it.

**The shape.** Each model is priced as it is (:func:`llama`): grouped-query attention (8 key-value heads, so K and
V are ``h × 1,024`` in the qkv matmul and in CP's ring), a SwiGLU MLP (three ``h × f`` matrices, f = 14,336,
28,672 or 53,248), an untied head. What the config still has of GPT, learned positions and the biases and norm
shifts of its block, is under 0.5% of the parameters (tests/test_costmodel_published.py counts it) and prices no
matmul; RoPE's and RMSNorm's passes are the config's norms'.

**The assumptions**, the same rules for every run:

* the hardware priced by shape (:meth:`~.config.Hardware.h100`): matmuls on Calculon's size curve topped at an
  H100's measured best share (80.3%), attention a causal flash kernel at the FlashAttention-3 paper's measured
  speed -- cuDNN's (Transformer Engine: NeMo; Llama 3, whose kernel is not published, takes the description's
  default) or FlashAttention-2's (PyTorch's SDPA: torchtitan);
* overlap derived (:func:`~.overlap.shares`, ``ASSUMPTIONS``; hidden traffic taking ``processor_usage`` of its time
  from the compute, :class:`~.config.Hardware`): dp's reduce behind the last micro-batch's backward
  (FSDP: all but the first layer's gather); tp on the critical path except NeMo's 70B, whose config turns on
  ``ub_tp_comm_overlap``; the pipeline's sends asynchronous (Llama 3 section 3.3.2, Megatron-LM's
  ``--overlap-p2p-communication``, NeMo's ``overlap_p2p_comm``); CP's ring exposed (``step_time``'s default);
* recomputation as each run says: torchtitan's Table 1 selective, Llama 3's 8K pre-training none (section
  3.3.2), NeMo's none;
* the pipeline: Llama 3's interleaved schedule with two model chunks a rank, the only ``v`` the paper shows
  (Figure 6: 8 stages on 4 ranks), NeMo's 70B five (VP 5); micro-batches of one sequence, so ``m`` = batch/DP;
* ZeRO: torchtitan's FSDP is ZeRO-3; Llama 3's FSDP without resharding and Megatron's distributed optimizer
  (NeMo's ``mcore_distributed_optim``) ZeRO-1, over dp; CP as the course's ``sp``, ring attention;
* the peak: the SXM's 989 TFLOP/s everywhere. torchtitan's cards were 500 W HBM2e ones whose peak lies "between
  SXM and NVL" (its footnote 2; NVL: 835 TFLOP/s): :meth:`~.config.Hardware.h100_hbm2e`, their 96 GB, at the SXM's
  peak (what torchtitan's MFU divides by).
  (Table 4's figures are checked against a second transcription, Balaji's SC'24 slide at
  glennklockwood.com/garden/llama-3.1; the section 3.3.2 statements here were not re-checked against a copy.)

**What the runs say** (predicted / published tokens/s): Llama 3 405B 1.007 and 0.904, NeMo 8B 1.079 and 1.071,
NeMo 70B 1.117 (its tp traffic hidden, its compute losing 0.15 of that time: Calculon's ``processor_usage``; free,
1.151; exposed, 1.02), torchtitan 1.74 (eager) and 1.50 (compiled) -- the one miss: one step priced once, published
1.16× apart, both at an MFU (33-39%) far under NeMo's 58-60% on the same model, for what the model does not price
(the 500 W card's clock, eager launches and unfused passes, FSDP2's casts and gathers at two sequences a step).
The 8B pair on 8 and 128 GPUs (:data:`~.ties.LAYOUT_PAIRS`) differs only in DP: published 0.972 of the speed per
GPU, the model 0.964.

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
           "LLAMA3_405B_8K", "LLAMA3_405B_16K", "NEMO_8B", "NEMO_8B_128", "NEMO_70B", "KORTHIKANTI", "NARAYANAN",
           "ALL_RUNS", "llama", "llama_matmul_params", "predict"]

# the same for every run (module docstring: why each)
ASSUMPTIONS = {"overlap": "derived"}
LLAMA_VOCAB = 128_256


def llama(hidden: int, layers: int, heads: int, seq_len: int, ffn: int, name: str, kv_heads: int = 8) -> ModelConfig:
    """A Llama 3 model as it is: grouped-query attention (``kv_heads`` key-value heads), a SwiGLU MLP of ``ffn``,
    an untied head, no qkv bias (RoPE and RMSNorm aside: the config's learned positions and norm biases remain,
    under 0.5% of the parameters)."""
    return ModelConfig(LLAMA_VOCAB, seq_len, hidden, layers, heads, tied=False, qkv_bias=False, name=name,
                       kv_heads=kv_heads, ffn_hidden=ffn, gated=True)


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
    assumptions: tuple[tuple[str, object], ...] = ()   # over ASSUMPTIONS, for this run (how its software ran)

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
    step = step_time(run.config, run.layout, run.hardware, run.global_batch,
                     **{**ASSUMPTIONS, **dict(run.assumptions), **assumptions})
    gpus = run.layout.gpus
    tokens = run.global_batch * run.config.seq_len / step.total / gpus
    return Prediction(run, step, tokens, mfu(tokens * gpus, run.flops_per_token, run.hardware.flops, gpus))


_TORCHTITAN = ("pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md, Table 1 (FSDP, 8 GPUs, local "
               "batch 2, global 16, selective activation checkpointing; sequence 8,192 from llama3_8b.toml)")
_LLAMA3 = "Dubey et al. 2024, The Llama 3 Herd of Models (arXiv:2407.21783), section 3.3.2, Table 4"
_8B = llama(4096, 32, 32, 8192, 14336, "Llama 3.1 8B")
_405B = llama(16384, 126, 128, 8192, 53248, "Llama 3.1 405B")
_N_8B, _N_405B = llama_matmul_params(4096, 32, 14336), llama_matmul_params(16384, 126, 53248)


def _titan(tokens: float, mfu_: float, what: str) -> PublishedRun:
    # FSDP = ZeRO-3 over dp = 8 (one node, NVLink); no gradient accumulation: one micro-batch of 2 a rank
    return PublishedRun(f"torchtitan Llama 3.1 8B, FSDP 8, {what}", _8B,
                        Layout(dp=8, zero=3, recompute="selective"), Hardware.h100_hbm2e("flash2"), 16, tokens, mfu_, _N_8B,
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


_DGXC = ("NVIDIA/dgxc-benchmarking at 8f5cbb3 (NeMo 24.12, Megatron Core), llama3.1/README_{size}.md, its BF16 "
         "table ({header}): {gpus} H100s, GBS {gbs}, {step} s a step, {tokens:,} tokens/s, {mfu}% MFU")
_70B = llama(8192, 80, 64, 8192, 28672, "Llama 3.1 70B")
_N_70B = llama_matmul_params(8192, 80, 28672)


def _dgxc(size: str, config: ModelConfig, n: int, layout: Layout, header: str, gbs: int, step: float, tokens: int,
          mfu_: float, assumptions: tuple = ()) -> PublishedRun:
    # the table prints the whole job's tokens/s (GBS · 8,192 / step): per GPU over TP·PP·CP·DP of them (DP is
    # what the header's degrees leave); Megatron's distributed optimizer is ZeRO-1 over dp; CP is the course's
    # sp with ring attention (step_time's default); micro-batches of one sequence (MBS 1), so m = GBS/DP = GA
    source = _DGXC.format(size=size, header=header, gpus=layout.gpus, gbs=gbs, step=step, tokens=tokens,
                          mfu=round(mfu_ * 100, 2))
    lay = layout
    vp = f" (VP {lay.chunks})" if lay.chunks > 1 else ""
    name = f"NeMo {config.name}, TP {lay.tp} × PP {lay.pp}{vp} × CP {lay.sp} × DP {lay.dp} on {lay.gpus} GPUs"
    return PublishedRun(name, config, layout, Hardware.h100(), gbs, tokens / layout.gpus, mfu_, n, source, assumptions)


TORCHTITAN_8B = _titan(5762, 0.33, "eager")
TORCHTITAN_8B_COMPILED = _titan(6667, 0.39, "torch.compile")
LLAMA3_405B_8K = _llama3(64, 430, 0.43)
LLAMA3_405B_16K = _llama3(128, 400, 0.41)
# no recomputation and the 70B's sequence parallelism: NeMo-Framework-Launcher's llama3_1_{8b,70b}.yaml
_H8, _H70 = "TP=1, PP=1, CP=2, MBS=1, GA=32", "TP=4, PP=4, CP=2, VP=5, MBS=1, GA=64"
NEMO_8B = _dgxc("8b", _8B, _N_8B, Layout(dp=4, sp=2, zero=1, micro_batches=32), _H8, 128, 12.78, 82028, 0.5999)
NEMO_8B_128 = _dgxc("8b", _8B, _N_8B, Layout(dp=64, sp=2, zero=1, micro_batches=32), _H8, 2048, 13.16, 1275155,
                    0.5828)
NEMO_70B = _dgxc("70b", _70B, _N_70B, Layout(dp=2, tp=4, pp=4, sp=2, zero=1, schedule="interleaved",
                                             micro_batches=64, chunks=5, sequence_parallel=True),
                 _H70, 128, 14.61, 71756, 0.5452, (("tp_comm_overlap", True),))  # its ub_tp_comm_overlap
RUNS = (TORCHTITAN_8B, TORCHTITAN_8B_COMPILED, LLAMA3_405B_8K, LLAMA3_405B_16K, NEMO_8B, NEMO_8B_128, NEMO_70B)

# Korthikanti et al. 2022 (arXiv:2205.05198), Table 3's models and layouts and Table 5's seconds an iteration, on
# A100s priced by shape (Hardware.a100()): "full recompute" and "present work" (sequence parallelism + selective
# recomputation). s = 2,048, V = 51,200, tp 8, micro-batches of 4 (22B) or 1; the interleaving depth, not printed,
# is Calculon's for the same table (calculon-ai/calculon at caa4b11, validation/seqsel/tab5/*.json). Megatron-LM
# then waited on its pipeline sends and scattered them over tp (Narayanan et al. 2021, section 4.1).
_KORTHIKANTI = "Korthikanti et al. 2022 (arXiv:2205.05198), Tables 3 and 5: {name}, {mode}, {seconds} s an iteration"
_TABLE_5 = (("22B", 64, 6144, 48, 1, 4, 4, 1, 1.42, 1.10), ("175B", 96, 12288, 96, 8, 64, 1, 3, 18.13, 13.75),
            ("530B", 128, 20480, 105, 35, 280, 1, 3, 49.05, 37.83), ("1T", 160, 25600, 128, 64, 512, 1, 1, 94.42, 71.49))


def _korthikanti(row: tuple, mode: str) -> PublishedRun:
    name, heads, hidden, layers, pp, batch, micro, v, full, present = row
    config = ModelConfig(51200, 2048, hidden, layers, heads, name=f"Megatron GPT {name}")
    layout = Layout(tp=8, pp=pp, micro_batches=batch // micro, chunks=v, schedule="interleaved" if v > 1 else "1f1b",
                    recompute=mode, sequence_parallel=mode == "selective")
    seconds = full if mode == "full" else present
    tokens = batch * 2048 / seconds / layout.gpus
    n = layers * 12 * hidden * hidden + 51200 * hidden
    label = "full recompute" if mode == "full" else "sequence parallelism + selective recomputation"
    return PublishedRun(f"Korthikanti {name}, {label}", config, layout, Hardware.a100(), batch, tokens,
                        tokens * flops_per_token(n, layers, hidden, 2048) / 312e12, n,
                        _KORTHIKANTI.format(name=name, mode=label, seconds=seconds),
                        (("async_p2p", False), ("scatter_gather", True)))


KORTHIKANTI = tuple(_korthikanti(row, mode) for row in _TABLE_5 for mode in ("full", "selective"))

# Narayanan et al. 2021 (arXiv:2104.04473, SC '21), Table 2: GPT-3 175B (174.6 B parameters; Table 1's shape: 96
# layers, h 12,288, 96 heads, s 2,048, V 51,200) at batch 1,536 on 384, 768 and 1,536 A100s, once as PTD-P
# (model-parallel size 96 = tp 8 × pp 12, micro-batch 1: 153 / 149 / 141 teraFLOP/s per GPU) and once as ZeRO-3
# without model parallelism (micro-batches 4 / 2 / 1, so one a step: 144 / 88 / 44). Read from the stored text of
# two transcriptions of the table, which agree; the figures' tp-versus-pp and interleaving sweeps (Figures 13-15)
# are bars with no values in any stored text, so they are not here. Not printed, so the source's defaults: the
# paper's runs recompute every layer (its Eq. 3 counts the extra forward), Megatron-LM's default schedule is
# 1F1B, its sends wait and scatter over tp (section 4.1), as in Korthikanti's runs above.
_NARAYANAN = ("Narayanan et al. 2021 (arXiv:2104.04473), Table 2: GPT-3 175B, batch 1,536, {scheme} on {gpus:,} "
              "GPUs, {tflops} teraFLOP/s per GPU")
_GPT3 = ModelConfig(51200, 2048, 12288, 96, 96, name="Megatron GPT 175B")     # Korthikanti's 175B: one model
_N_GPT3 = 96 * 12 * 12288 * 12288 + 51200 * 12288


def _narayanan(scheme: str, gpus: int, tflops: float) -> PublishedRun:
    l, h, s, v = 96, 12288, 2048, 51200
    per_token = 96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))      # the paper's Eq. 3 over B·s tokens
    if scheme == "PTD-P":
        layout = Layout(dp=gpus // 96, tp=8, pp=12, micro_batches=1536 // (gpus // 96), recompute="full")
    else:
        layout = Layout(dp=gpus, zero=3, micro_batches=1, recompute="full")
    tokens = tflops * 1e12 / per_token
    return PublishedRun(f"Narayanan GPT-3 175B, {scheme} on {gpus:,} GPUs", _GPT3, layout, Hardware.a100(), 1536,
                        tokens, tokens * flops_per_token(_N_GPT3, l, h, s) / 312e12, _N_GPT3,
                        _NARAYANAN.format(scheme=scheme, gpus=gpus, tflops=tflops),
                        (("async_p2p", False), ("scatter_gather", True)))


NARAYANAN = tuple(_narayanan(scheme, gpus, tflops) for scheme, gpus, tflops in
                  (("PTD-P", 384, 153), ("PTD-P", 768, 149), ("PTD-P", 1536, 141),
                   ("ZeRO-3", 384, 144), ("ZeRO-3", 768, 88), ("ZeRO-3", 1536, 44)))
ALL_RUNS = RUNS + KORTHIKANTI + NARAYANAN
