"""A mixture of experts in the cost model: the experts' parameters, the rows a batch sends them, what they keep.

A block's MLP becomes a router and ``E`` expert MLPs (:class:`~.config.ModelConfig` with ``experts > 0``, the
shape of chapter 07's :class:`coursekit.parallel.expert.MoE`); each of a rank's ``T`` tokens goes to ``k`` of
them. With expert parallelism (``Layout.ep``, borrowed from dp) a rank keeps ``E/ep`` experts, and each MoE
layer sends every token's ``k`` rows to the ranks of their experts and the outputs back: one all-to-all each
way forward (GShard's *dispatch* and *combine*, Lepikhin et al. 2020, section 2.2; Megatron Core's
``MoEAlltoAllTokenDispatcher``; torchtitan's ``ExpertParallel``), both again backward with the gradients.
How many rows each expert takes is announced first (chapter 07's ``dispatch`` exchanges the counts, torchtitan
all-to-alls them): control traffic, a few integers per expert, not counted as payload here.

Rows per rank and micro-batch (:func:`expert_rows`): ``k·T`` on average; the busiest rank of ``ep`` takes
``imbalance`` times that (``imbalance``: the busiest rank's rows over the mean, 1 for even routing); a
``capacity_factor`` caps an expert at ``C = ceil(factor·k·T/E)`` rows from each rank (GShard; Switch,
Fedus et al. 2021, section 2.2), so a rank at ``E·C`` (``E/ep`` experts × ``ep`` senders × ``C``) whatever
the imbalance. The course's dispatch sends what was kept, unpadded (as Megatron Core's dropless default);
frameworks that pad each expert's buffer to ``C`` (GShard's ``(E, C, h)`` dispatch tensors, Megatron's
``--moe-pad-expert-input-to-capacity``) send and hold ``E·C`` rows whatever the routing -- this module's
bound at ``imbalance ≥ E·C/(k·T)``.

    >>> mixtral = ModelConfig.mixtral_8x7b()
    >>> expert_params(mixtral), router_params(mixtral)                 # 2hf = 3 · 4,096 · 14,336; E·h
    (176160768, 32768)
    >>> expert_rows(ModelConfig(16, 32, 16, 2, 2, experts=4, top_k=2, capacity_factor=0.5), tokens=64, ep=2)
    ExpertRows(mean=64, busiest=64, capacity=16)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..measure.memory import exact_share
from .config import Layout, ModelConfig
from .rows import Collective

__all__ = ["expert_params", "router_params", "check_experts", "ExpertRows", "expert_rows", "expert_collectives",
           "mlp_activation_bytes", "moe_activation_bytes"]


def expert_params(config: ModelConfig) -> int:
    """One expert's parameters: ``h -> f -> h`` without biases, ``2hf`` (0 for a dense model)."""
    return 2 * config.hidden * config.expert_ffn if config.experts else 0


def router_params(config: ModelConfig) -> int:
    """One router's parameters: a linear layer ``h -> E`` without bias, ``E·h`` (its balancing bias is a buffer)."""
    return config.experts * config.hidden


def check_experts(config: ModelConfig, layout: Layout) -> None:
    """Raise ``ValueError`` saying what to change when ``layout``'s ``ep`` (or tp) cannot split ``config``'s experts."""
    E, ep = config.experts, layout.ep
    if ep > 1 and not E:
        raise ValueError(f"ep = {ep} needs an MoE model (ModelConfig.experts > 0): {config.name} is dense, it has no "
                         f"experts to split; use ep = 1.")
    if E and E % ep:
        raise ValueError(f"experts {E} over ep {ep}: ep must divide the expert count (each rank keeps E/ep whole "
                         f"experts); use an ep that divides {E}.")
    if E and config.expert_ffn % layout.tp:
        raise ValueError(f"tp = {layout.tp} must divide the experts' hidden size ({config.expert_ffn}): tp splits every "
                         f"expert as it splits the MLP (Megatron Core's expert tensor parallelism = tp).")
    if E and layout.sequence_parallel:
        raise ValueError("Megatron-style sequence parallelism of an MoE layer is not modelled here: use "
                         "sequence_parallel=False for a model with experts.")


@dataclass(frozen=True)
class ExpertRows:
    """Rows (token assignments) a rank's experts compute in one micro-batch: the ``mean`` over ranks, the
    ``busiest`` rank's, and ``capacity``, the most an expert takes from one rank (None: dropless)."""

    mean: float
    busiest: float
    capacity: int | None = None


def expert_rows(config: ModelConfig, tokens: float, ep: int = 1, imbalance: float = 1.0) -> ExpertRows:
    """The rows of one micro-batch of ``tokens`` tokens a rank (this module's docstring): ``k·T``, the busiest
    ``imbalance·k·T`` (with ``ep = 1`` a rank holds every expert: it computes all its tokens' rows, however
    they spread over the experts), each capped at ``E·C`` with a capacity factor."""
    if imbalance < 1:
        raise ValueError(f"imbalance is the busiest rank's rows over the mean: >= 1 (got {imbalance}).")
    k_t = config.top_k * tokens
    busiest = k_t * imbalance if ep > 1 else k_t
    if config.capacity_factor is None:
        return ExpertRows(k_t, busiest)
    capacity = math.ceil(config.capacity_factor * k_t / config.experts)
    most = config.experts * capacity
    return ExpertRows(min(k_t, most), min(busiest, most), capacity)


def expert_collectives(config: ModelConfig, layout: Layout, micro_batch: int, tokens: float, layers: int,
                       imbalance: float = 1.0) -> list[Collective]:
    """ep's all-to-alls in one step: per MoE layer and micro-batch a dispatch and a combine of ``rows·h``
    elements each forward (``(ep−1)/ep`` of them leave the rank), and both again backward with the gradients;
    full recomputation dispatches and combines once more. ``tokens`` per sample, ``layers`` on this stage.

    For even routing a rank sends ``4 · (ep−1)/ep · k·b·s·h`` elements per MoE layer and micro-batch; with
    ``imbalance`` the busiest rank receives (dispatch) and sends back (combine) that many times more.
    """
    if layout.ep == 1:
        return []
    rows = expert_rows(config, micro_batch * tokens, layout.ep, imbalance).busiest
    forwards = 2 if layout.recompute == "full" else 1
    count = (forwards + 1) * layers * layout.micro_batches
    n = rows * config.hidden
    return [Collective("ep", "all_to_all", layout.ep, n, count, "dispatch: tokens to their experts' ranks"),
            Collective("ep", "all_to_all", layout.ep, n, count, "combine: the experts' outputs back")]


def mlp_activation_bytes(tokens: float, hidden: int, tp: int = 1, bytes_per_element: int = 2,
                         dropout: bool = True, ffn_hidden: int | None = None, gated: bool = False) -> float:
    """The dense MLP's share of Korthikanti et al. 2022's Table 2 (their section 4.1, "MLP": 19sbh at 2
    bytes for f = 4h): its input ``h`` (unsplit with tp), the GeLU's input and the second matmul's input ``f``
    each (split t ways; SwiGLU's three ``f``, as :func:`~.memory.activation_bytes_per_layer` counts them), the
    dropout mask after it (1 byte, unsplit). Per token: ``(e + mask)·h + 2e·f/t`` (``3e·f/t`` gated)."""
    mask, f = (1 if dropout else 0), (4 * hidden if ffn_hidden is None else ffn_hidden)
    return (tokens * hidden * (bytes_per_element + mask)
            + exact_share((3 if gated else 2) * bytes_per_element * tokens * f, tp))


def moe_activation_bytes(config: ModelConfig, tokens: float, tp: int = 1, ep: int = 1, bytes_per_element: int = 2,
                         dropout: bool = True, imbalance: float = 1.0) -> float:
    """What one MoE layer keeps for backward on the busiest rank, ``tokens`` tokens a rank (what autograd saves
    in chapter 07's layer, in Table 2's terms; the int64 indices of the routing are left out as Korthikanti et
    al. leave out LayerNorm's statistics):

    ===========================================  ==============================  ===========
    the router's and the dispatch's input        ``T·h``                         unsplit
    the router's probabilities (softmax output)  ``T·E``                         unsplit
    the experts' input rows, as dispatched       ``R·h``                         unsplit
    each expert's GELU input and output          ``2·R·f``                       split t ways
    the experts' outputs back, and the gates     ``K·h + K`` (the gate's grad)   unsplit
    the dropout mask after the layer             ``T·h``, 1 byte                 unsplit
    ===========================================  ==============================  ===========

    ``K``: this rank's own kept assignments (``k·T``, fewer with drops), ``R``: the rows its experts compute
    (:func:`expert_rows`' busiest: the imbalance and the capacity count here). Elements at ``e`` bytes.
    """
    rows = expert_rows(config, tokens, ep, imbalance)
    e, mask, h = bytes_per_element, (1 if dropout else 0), config.hidden
    unsplit = tokens * h * (e + mask) + e * tokens * config.experts + e * rows.busiest * h + e * rows.mean * (h + 1)
    return unsplit + exact_share(2 * e * rows.busiest * config.expert_ffn, tp)
