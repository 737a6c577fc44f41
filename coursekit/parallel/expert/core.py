"""Expert parallelism: a mixture-of-experts layer whose experts live on different ranks.

A mixture-of-experts (MoE) layer replaces one MLP by ``E`` of them, the *experts*, and a *router* that sends each
token to ``k`` of them. A token's output is the gate-weighted sum of its experts' outputs; the other ``E - k``
experts never see it. So the model holds E times the MLP's weights, while a token costs only k MLPs of compute.

Read in this order:

1. :class:`Router` -- a linear layer scores every expert, softmax makes the scores probabilities, and the top k
   are the token's experts; their probabilities are its *gates*. A per-expert ``bias`` shifts which experts are
   chosen, never the gates (DeepSeek-V3's balancing without an auxiliary loss: :func:`nudge_bias`).
2. :func:`load_balance_loss` -- the Switch Transformer's auxiliary loss, ``E · Σ_i f_i · P_i``: 1 when the
   tokens spread evenly, up to E when they all go to one expert.
3. :func:`keep_within_capacity` -- the capacity regime (GShard, Switch): an expert takes at most
   ``C = ceil(factor · k · T / E)`` of the ``T`` tokens' assignments; the rest are dropped (first choices first).
4. :func:`route` and :class:`MoE` -- the assignments sorted by expert; the layer on one process: the reference.
5. :func:`dispatch` and :func:`combine` -- expert parallelism: each of ``ep`` ranks holds ``E / ep`` experts.
   Dispatch sends every token to the ranks of its experts (first how many, then one all-to-all of uneven
   pieces); each rank runs its experts on what arrived; combine is the all-to-all back and the gate-weighted sum.
   Backward runs through both all-to-alls, reversed.
6. :class:`ExpertParallelMoE` -- the layer with its experts spread over a group.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ... import comm
from ...comm.mesh import rank_size
from ..sequence.comm import all_to_all
from ..sequence.exchange import exchange

__all__ = ["Router", "Experts", "MoE", "ExpertParallelMoE", "load_balance_loss", "nudge_bias",
           "keep_within_capacity", "route", "dispatch", "combine", "Routing"]


def check_routing(n_experts: int, k: int = 1, capacity_factor: float | None = None) -> None:
    """Refuse, in one sentence that says what to change, a routing that cannot work: otherwise torch's topk fails
    naming nothing of the layer (k > E), or the layer quietly returns zeros (k = 0) or drops every token (factor 0)."""
    if not isinstance(n_experts, int) or n_experts < 1:
        raise ValueError(f"n_experts = {n_experts!r}: use a whole number of experts, 1 or more")
    if not isinstance(k, int) or not 1 <= k <= n_experts:
        raise ValueError(f"k = {k!r} experts per token out of n_experts = {n_experts}: use a whole number "
                         f"with 1 <= k <= {n_experts}")
    if capacity_factor is not None and not (math.isfinite(capacity_factor) and capacity_factor > 0):
        raise ValueError(f"capacity_factor = {capacity_factor!r}: an expert takes at most ceil(factor·k·T/E) "
                         f"tokens, so use a finite factor > 0 (such as 1.25), or None to drop nothing")


class Router(nn.Module):
    """Scores ``n_experts`` experts for each token and picks the top ``k``: ``(probs, chosen, gates)``."""

    def __init__(self, d_model: int, n_experts: int, k: int = 1):
        super().__init__()
        check_routing(n_experts, k)
        self.k = k
        self.score = nn.Linear(d_model, n_experts, bias=False)
        self.register_buffer("bias", torch.zeros(n_experts))  # chooses, never weighs (see nudge_bias)

    def forward(self, x: torch.Tensor):
        probs = F.softmax(self.score(x), dim=-1)                    # (T, E)
        chosen = torch.topk(probs + self.bias, self.k).indices      # (T, k): each token's experts
        gates = probs.gather(1, chosen)                             # (T, k): their weights, from the probabilities
        return probs, chosen, gates


class Experts(nn.Module):
    """Experts ``first, first + 1, ...`` of a layer's MLPs (d -> d_ff -> d, GELU), their weights stacked on dim 0
    (``w1``: ``(experts, d, d_ff)``): a rank of expert parallelism keeps the rows of its experts (:meth:`part`)."""

    def __init__(self, w1: torch.Tensor, w2: torch.Tensor, first: int = 0):
        super().__init__()
        self.first, self.w1, self.w2 = first, nn.Parameter(w1), nn.Parameter(w2)

    @classmethod
    def drawn(cls, n_experts: int, d_model: int, d_ff: int, seed: int = 0) -> "Experts":
        """All ``n_experts``, weights drawn from ``seed``."""
        g = torch.Generator().manual_seed(seed)
        return cls(torch.randn(n_experts, d_model, d_ff, generator=g) / math.sqrt(d_model),
                   torch.randn(n_experts, d_ff, d_model, generator=g) / math.sqrt(d_ff))

    def part(self, first: int, count: int) -> "Experts":
        """A copy of experts ``first ... first + count - 1`` of these (what one rank of expert parallelism keeps)."""
        rows = slice(first, first + count)
        return Experts(self.w1.detach()[rows].clone(), self.w2.detach()[rows].clone(), self.first + first)

    def forward(self, x: torch.Tensor, rows_per_expert: list[int]) -> torch.Tensor:
        """``x``: the rows of local expert 0, then of expert 1, ... (``rows_per_expert`` of each)."""
        pieces = x.split(rows_per_expert)
        return torch.cat([F.gelu(p @ self.w1[e]) @ self.w2[e] for e, p in enumerate(pieces)])


def load_balance_loss(probs: torch.Tensor, chosen: torch.Tensor, n_experts: int) -> torch.Tensor:
    """The Switch Transformer's auxiliary loss (Fedus et al. 2021, eq. 4): ``E · Σ_i f_i · P_i``, where ``f_i`` is
    the share of the ``T·k`` assignments that went to expert i (counted: no gradient) and ``P_i`` the mean
    probability the router gave it (its gradient pushes probability away from the busy experts).

    No tokens (a rank whose slice of the batch is empty): 0, not 0/0 = NaN, and still on the router's graph so
    that backward runs on that rank as on the others."""
    if chosen.numel() == 0:
        return probs.sum() * 0
    f = torch.bincount(chosen.flatten(), minlength=n_experts).float() / chosen.numel()
    return n_experts * (f * probs.mean(0)).sum()


@torch.no_grad()
def nudge_bias(router: Router, tokens_per_expert: torch.Tensor, rate: float = 1e-3) -> None:
    """DeepSeek-V3's balancing without a loss: after each step, raise the bias of every expert that got fewer
    tokens than the mean by ``rate`` and lower the others' (a busy expert is chosen a little less often)."""
    router.bias += rate * torch.sign(tokens_per_expert.float().mean() - tokens_per_expert.float())


def keep_within_capacity(chosen: torch.Tensor, n_experts: int, factor: float | None) -> torch.Tensor:
    """Which assignments (T, k) an expert takes: all (``factor=None``: dropless), or its first
    ``ceil(factor·k·T/E)`` -- first choices before second choices, then in token order."""
    check_routing(n_experts, capacity_factor=factor)
    if factor is None:
        return torch.ones_like(chosen, dtype=torch.bool)
    tokens, k = chosen.shape
    capacity = math.ceil(factor * k * tokens / n_experts)
    order = chosen.t().flatten()                                     # slot-major: every first choice first
    place = (F.one_hot(order, n_experts).cumsum(0) * F.one_hot(order, n_experts)).sum(1) - 1  # its place in line
    return (place < capacity).view(k, tokens).t()


class Routing:
    """One batch's assignments, sorted by expert: which token each row is, its gate, how many rows per expert."""

    def __init__(self, chosen: torch.Tensor, gates: torch.Tensor, keep: torch.Tensor, n_experts: int):
        token = torch.arange(chosen.shape[0], device=chosen.device).unsqueeze(1).expand_as(chosen)[keep]
        expert, gate = chosen[keep], gates[keep]
        order = torch.argsort(expert, stable=True)                  # by expert, then token
        self.token, self.gate, self.expert = token[order], gate[order], expert[order]
        self.per_expert = torch.bincount(self.expert, minlength=n_experts)


def route(router: Router, x: torch.Tensor, n_experts: int, capacity_factor: float | None):
    """Route ``x``: ``(probs, chosen, routing)``, the assignments within capacity sorted by expert."""
    probs, chosen, gates = router(x)
    return probs, chosen, Routing(chosen, gates, keep_within_capacity(chosen, n_experts, capacity_factor), n_experts)


class MoE(nn.Module):
    """The layer on one process: route, run each expert on its rows, add the gate-weighted outputs.

    Returns ``(output, aux_loss)``. A token whose every assignment was dropped gets 0 here: in a block
    (``x + moe(x)``) its output is its residual.
    """

    def __init__(self, d_model: int, d_ff: int, n_experts: int, k: int = 1, capacity_factor: float | None = None,
                 seed: int = 0):
        super().__init__()
        check_routing(n_experts, k, capacity_factor)
        self.n_experts, self.capacity_factor = n_experts, capacity_factor
        with torch.random.fork_rng():                                # the router's weights from the seed alone
            torch.manual_seed(seed)
            self.router = Router(d_model, n_experts, k)
        self.experts = Experts.drawn(n_experts, d_model, d_ff, seed=seed)

    def forward(self, x: torch.Tensor):
        probs, chosen, routing = route(self.router, x, self.n_experts, self.capacity_factor)
        y = self.experts(x[routing.token], routing.per_expert.tolist())
        out = torch.zeros_like(x).index_add(0, routing.token, y * routing.gate.unsqueeze(1))
        return out, load_balance_loss(probs, chosen, self.n_experts)


def dispatch(x: torch.Tensor, routing: Routing, group=None):
    """Send each assignment's token to the rank of its expert; returns ``(rows, rows_per_local_expert, plan)``.

    ``rows`` holds what every rank sent us, grouped by our experts; ``plan`` is what :func:`combine` needs to
    send the outputs back. Experts are laid out in order: rank r holds experts ``r·E/ep ... (r+1)·E/ep - 1``.
    """
    rank, ep = rank_size(group)
    local = len(routing.per_expert) // ep
    counts = routing.per_expert.view(ep, local)                       # (to rank j, its expert e): rows we send
    with comm.control():                                            # how many rows each rank will receive
        incoming = torch.stack(exchange(list(counts), [[local]] * ep, group, "expert counts"))  # (from j, our e)
    rows = all_to_all(x[routing.token], 0, 0, counts.sum(1).tolist(), incoming.sum(1).tolist(), group, "dispatch")
    # arrived grouped by sender, then expert; our experts want them grouped by expert, then sender
    by_sender = torch.arange(rows.shape[0], device=rows.device).split(incoming.flatten().tolist())
    by_expert = torch.cat([by_sender[j * local + e] for e in range(local) for j in range(ep)])
    return rows[by_expert], incoming.sum(0).tolist(), (counts, incoming, by_expert)


def combine(y: torch.Tensor, routing: Routing, plan, tokens: int, group=None) -> torch.Tensor:
    """The experts' outputs back to the ranks their tokens came from, each weighted by its gate and summed
    into its token's row (``tokens`` rows)."""
    counts, incoming, by_expert = plan
    back = torch.empty_like(y).index_copy(0, by_expert, y)          # grouped by sender again
    mine = all_to_all(back, 0, 0, incoming.sum(1).tolist(), counts.sum(1).tolist(), group, "combine")
    return y.new_zeros(tokens, y.shape[1]).index_add(0, routing.token, mine * routing.gate.unsqueeze(1))


class ExpertParallelMoE(nn.Module):
    """:class:`MoE` with its experts spread over ``group``: this rank keeps ``E / ep`` of them and the whole
    router (a dense parameter: its gradient is summed over the ranks, as data parallelism does)."""

    def __init__(self, moe: MoE, group=None):
        super().__init__()
        rank, ep = rank_size(group)
        if moe.n_experts % ep:
            raise ValueError(f"{moe.n_experts} experts over ep = {ep} ranks: use an ep that divides the expert count")
        local = moe.n_experts // ep
        self.group, self.n_experts, self.capacity_factor = group, moe.n_experts, moe.capacity_factor
        self.router, self.experts = moe.router, moe.experts.part(rank * local, local)

    def forward(self, x: torch.Tensor):
        probs, chosen, routing = route(self.router, x, self.n_experts, self.capacity_factor)
        self.chosen_counts = torch.bincount(chosen.flatten(), minlength=self.n_experts)  # for balancing (nudge_bias)
        rows, per_expert, plan = dispatch(x, routing, self.group)
        out = combine(self.experts(rows, per_expert), routing, plan, x.shape[0], self.group)
        return out, load_balance_loss(probs, chosen, self.n_experts)
