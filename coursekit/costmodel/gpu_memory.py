"""Memory on the most loaded GPU of a layout: :mod:`.memory`'s terms put together for a :class:`~.config.Layout`.

:func:`memory_per_gpu` adds a rank's model states (:func:`rank_state_bytes`: :func:`~.memory.model_state_bytes`
of what :func:`~.params.params_per_rank` puts on it, the experts of an MoE in their own group) and its
activations (Table 2 per layer, :func:`~.memory.pipeline_activation_bytes` of them in flight, the logits on
the last stage), on the first and the last pipeline stage, and returns the larger.

    >>> course, plain = ModelConfig.course(), Layout(dp=2)          # 104,832 parameters, fp32: 16 bytes each
    >>> m = memory_per_gpu(course, plain, micro_batch=4, precision="fp32", dropout=False)
    >>> m.params + m.grads + m.optimizer
    1677312
"""

from __future__ import annotations

from dataclasses import dataclass

from ..measure.memory import exact_share
from .config import Layout, ModelConfig
from .experts import check_experts, mlp_activation_bytes, moe_activation_bytes
from .memory import (ModelStateBytes, activation_bytes_per_layer, logits_bytes, model_state_bytes,
                     pipeline_activation_bytes)
from .params import layer_params, params_per_rank

__all__ = ["rank_state_bytes", "GPUMemory", "memory_per_gpu"]


def rank_state_bytes(config: ModelConfig, layout: Layout, stage: int = 0, precision: str = "mixed",
                     largest_layer: int = 0) -> ModelStateBytes:
    """:func:`model_state_bytes` of what a rank of pipeline ``stage`` holds (:func:`~.params.params_per_rank`),
    ZeRO ``layout.zero`` over ``layout.dp`` -- and with expert parallelism two groups: the dense parameters
    sharded over all ``dp``, the rank's ``E/ep`` experts over the ``dp/ep`` ranks that hold the same ones
    (the expert-data-parallel group: torchtitan's FSDP over ``dp_shard_in_ep``, Megatron Core's distributed
    optimizer over its expert-data-parallel group).

        >>> moe = ModelConfig(16, 32, 16, 2, 2, experts=4)     # 3,232 dense parameters, 2 · 4 · 2,048 in experts
        >>> rank_state_bytes(moe, Layout(dp=4, ep=2, zero=1), precision="fp32").optimizer
        39232
        >>> 8 * 3232 // 4 + 8 * (16384 // 2) // 2     # Adam's 8 bytes: dense over dp = 4, experts over dp/ep = 2
        39232
    """
    count = params_per_rank(config, layout.tp, layout.pp, stage, layout.ep)
    if layout.ep == 1:
        return model_state_bytes(count.total, layout.dp, layout.zero, precision, largest_layer=largest_layer)
    dense = model_state_bytes(count.total - count.experts, layout.dp, layout.zero, precision,
                              largest_layer=largest_layer)
    experts = model_state_bytes(count.experts, layout.dp // layout.ep, layout.zero, precision)
    return ModelStateBytes(dense.params + experts.params, dense.grads + experts.grads,
                           dense.optimizer + experts.optimizer, dense.live)


@dataclass(frozen=True)
class GPUMemory:
    """Bytes on the most loaded GPU of a layout (pipeline ``stage``), by kind; ``buffers``: ZeRO-3's gathered layer."""

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    stage: int

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers


def memory_per_gpu(config: ModelConfig, layout: Layout, micro_batch: int, precision: str = "mixed",
                   dropout: bool = True, gathered_params: int | None = None, imbalance: float = 1.0) -> GPUMemory:
    """Model states + activations on the most loaded GPU of ``layout``: the first or the last pipeline stage.

    Model states: :func:`~.params.params_per_rank` of the stage (tp-split, the embedding on the first
    stage, the head on the last), ZeRO ``layout.zero`` over ``layout.dp`` (:func:`model_state_bytes`).
    Activations: :func:`activation_bytes_per_layer` at ``config.seq_len`` and ``micro_batch`` sequences
    (2 bytes, or 4 with ``precision="fp32"``), times layers and micro-batches in flight
    (:func:`pipeline_activation_bytes`), plus on the last stage the logits of the micro-batches between
    its forward and backward (:func:`logits_bytes`: one, GPipe's m). Context parallelism (``layout.sp``)
    divides the activations: each rank keeps s/sp of every sequence, and its queries' scores (ring
    attention's blockwise softmax keeps even fewer). Buffers: with ZeRO-3, ``gathered_params`` gathered at
    once (parameters and gradients; default: the larger of one block and the embedding, tp-split, as
    DeepSpeed's "largest layer"; chapter 02's ZeRO-3 gathers the whole model). Not modelled: the embedding's
    dropout mask and token ids, communication buffers, the allocator's fragmentation, a recomputed layer's
    working set.

    A mixture of experts: model states by :func:`rank_state_bytes` (the experts ``E/ep`` a rank, sharded over
    their ``dp/ep`` copies under ZeRO); each layer's MLP share of Table 2 replaced by the MoE layer's
    (:func:`~.experts.moe_activation_bytes`: ``k`` experts' hidden a token, the busiest rank's rows at
    ``imbalance``, capped by the capacity).

        >>> course, plain = ModelConfig.course(), Layout(dp=2)          # 104,832 parameters, fp32: 16 bytes each
        >>> m = memory_per_gpu(course, plain, micro_batch=4, precision="fp32", dropout=False)
        >>> m.params + m.grads + m.optimizer
        1677312
    """
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1 (got {micro_batch}).")
    check_experts(config, layout)
    stages = {0, layout.pp - 1}
    candidates = [_stage_memory(config, layout, micro_batch, stage, precision, dropout, gathered_params, imbalance)
                  for stage in sorted(stages)]
    return max(candidates, key=lambda m: m.total)


def _stage_memory(config, layout, micro_batch, stage, precision, dropout, gathered_params, imbalance) -> GPUMemory:
    count = params_per_rank(config, layout.tp, layout.pp, stage, layout.ep)
    if gathered_params is None:
        gathered_params = max(layer_params(config, layout.tp, layout.ep), count.embedding, count.head)
    states = rank_state_bytes(config, layout, stage, precision, largest_layer=gathered_params)
    e = 4 if precision == "fp32" else 2
    s, h = config.seq_len, config.hidden
    per_layer = activation_bytes_per_layer(s, micro_batch, h, config.heads, layout.tp, layout.sequence_parallel,
                                           layout.recompute, e, dropout, config.kv_width, config.ffn,
                                           config.gated).total
    if config.experts and layout.recompute != "full":   # the MLP's share becomes the MoE layer's; each sp rank
        tokens = s * micro_batch / layout.sp            # routes its own tokens (divided by sp with the rest below)
        per_layer += layout.sp * (moe_activation_bytes(config, tokens, layout.tp, layout.ep, e, dropout, imbalance)
                                  - mlp_activation_bytes(tokens, h, layout.tp, e, dropout, config.ffn, config.gated))
    pipe = pipeline_activation_bytes(per_layer, config.layers, layout.pp, layout.micro_batches, layout.schedule,
                                     layout.chunks, stage)
    activations = pipe.total
    if stage == layout.pp - 1:
        in_flight = layout.micro_batches if layout.schedule == "gpipe" else 1
        activations += in_flight * logits_bytes(s, micro_batch, h, config.vocab, layout.tp, layout.sequence_parallel,
                                                e, 4).total
    return GPUMemory(states.params, states.grads, states.optimizer, exact_share(activations, layout.sp), states.live,
                     stage)
