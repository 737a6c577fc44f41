"""How many parameters a GPT-shaped transformer has, in all and on one rank of a tp × pp layout.

For the shape of :class:`~coursekit.costmodel.config.ModelConfig` (learned positions, pre-norm blocks with
biases, a 4h MLP, a final norm; Radford et al. 2019's GPT-2, this course's :func:`coursekit.models.tiny_transformer`):

=====================  ==========================  ===========================================
piece                  parameters                  where
=====================  ==========================  ===========================================
token embedding        v·h                         ``tok_emb`` (also the head when tied)
positions              s·h                         ``pos_emb``
one layer              12h² + 13h                  qkv 3h² + 3h, proj h² + h, fc 4h² + 4h,
                                                   out 4h² + h, two LayerNorms 2 · 2h
final norm             2h                          ``ln_f``
head                   v·h untied, 0 tied          ``head``
=====================  ==========================  ===========================================

so N = h(v + s) + L(12h² + 13h) + 2h for a tied head (the "12Lh²" of the scaling-law papers is the
layers' matrices alone). A model without a qkv bias (the course's: softmax ignores a key bias) has 3h fewer
per layer; an untied head adds v·h.

A mixture of experts (``experts`` = E > 0, :mod:`.experts`) replaces the MLP's ``8h² + 5h`` by a router
``E·h`` and E experts of ``2hf`` (no biases): a layer is ``4h² + 8h + E·h + 2Ehf`` (3h fewer without a qkv bias). A token uses ``k`` of the
experts: :func:`active_params` counts those (Mixtral's "12.9 B active of 46.7 B").

    >>> num_params(ModelConfig.gpt2_small()).total       # GPT-2 small: h 768, L 12, v 50,257, s 1,024
    124439808
    >>> num_params(ModelConfig.course()).total           # tiny_transformer(): 64·(16 + 64) + 2·49,984 + 128
    104832
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import ModelConfig
from .experts import expert_params, router_params

__all__ = ["ParamCount", "num_params", "layer_params", "stage_layers", "params_per_rank", "active_params"]


@dataclass(frozen=True)
class ParamCount:
    """Parameters by piece; ``per_layer`` is one block, ``layers`` all the blocks counted (of a stage, on a rank);
    ``experts``: the experts' share of ``layers`` (the parameters expert parallelism splits; 0 if dense)."""

    embedding: int
    positions: int
    per_layer: int
    layers: int
    final_norm: int
    head: int
    experts: int = 0

    @property
    def total(self) -> int:
        return self.embedding + self.positions + self.layers + self.final_norm + self.head


def layer_params(config: ModelConfig, tp: int = 1, ep: int = 1) -> int:
    """One block's parameters on one of ``tp`` tensor-parallel ranks (Megatron-LM's split, Shoeybi et al. 2019).

    The matrices and the biases of the column-parallel layers (qkv, fc) are split t ways: (12h² + 7h)/t;
    the row-parallel layers' biases (proj, out: 2h) and both LayerNorms (4h) are replicated on every rank.
    Without a qkv bias, 3h fewer.

    An MoE block on one of ``ep`` expert-parallel ranks: attention as above, ``E/ep`` experts each split t ways
    (Megatron Core's default expert tensor parallelism, ETP = TP), the router and the norms replicated:
    ``(4h² + 3h)/t + (E/ep)·2hf/t + h + 4h + E·h`` (3h fewer without a qkv bias).

        >>> layer_params(ModelConfig.gpt2_small()), layer_params(ModelConfig.gpt2_small(), tp=4)
        (7087872, 1775424)
    """
    h = config.hidden
    if config.experts:
        attention = _divide(4 * h * h + (3 * h if config.qkv_bias else 0), tp, "4h² (+ 3h) (attention's split part)")
        experts = _divide(config.experts // ep * expert_params(config), tp, "the experts' matrices (E/ep · 2hf)")
        return attention + experts + 5 * h + router_params(config)
    # qkv (its bias), proj, fc (its bias: f, 2f gated), out; 12h² + 7h for a GPT block
    qkv_bias = (config.hidden + 2 * config.kv_width) if config.qkv_bias else 0
    split = config.layer_matrices + (2 if config.gated else 1) * config.ffn + qkv_bias
    return _divide(split, tp, "12h² + 7h (a layer's split part)") + 6 * h


def num_params(config: ModelConfig) -> ParamCount:
    """The whole model's parameters by piece: h(v + s) + L(12h² + 13h) + 2h, + vh when untied.

        >>> count = num_params(ModelConfig.gpt2_small())
        >>> count.embedding, count.positions, count.per_layer, count.final_norm, count.head
        (38597376, 786432, 7087872, 1536, 0)
    """
    return params_per_rank(config)


def stage_layers(layers: int, pp: int, stage: int) -> int:
    """Blocks on pipeline ``stage`` of ``pp``: L/pp, the first L mod pp stages one more when it does not divide.

        >>> [stage_layers(10, 4, s) for s in range(4)]
        [3, 3, 2, 2]
    """
    if not 0 <= stage < pp:
        raise ValueError(f"stage must be 0 to pp - 1 = {pp - 1} (got {stage}).")
    if layers < pp:
        raise ValueError(f"{layers} layers cannot fill {pp} pipeline stages: each stage needs at least one.")
    return layers // pp + (stage < layers % pp)


def params_per_rank(config: ModelConfig, tp: int = 1, pp: int = 1, stage: int = 0, ep: int = 1) -> ParamCount:
    """What one rank of pipeline ``stage`` holds with tensor parallelism over ``tp`` ranks (and, for an MoE,
    ``E/ep`` experts in each of its blocks: ``ParamCount.experts``).

    The first stage holds the token embedding (vocabulary-parallel: v·h/t) and the positions (replicated,
    s·h); the last stage the final norm (replicated) and the head (v·h/t). A tied head on a pipeline of
    pp > 1 stages is a *copy* of the embedding on the last stage, whose gradient the two stages sum (chapter
    03's ``sum_tied_gradients``; Megatron-LM does the same): both ends then hold v·h/t. Stage 0 is the most
    loaded rank in Megatron-LM's ``theoretical_memory_usage.py`` ("1/pp of the layers + the embedding").

        >>> gpt2 = ModelConfig.gpt2_small()
        >>> params_per_rank(gpt2, tp=2, pp=2, stage=0).total       # 38,597,376/2 + 786,432 + 6 · 3,546,240
        41362560
        >>> params_per_rank(gpt2, tp=2, pp=2, stage=1).head        # the tied head's copy
        19298688
    """
    for name, degree in (("tp", tp), ("pp", pp), ("ep", ep)):
        if degree < 1:
            raise ValueError(f"{name} must be >= 1 (got {degree}).")
    if config.experts % ep:
        raise ValueError(f"experts {config.experts} over ep {ep}: ep must divide the expert count.")
    h, first, last = config.hidden, stage == 0, stage == pp - 1
    n_layers, per_layer = stage_layers(config.layers, pp, stage), layer_params(config, tp, ep)
    vocab_share = _divide(config.vocab * h, tp, "the vocabulary's rows (v·h)")
    head = vocab_share if last and (not config.tied or pp > 1) else 0
    experts = n_layers * (config.experts // ep) * expert_params(config) // tp
    return ParamCount(embedding=vocab_share if first else 0, positions=config.seq_len * h if first else 0,
                      per_layer=per_layer, layers=n_layers * per_layer, final_norm=2 * h if last else 0,
                      head=head, experts=experts)


def active_params(config: ModelConfig) -> int:
    """Parameters a token uses: all of a dense model's; of an MoE's experts only ``k`` of ``E`` a layer.

        >>> mixtral = ModelConfig.mixtral_8x7b()
        >>> num_params(mixtral).total - active_params(mixtral) == 32 * 6 * expert_params(mixtral)   # 6 unused
        True
    """
    return num_params(config).total - config.layers * (config.experts - config.top_k) * expert_params(config) \
        if config.experts else num_params(config).total


def _divide(count: int, parts: int, what: str) -> int:
    if count % parts:
        raise ValueError(f"tp = {parts} does not divide {what} = {count}: choose a tp that divides the hidden size "
                         f"and the vocabulary (Megatron-LM pads the vocabulary to a multiple of 128·tp).")
    return count // parts
