"""What the cost model is asked about: a transformer's shape, a layout of the GPUs, and the hardware.

Three frozen dataclasses, shared by every part of :mod:`coursekit.costmodel` (memory, communication,
compute, the planner), so that each formula names its inputs the same way:

* :class:`ModelConfig` -- a GPT-shaped decoder: ``layers`` blocks of attention + a 4h MLP, learned
  positions, a final norm, an output head tied to the embedding or not. The course's own
  :func:`coursekit.models.tiny_transformer` is one (``qkv_bias=False``); GPT-2 and GPT-3 are others.
  With ``experts > 0`` every block's MLP is a mixture of experts (chapter 07's
  :class:`coursekit.parallel.expert.MoE`): a router and ``experts`` MLPs, ``top_k`` of them per token.
* :class:`Layout` -- how ``gpus`` are used: degrees ``dp × tp × pp × sp`` (torchtitan's axis names),
  the ZeRO stage over ``dp``, the pipeline schedule and micro-batches, activation recomputation, and
  ``ep``: the experts split over ``ep`` of the ``dp`` ranks (expert parallelism borrows from dp).
* :class:`Hardware` -- one GPU's memory and speed, and the links inside and between nodes.

    >>> ModelConfig.gpt2_small().hidden, Layout(dp=2, tp=4).gpus
    (768, 8)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

__all__ = ["ModelConfig", "Layout", "Hardware", "RECOMPUTE", "SCHEDULES", "ATTENTION", "H100_MATMUL"]

RECOMPUTE = ("none", "selective", "full")          # Korthikanti et al. 2022, section 5
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb_h1")  # chapter 04's schedules


def _flash(forward: float, backward: float, peak: float = 989e12) -> float:
    """One share of peak for a flash kernel's forward and backward (2.5× the forward's FLOPs) measured apart."""
    return 3.5 / (peak / forward + 2.5 * peak / backward)


# an H100's flash-attention kernels, TFLOP/s at head dimension 128, sequence 8K (Shah et al. 2024, FlashAttention-3,
# arXiv:2407.08608, Figure 5(d) forward with the causal mask, Figure 6 backward): cuDNN 529 and 518, FA2 333 and 318
ATTENTION = {"cudnn": _flash(529e12, 518e12), "flash2": _flash(333e12, 318e12)}
# Calculon's matmul curve (its A100's, copied into its H100 file) with its top at an H100's measured best share,
# 794.5 of 989 TFLOP/s (stas00/ml-engineering at 744d01e, compute/accelerator/README.md): Hardware.h100's docstring
H100_MATMUL = tuple((size, share * 794.5 / 989 / 0.95) for size, share in ((128e9, 0.95), (16e9, 0.9), (1e9, 0.6),
                                                                           (0.0, 0.1)))


@dataclass(frozen=True)
class ModelConfig:
    """A GPT-shaped decoder-only transformer: ``h`` = ``hidden``, ``L`` = ``layers``, ``a`` = ``heads``,
    ``v`` = ``vocab``, ``s`` = ``seq_len`` (also the number of learned positions). Llama's shape too, with
    ``kv_heads`` (grouped-query attention: K and V ``kv_heads·h/a`` wide), ``ffn_hidden`` and ``gated`` (SwiGLU's
    three ``h × f`` matrices) and ``tied=False``: :attr:`layer_matrices` counts what they change.

    A mixture of experts when ``experts`` = ``E`` > 0 (0: dense): every block's MLP is a router (``E·h``
    weights, no bias) and ``E`` MLPs ``h -> f -> h`` (GELU, no biases: ``2hf`` each, ``f`` =
    ``expert_hidden``, 4h by default), each token going to ``top_k`` = ``k`` of them -- chapter 07's
    :class:`~coursekit.parallel.expert.MoE`, Mixtral's and torchtitan's ``GroupedExperts`` (no biases).
    ``capacity_factor``: GShard's and Switch's capacity regime, at most ``C = ceil(factor·k·T/E)`` of a
    batch's ``T`` tokens' assignments per expert (the rest dropped); None: dropless.
    """

    vocab: int
    seq_len: int
    hidden: int
    layers: int
    heads: int
    tied: bool = True          # the output head is the token embedding (GPT-2, the course model)
    qkv_bias: bool = True      # GPT-2 has one; the course model has none (see coursekit.models.SelfAttention)
    name: str = "custom"
    experts: int = 0           # E; 0: a dense MLP in every block
    top_k: int = 1             # k: experts per token
    expert_hidden: int | None = None   # f: each expert's hidden size; None: 4h, the dense MLP's
    capacity_factor: float | None = None  # None: dropless
    kv_heads: int | None = None  # grouped-query attention's key-value heads; None: as many as heads (GPT)
    ffn_hidden: int | None = None  # the dense MLP's hidden size f; None: 4h
    gated: bool = False          # a SwiGLU MLP (Shazeer 2020; Llama): three h×f matrices, not two

    def __post_init__(self):
        for field in ("vocab", "seq_len", "hidden", "layers", "heads", "top_k"):
            if getattr(self, field) < 1:
                raise ValueError(f"ModelConfig.{field} must be >= 1 (got {getattr(self, field)}).")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}).")
        if self.experts < 0 or self.experts == 1:
            raise ValueError(f"ModelConfig.experts is 0 (a dense MLP) or the number of experts, >= 2 (got "
                             f"{self.experts}).")
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"top_k = {self.top_k} experts per token, but only {self.experts} experts: use "
                             f"top_k <= experts.")
        if self.kv_heads is not None and not (1 <= self.kv_heads <= self.heads and self.heads % self.kv_heads == 0):
            raise ValueError(f"ModelConfig.kv_heads must divide heads = {self.heads} (1 to {self.heads}; None: "
                             f"{self.heads}), got {self.kv_heads}.")
        if self.ffn_hidden is not None and self.ffn_hidden < 1:
            raise ValueError(f"ModelConfig.ffn_hidden must be >= 1, or None: 4h (got {self.ffn_hidden}).")
        if self.expert_hidden is not None and self.expert_hidden < 1:
            raise ValueError(f"ModelConfig.expert_hidden must be >= 1 (got {self.expert_hidden}).")
        if self.capacity_factor is not None and not (0 < self.capacity_factor < math.inf):
            raise ValueError(f"ModelConfig.capacity_factor must be a finite number > 0, or None: dropless "
                             f"(got {self.capacity_factor}).")

    @property
    def kv_width(self) -> int:
        """K's (and V's) width: ``kv_heads`` heads of ``h/heads`` -- ``h`` without grouped-query attention."""
        return (self.heads if self.kv_heads is None else self.kv_heads) * (self.hidden // self.heads)

    @property
    def ffn(self) -> int:
        """``f``: the dense MLP's hidden size (``ffn_hidden``, or 4h)."""
        return 4 * self.hidden if self.ffn_hidden is None else self.ffn_hidden

    @property
    def layer_matrices(self) -> int:
        """A dense block's matrix weights: q and o ``h²`` each, k and v ``h × kv_width`` each, the MLP ``2hf`` (``3hf``
        gated) -- ``12h²`` for a GPT block.

            >>> ModelConfig(128256, 8192, 4096, 32, 32, kv_heads=8, ffn_hidden=14336, gated=True).layer_matrices
            218103808
        """
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_width + (3 if self.gated else 2) * h * self.ffn

    @property
    def expert_ffn(self) -> int:
        """``f``: each expert's hidden size (``expert_hidden``, or 4h)."""
        return 4 * self.hidden if self.expert_hidden is None else self.expert_hidden

    @classmethod
    def course(cls, vocab: int = 16, d_model: int = 64, n_heads: int = 4, n_layers: int = 2,
               max_seq_len: int = 64, tie_weights: bool = True) -> "ModelConfig":
        """The shape of :func:`coursekit.models.tiny_transformer` with the same arguments."""
        return cls(vocab, max_seq_len, d_model, n_layers, n_heads, tied=tie_weights, qkv_bias=False,
                   name="course transformer")

    @classmethod
    def gpt2_small(cls) -> "ModelConfig":
        """GPT-2 small (Radford et al. 2019): 124,439,808 parameters."""
        return cls(50257, 1024, 768, 12, 12, name="GPT-2 small")

    @classmethod
    def gpt3_175b(cls) -> "ModelConfig":
        """GPT-3 175B (Brown et al. 2020, Table 2.1): h = 12,288, 96 layers, 96 heads, s = 2,048."""
        return cls(50257, 2048, 12288, 96, 96, name="GPT-3 175B")

    @classmethod
    def mixtral_8x7b(cls) -> "ModelConfig":
        """Mixtral 8x7B's shape in this config's terms: h = 4,096, 32 layers, 32 heads, v = 32,000 (untied),
        8 experts, top-2, 32,768 positions (its ``config.json`` on the Hugging Face hub; Jiang et al. 2024,
        "Mixtral of Experts", arXiv:2401.04088). Its experts are SwiGLU MLPs: three ``h × 14,336`` matrices,
        as many parameters and FLOPs as the two of a GELU expert of ``f = 1.5 · 14,336 = 21,504`` (Shazeer
        2020 compares them at equal cost the same way), so ``expert_hidden=21504``.

        Mistral AI's figures, 46.7 B parameters in all and 12.9 B used per token, are what
        :func:`~coursekit.costmodel.num_params` counts less four named differences of the GPT-shaped block
        (multi-head attention: Mixtral's 8 key-value heads make K and V ``h × h/4``; learned positions:
        Mixtral has RoPE; LayerNorm's bias: RMSNorm has none; the attention projection's bias): 939.9 M,
        2.0% -- tests/test_costmodel_experts.py checks both figures to their three digits.
        """
        return cls(32000, 32768, 4096, 32, 32, tied=False, qkv_bias=False, name="Mixtral 8x7B", experts=8,
                   top_k=2, expert_hidden=21504)


@dataclass(frozen=True)
class Layout:
    """How the GPUs are used: ``dp × tp × pp × sp`` GPUs in all (any degree may be 1).

    ``ep``: expert parallelism *borrows from dp* -- the ``dp`` ranks that split the batch are grouped in
    ``dp/ep`` groups of ``ep`` neighbours, and each group splits a model's experts ``ep`` ways (``E/ep`` a
    rank), so ``ep`` must divide ``dp`` and adds no GPUs. torchtitan's ``ParallelDims`` ("EP would borrow
    all cp and some dp_shard degree": ``(dp_shard · cp) % ep == 0``) and Megatron Core's expert-data-parallel
    group do the same, and so does chapter 07's ``"expert"`` on its ``dp × ep`` mesh (its ``dp`` is this
    ``dp/ep``). An expert's gradient is then summed over the ``dp/ep`` ranks that hold it (the
    *expert-data-parallel* group), the dense ones over all ``dp``. With ``ep > 1`` the other model axes stay
    1: expert parallelism with tp or sp (torchtitan's ETP, its cp folding) is not modelled here.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    sp: int = 1
    zero: int = 0                   # ZeRO stage over the dp axis: 0 (plain data parallelism) to 3
    schedule: str = "1f1b"          # with pp > 1
    micro_batches: int = 1
    chunks: int = 1                 # model chunks per rank (interleaved schedule's v)
    recompute: str = "none"
    sequence_parallel: bool = False  # Megatron-style: tp's all-reduces become reduce-scatter + all-gather
    ep: int = 1                     # experts split over ep of the dp ranks (class docstring)

    def __post_init__(self):
        for field in ("dp", "tp", "pp", "sp", "micro_batches", "chunks", "ep"):
            if getattr(self, field) < 1:
                raise ValueError(f"Layout.{field} must be >= 1 (got {getattr(self, field)}).")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"Layout.zero is a ZeRO stage, 0 to 3 (got {self.zero}).")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"Layout.schedule must be one of {SCHEDULES} (got {self.schedule!r}).")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"Layout.recompute must be one of {RECOMPUTE} (got {self.recompute!r}).")
        if self.dp % self.ep:
            raise ValueError(f"ep = {self.ep} must divide dp = {self.dp}: the ep ranks are data-parallel ranks that "
                             f"also split the experts (ep borrows from dp); use a dp that is a multiple of {self.ep}.")
        if self.ep > 1 and (self.tp > 1 or self.sp > 1):
            raise ValueError(f"ep = {self.ep} with tp = {self.tp}, sp = {self.sp}: expert parallelism is modelled "
                             f"with dp and pp only; use tp = sp = 1, or ep = 1.")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.sp


@dataclass(frozen=True)
class Hardware:
    """One GPU's memory (bytes) and dense 16-bit speed (FLOP/s), and its links: ``intra_*`` inside a node of
    ``gpus_per_node`` (NVLink), the others between nodes (bytes/s, seconds).

    **How its compute is priced** -- two ways, chosen by ``matmul_efficiency``:

    * empty (the plain ``Hardware()`` and a CPU fitted by ``python -m coursekit.bench costmodel``): every FLOP at
      one share of peak, ``efficiency``, plus ``op_overhead`` (seconds an operation) and ``memory_bandwidth``
      (bytes/s of the memory-bound ops) where they are set (:mod:`coursekit.costmodel.overhead`). On a GPU
      preset of this kind ``efficiency`` 0.5 is Narayanan et al. 2021's *end-to-end* 44-52% of an A100's peak:
      a whole step's share, bubble and communication inside it, which :func:`~.step.step_time` then adds again
      -- a coarse model for the course's exercises, not for a cluster (issue 59).
    * a curve (:meth:`a100`, :meth:`h100`, :meth:`h100_hbm2e`): each kernel priced by its shape
      (:mod:`coursekit.costmodel.kernels`): a matmul of ``F`` FLOPs at ``flops`` × the efficiency of the largest
      threshold ``≤ F`` in ``matmul_efficiency`` ((FLOPs, share) pairs, largest first), plus its inputs and
      output through memory; every memory-bound kernel of ``B`` bytes at ``memory_bandwidth`` × the share in
      ``memory_efficiency`` ((bytes, share) pairs); a fused flash-attention kernel, where the run uses one, at
      ``attention_efficiency`` of peak. The efficiencies are a kernel's, so the bubble, the exposed
      communication and the optimizer are priced once each, on top. Collectives move ``intra_efficiency``
      and ``net_efficiency`` of the links' bandwidth; traffic hidden behind compute still costs that compute
      ``intra_processor_usage`` (``net_processor_usage``) of the traffic's time, the SMs that drive it
      (Calculon's ``processor_usage``: calculon/llm/layers.py, "it contributes to compute slowdown").
    """

    memory: float = 80e9
    flops: float = 312e12           # A100's bf16 dense peak
    efficiency: float = 0.5         # one share of peak for every FLOP (without a matmul_efficiency curve)
    gpus_per_node: int = 8
    intra_bandwidth: float = 300e9  # A100 NVLink 3, per direction
    intra_latency: float = 5e-6
    bandwidth: float = 25e9         # 200 Gb/s InfiniBand per GPU, per direction
    latency: float = 10e-6
    name: str = "A100 80 GB, 8 per node"
    op_overhead: float = 0.0        # seconds per dispatched op; 0: inside efficiency (docstring)
    memory_bandwidth: float = math.inf  # bytes/s of the memory-bound ops; inf: inside efficiency
    matmul_efficiency: tuple[tuple[float, float], ...] = ()   # (FLOPs, share), largest first; (): efficiency
    memory_efficiency: tuple[tuple[float, float], ...] = ((0.0, 1.0),)  # (bytes, share), largest first
    attention_efficiency: float = 0.0   # a flash-attention kernel's share of peak; 0: none on this card
    intra_efficiency: float = 1.0   # share of intra_bandwidth a collective reaches
    net_efficiency: float = 1.0     # share of bandwidth a collective reaches
    intra_processor_usage: float = 0.0  # share of hidden NVLink traffic's time its compute loses (Calculon's)
    net_processor_usage: float = 0.0    # the same for the network's

    def __post_init__(self):
        for field in ("flops", "efficiency", "intra_bandwidth", "bandwidth", "memory_bandwidth",
                      "intra_efficiency", "net_efficiency"):
            value = getattr(self, field)
            if not value > 0:
                raise ValueError(f"Hardware.{field} must be > 0 (got {value}): a speed or a share of one.")
        for field in ("matmul_efficiency", "memory_efficiency"):
            curve = getattr(self, field)
            sizes = [size for size, _ in curve]
            if sizes != sorted(sizes, reverse=True) or (curve and sizes[-1] != 0) or any(
                    not 0 < share <= 1 for _, share in curve):
                raise ValueError(f"Hardware.{field} is (size, share) pairs, sizes largest first down to 0, each "
                                 f"share in (0, 1] (got {curve!r}).")
        for field in ("intra_processor_usage", "net_processor_usage"):
            if not 0 <= getattr(self, field) < 1:
                raise ValueError(f"Hardware.{field} is a share in [0, 1) of hidden traffic's time that its compute "
                                 f"loses (got {getattr(self, field)}).")
        if not 0 <= self.attention_efficiency <= 1:
            raise ValueError(f"Hardware.attention_efficiency is a share of peak in [0, 1], 0 for no flash kernel "
                             f"(got {self.attention_efficiency}).")

    @property
    def by_shape(self) -> bool:
        """Whether kernels are priced by their shape (a ``matmul_efficiency`` curve) or at one ``efficiency``."""
        return bool(self.matmul_efficiency)

    @classmethod
    def a100(cls) -> "Hardware":
        """An A100 SXM 80 GB, 8 to a node, priced kernel by kernel: Calculon's system description
        (calculon-ai/calculon at caa4b11, systems/a100_80g.json -- the one its validation of Korthikanti et al.
        2022's Table 5 runs on): matmuls at 0.95 of 312 TFLOP/s from 128 GFLOP up, 0.9 from 16, 0.6 from 1,
        0.1 below; memory at 0.9 of its bandwidth from 100 MB up, 0.75 from 10, 0.6 from 1, 0.3 below; NVLink
        collectives at 0.65 of 300 GB/s, InfiniBand at 0.9 of 25 GB/s; hidden traffic costing its compute 0.15
        (NVLink) and 0.02 (InfiniBand) of its time (the file's ``processor_usage``). The bandwidth is NVIDIA's A100 80 GB
        SXM datasheet's 2,039 GB/s (Calculon rounds it to 2,048).

            >>> Hardware.a100().by_shape, Hardware().by_shape
            (True, False)
        """
        return cls(memory_bandwidth=2039e9, matmul_efficiency=((128e9, 0.95), (16e9, 0.9), (1e9, 0.6), (0.0, 0.1)),
                   memory_efficiency=((100e6, 0.9), (10e6, 0.75), (1e6, 0.6), (0.0, 0.3)),
                   intra_efficiency=0.65, net_efficiency=0.9, intra_processor_usage=0.15, net_processor_usage=0.02,
                   name="A100 SXM 80 GB, 8 per node, priced by shape")

    @classmethod
    def h100(cls, attention: str = "cudnn") -> "Hardware":
        """An H100 SXM 80 GB, 8 to a node (DGX/HGX H100), priced kernel by kernel as :meth:`a100`: 989e12 FLOP/s
        dense bf16 (NVIDIA's datasheet gives 1,979 "with sparsity"; half is the dense figure torchtitan's
        ``get_peak_flops`` and Megatron-LM divide by); NVLink 4 at 450e9 bytes/s per direction; one 400 Gb/s
        NIC per GPU, 50e9 bytes/s (DGX H100's ConnectX-7; Llama 3's and torchtitan's clusters); HBM3 at 3.35e12
        bytes/s (the datasheet). The efficiencies are Calculon's H100 system file's (calculon-ai/calculon at caa4b11,
        systems/h100_80g_nvl8.json: memory 0.9 / 0.75 / 0.6 / 0.3 from 100 / 10 / 1 / 0 MB, NVLink 0.65, the network
        0.9, hidden traffic's ``processor_usage`` 0.15 and 0.02), but for the matmuls': that file copies its A100 curve (0.95 / 0.9 / 0.6 / 0.1 from 128 / 16 / 1 / 0
        GFLOP), above what an H100 was measured to reach at its best shape, 794.5 of 989 TFLOP/s (80.3%: the
        "Maximum Achievable Matmul FLOPS" table, stas00/ml-engineering at 744d01e, compute/accelerator/README.md).
        So the curve's thresholds are Calculon's and its shares are scaled so that its top is that measured
        maximum (:data:`H100_MATMUL`: 0.803 / 0.761 / 0.507 / 0.085).

        Attention is a fused flash kernel (:data:`ATTENTION`, causal, the FLOPs it skips not priced):
        ``"cudnn"``, Transformer Engine's cuDNN kernel (NeMo, Megatron Core), or ``"flash2"``, FlashAttention-2
        (PyTorch's ``scaled_dot_product_attention`` on an H100: torchtitan). Their shares are the FlashAttention-3
        paper's measurements on an H100 SXM5 (Shah et al. 2024, arXiv:2407.08608, Figures 5 and 6: head
        dimension 128, sequence 8K, forward with the causal mask, backward without, the only backward printed).

            >>> h100 = Hardware.h100()
            >>> h100.flops / Hardware().flops, h100.by_shape, round(h100.attention_efficiency, 3)
            (3.1698717948717947, True, 0.527)
        """
        if attention not in ATTENTION:
            raise ValueError(f"attention is one of {sorted(ATTENTION)} (the flash kernel the run uses), got {attention!r}.")
        return cls(flops=989e12, intra_bandwidth=450e9, bandwidth=50e9, memory_bandwidth=3.35e12,
                   matmul_efficiency=H100_MATMUL,
                   memory_efficiency=((100e6, 0.9), (10e6, 0.75), (1e6, 0.6), (0.0, 0.3)),
                   attention_efficiency=ATTENTION[attention], intra_efficiency=0.65, net_efficiency=0.9,
                   intra_processor_usage=0.15, net_processor_usage=0.02,
                   name=f"H100 SXM 80 GB, 8 per node, priced by shape ({attention} attention)")

    @classmethod
    def h100_hbm2e(cls, attention: str = "cudnn") -> "Hardware":
        """The H100 torchtitan's Llama 3.1 8B benchmark ran on: 96 GB of HBM2e at 500 W, "between SXM and NVL" in
        speed (pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md, its footnote 2). Its peak is not
        published: torchtitan's MFU divides by the SXM's 989 TFLOP/s, and so does this description; links and
        efficiency as :meth:`h100`'s. What differs is the memory, 96e9 bytes, which decides whether the published
        layout fits (80 GB does not hold its FSDP-8 step).

            >>> Hardware.h100_hbm2e().memory / Hardware.h100().memory
            1.2
        """
        return replace(cls.h100(attention), memory=96e9, name=f"H100 96 GB HBM2e 500 W, 8 per node ({attention} attention)")
