"""Expert parallelism's core (issue 45, items 1-2): routing, balance, capacity, and experts spread over ranks.

Expected values are derived by hand from the definitions (the Switch Transformer's loss, GShard's capacity), and
the parallel layer is held to the one-process layer (:class:`MoE`) on the same weights and tokens: each rank's
output rows, the experts' gradients on the rank that holds them, the router's summed over the ranks.

Planted bugs, seen failing:
* the received rows left grouped by sender (not by expert) -> "ep=2 E=4 k=1: output of rank 0 differs";
* combine without the gates -> "ep=2 E=4 k=1: output of rank 0 differs";
* the capacity counted in token order (a token's second choice before the next token's first) -> the hand-derived
  mask of test_capacity_keeps_first_choices_first_then_token_order;
* the counts exchange recorded as payload -> "ep=2 E=4 k=1: payload 164 elements, the routing says 160".
"""

from __future__ import annotations

import math

import pytest
import torch

import coursekit
from coursekit.parallel.expert import (ExpertParallelMoE, MoE, Router, Routing, keep_within_capacity,
                                       load_balance_loss, nudge_bias)

D, FF = 8, 16


def test_capacity_keeps_first_choices_first_then_token_order():
    """T=4 tokens, k=2, E=4, factor 1: C = ceil(1·2·4/4) = 2 rows an expert. First choices 0, 0, 0, 3; second
    choices 1, 2, 1, 0. Expert 0 is first choice of tokens 0, 1, 2: it takes 0 and 1, drops token 2's first choice
    and token 3's second. Experts 1, 2, 3 take 2, 1, 1 rows: all kept. Dropless (factor None): everything."""
    chosen = torch.tensor([[0, 1], [0, 2], [0, 1], [3, 0]])
    assert keep_within_capacity(chosen, 4, 1.0).tolist() == [[True, True], [True, True], [False, True], [True, False]]
    assert keep_within_capacity(chosen, 4, 2.0).all()     # C = 4: nothing dropped
    assert keep_within_capacity(chosen, 4, None).all()


def test_the_balance_loss_is_one_when_even_and_e_when_all_go_to_one_expert():
    """E·Σ f_i·P_i: uniform probabilities and an even split give E·E·(1/E)(1/E) = 1; every token to expert 0 with
    probability 1 gives E·1·1 = E."""
    E, T = 4, 8
    even = load_balance_loss(torch.full((T, E), 1 / E), torch.arange(T).remainder(E).unsqueeze(1), E)
    assert even.item() == pytest.approx(1.0)
    one = torch.zeros(T, E)
    one[:, 0] = 1
    assert load_balance_loss(one, torch.zeros(T, 1, dtype=torch.long), E).item() == pytest.approx(E)


def test_the_bias_moves_tokens_away_from_busy_experts_without_touching_the_gates():
    router = Router(D, 4, k=1)
    nudge_bias(router, torch.tensor([10, 2, 2, 2]), rate=0.1)
    assert router.bias.tolist() == pytest.approx([-0.1, 0.1, 0.1, 0.1])   # mean 4: expert 0 above it
    x = torch.randn(5, D)
    probs, chosen, gates = router(x)
    assert torch.equal(gates, probs.gather(1, chosen))                      # gates from the probabilities


def test_a_dropped_token_gets_nothing_and_a_kept_one_its_gated_experts():
    """The one-process layer against its definition, token by token: Σ over kept assignments of gate × expert."""
    moe = MoE(D, FF, 4, k=2, capacity_factor=0.5, seed=3)
    x = torch.randn(9, D, generator=torch.Generator().manual_seed(1))
    out, _ = moe(x)
    probs, chosen, gates = moe.router(x)
    keep = keep_within_capacity(chosen, 4, 0.5)
    assert not keep.all(), "the case should drop something"
    w1, w2 = moe.experts.w1, moe.experts.w2
    for t in range(9):
        want = sum((gates[t, j] * (torch.nn.functional.gelu(x[t] @ w1[chosen[t, j]]) @ w2[chosen[t, j]])
                    for j in range(2) if keep[t, j]), torch.zeros(D))
        assert torch.allclose(out[t], want, atol=1e-6), t


def _tokens(rank, n_tokens):
    return torch.randn(n_tokens, D, generator=torch.Generator().manual_seed(100 + rank))


def _moe(n_experts, k, factor, skew):
    moe = MoE(D, FF, n_experts, k=k, capacity_factor=factor, seed=7)
    moe.router.bias[0] = 10.0 if skew else 0.0  # skew: every token's first choice is expert 0 (rank 0's)
    return moe


def _ep_rank(rank, world_size, n_experts, k, factor, sizes, skew=False):
    moe = _moe(n_experts, k, factor, skew)
    layer = ExpertParallelMoE(moe, group=None)
    x = _tokens(rank, sizes[rank]).requires_grad_()
    with coursekit.comm.record() as traffic:
        out, aux = layer(x)
        ((out * out).sum() + aux).backward()
    return {"out": out.detach(), "x_grad": x.grad, "router_grad": layer.router.score.weight.grad,
            "w1_grad": layer.experts.w1.grad, "w2_grad": layer.experts.w2.grad, "payload": traffic.total,
            "phases": sorted({t.phase for t in traffic.payload})}


def _one_process(n_experts, k, factor, sizes, skew=False):
    """The same tokens on one process, each rank's batch routed on its own (capacity is per rank's batch)."""
    moe = _moe(n_experts, k, factor, skew)
    outs, grads, sent = [], [], 0
    for rank, n in enumerate(sizes):
        x = _tokens(rank, n).requires_grad_()
        out, aux = moe(x)
        ((out * out).sum() + aux).backward()
        outs.append(out.detach())
        grads.append(x.grad)
        _, chosen, gates = moe.router(x)
        route = Routing(chosen, gates, keep_within_capacity(chosen, n_experts, factor), n_experts)
        owner = route.expert // (n_experts // len(sizes))
        sent += int((owner != rank).sum())                              # rows that leave this rank
    return moe, outs, grads, sent


CASES = [(2, 4, 1, None, False), (2, 4, 2, None, False), (4, 8, 2, None, False), (4, 4, 1, None, False),
         (2, 4, 2, 1.0, False), (4, 8, 1, 1.25, False), (4, 4, 1, None, True), (4, 8, 2, 1.0, True)]


@pytest.mark.parametrize("ep, n_experts, k, factor, skew", CASES,
                         ids=[f"ep{c[0]}-E{c[1]}-k{c[2]}-{'dropless' if c[3] is None else f'C{c[3]}'}"
                              f"{'-skewed' if c[4] else ''}" for c in CASES])
def test_experts_over_ranks_equal_one_process(ep, n_experts, k, factor, skew):
    """Each rank its own tokens (5, 8, 6, 11: uneven); outputs, the tokens' gradients, each expert's gradient (on
    its rank) and the router's (summed over ranks) equal the one-process layer's. The payload is exactly the rows
    that leave their rank × d, four times: dispatch, combine, and both again in backward. Skewed: every token's
    first choice is expert 0, so ranks 1-3 receive nothing from some ranks (empty pieces of the all-to-all) and,
    with capacity, expert 0 drops most of what it is sent."""
    sizes = [5, 8, 6, 11][:ep]
    ranks = coursekit.launch(_ep_rank, ep, n_experts, k, factor, sizes, skew, timeout=60)
    moe, outs, grads, sent = _one_process(n_experts, k, factor, sizes, skew)
    name = f"ep={ep} E={n_experts} k={k}"
    local = n_experts // ep
    for r, got in enumerate(ranks):
        assert torch.allclose(got["out"], outs[r], rtol=1e-5, atol=1e-6), f"{name}: output of rank {r} differs"
        assert torch.allclose(got["x_grad"], grads[r], rtol=1e-5, atol=1e-6), f"{name}: input gradient of rank {r}"
        for w in ("w1", "w2"):
            want = getattr(moe.experts, w).grad[r * local:(r + 1) * local]
            assert torch.allclose(got[f"{w}_grad"], want, rtol=1e-4, atol=1e-6), f"{name}: rank {r}'s {w} gradient"
    router = sum(r["router_grad"] for r in ranks)
    assert torch.allclose(router, moe.router.score.weight.grad, rtol=1e-4, atol=1e-6), f"{name}: router gradient"
    payload = sum(r["payload"] for r in ranks)
    assert payload == 4 * sent * D, f"{name}: payload {payload:,} elements, the routing says {4 * sent * D:,}"
    assert ranks[0]["phases"] == ["combine", "combine (backward)", "dispatch", "dispatch (backward)"]


def test_experts_must_divide_over_the_ranks():
    def build(rank, world_size):
        ExpertParallelMoE(MoE(D, FF, 3), group=None)
    with pytest.raises(coursekit.RankError) as caught:
        coursekit.launch(build, 2, timeout=30)
    assert "3 experts over ep = 2 ranks: use an ep that divides the expert count" in caught.value.remote_traceback


def test_capacity_matches_its_formula():
    T, k, E, factor = 11, 2, 4, 1.25
    kept = keep_within_capacity(torch.zeros(T, k, dtype=torch.long), E, factor)  # every assignment to expert 0
    assert int(kept.sum()) == math.ceil(factor * k * T / E) == 7
