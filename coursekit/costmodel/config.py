"""What the cost model is asked about: a transformer's shape, a layout of the GPUs, and the hardware.

Three frozen dataclasses, shared by every part of :mod:`coursekit.costmodel` (memory, communication,
compute, the planner), so that each formula names its inputs the same way:

* :class:`ModelConfig` -- a GPT-shaped decoder: ``layers`` blocks of attention + a 4h MLP, learned
  positions, a final norm, an output head tied to the embedding or not. The course's own
  :func:`coursekit.models.tiny_transformer` is one (``qkv_bias=False``); GPT-2 and GPT-3 are others.
* :class:`Layout` -- how ``gpus`` are used: degrees ``dp × tp × pp × sp`` (torchtitan's axis names),
  the ZeRO stage over ``dp``, the pipeline schedule and micro-batches, activation recomputation.
* :class:`Hardware` -- one GPU's memory and speed, and the links inside and between nodes.

    >>> ModelConfig.gpt2_small().hidden, Layout(dp=2, tp=4).gpus
    (768, 8)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelConfig", "Layout", "Hardware", "RECOMPUTE", "SCHEDULES"]

RECOMPUTE = ("none", "selective", "full")          # Korthikanti et al. 2022, section 5
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb_h1")  # chapter 04's schedules


@dataclass(frozen=True)
class ModelConfig:
    """A GPT-shaped decoder-only transformer: ``h`` = ``hidden``, ``L`` = ``layers``, ``a`` = ``heads``,
    ``v`` = ``vocab``, ``s`` = ``seq_len`` (also the number of learned positions)."""

    vocab: int
    seq_len: int
    hidden: int
    layers: int
    heads: int
    tied: bool = True          # the output head is the token embedding (GPT-2, the course model)
    qkv_bias: bool = True      # GPT-2 has one; the course model has none (see coursekit.models.SelfAttention)
    name: str = "custom"

    def __post_init__(self):
        for field in ("vocab", "seq_len", "hidden", "layers", "heads"):
            if getattr(self, field) < 1:
                raise ValueError(f"ModelConfig.{field} must be >= 1 (got {getattr(self, field)}).")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}).")

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


@dataclass(frozen=True)
class Layout:
    """How the GPUs are used: ``dp × tp × pp × sp`` GPUs in all (any degree may be 1)."""

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

    def __post_init__(self):
        for field in ("dp", "tp", "pp", "sp", "micro_batches", "chunks"):
            if getattr(self, field) < 1:
                raise ValueError(f"Layout.{field} must be >= 1 (got {getattr(self, field)}).")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"Layout.zero is a ZeRO stage, 0 to 3 (got {self.zero}).")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"Layout.schedule must be one of {SCHEDULES} (got {self.schedule!r}).")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"Layout.recompute must be one of {RECOMPUTE} (got {self.recompute!r}).")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.sp


@dataclass(frozen=True)
class Hardware:
    """One GPU's memory (bytes) and dense 16-bit speed (FLOP/s, at ``efficiency`` of peak), and its links:
    ``intra_*`` inside a node of ``gpus_per_node`` (NVLink), the others between nodes (bytes/s, seconds)."""

    memory: float = 80e9
    flops: float = 312e12           # A100's bf16 dense peak
    efficiency: float = 0.5         # the share of peak a well-tuned step reaches
    gpus_per_node: int = 8
    intra_bandwidth: float = 300e9  # A100 NVLink 3, per direction
    intra_latency: float = 5e-6
    bandwidth: float = 25e9         # 200 Gb/s InfiniBand per GPU, per direction
    latency: float = 10e-6
    name: str = "A100 80 GB, 8 per node"
