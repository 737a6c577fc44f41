"""The MoE layer refuses what cannot route, in one sentence, and a rank with no tokens is fine (issue 60, item 6).

Before: ``MoE(d, ff, 4, k=5)`` failed in its forward with torch's "selected index k out of range"; ``k=0`` returned
zeros and a NaN balance loss; a capacity factor of 0 or -1 dropped every token without a word (NaN and inf failed
in the forward with "cannot convert float NaN to integer" / "... infinity to integer"); an empty slice of tokens,
shape ``(0, d)``, gave a NaN balance loss (0/0). Now ``check_routing`` refuses at construction (and in
``keep_within_capacity`` called directly), and the loss of 0 tokens is 0, with a gradient. The empty output's shape
and the dispatch of 0 rows (one process, and 2 ranks) already worked: without the fix those tests fail on the loss
alone.

Planted bugs, seen failing:
* ``1 <=`` dropped from ``1 <= k <= n_experts`` -> test_k_must_be_a_whole_number_from_one_to_e[0] and [-1]:
  "Failed: DID NOT RAISE ValueError";
* ``<= n_experts`` dropped -> ...[5] and test_the_router_refuses_k_on_its_own: "DID NOT RAISE ValueError" (the
  old "selected index k out of range" only came in the forward);
* ``isinstance(k, int)`` dropped -> ...[1.0]: "DID NOT RAISE ValueError";
* ``n_experts < 1`` dropped -> test_n_experts_must_be_a_whole_number_from_one[0] and [-2]: the regex did not
  match "k = 1 experts per token out of n_experts = 0: use a whole number with 1 <= k <= 0";
* ``isinstance(n_experts, int)`` dropped -> ...[4.0]: torch's "TypeError: empty(): argument 'size' ... must be
  tuple of ints";
* ``capacity_factor > 0`` dropped -> test_capacity_factor_must_be_finite_and_positive[0], [-1] and
  test_keep_within_capacity_called_directly_refuses_too: "DID NOT RAISE ValueError";
* ``math.isfinite`` dropped -> ...[inf]: "DID NOT RAISE ValueError" (NaN is still caught: ``nan > 0`` is False);
* the check left out of ``MoE.__init__`` -> all four capacity cases: "DID NOT RAISE ValueError" (the Router
  still checks k); out of ``Router.__init__`` -> test_the_router_refuses_k_on_its_own; out of
  ``keep_within_capacity`` -> test_keep_within_capacity_called_directly_refuses_too: "DID NOT RAISE ValueError";
* the 0-token branch of ``load_balance_loss`` dropped -> the three one-process empty tests: "assert nan == 0.0",
  and test_a_rank_with_no_tokens_dispatches_and_combines: "rank 1 (0 tokens): aux loss nan";
* that branch returning ``torch.zeros(())`` (off the graph) -> test_no_tokens_give_an_empty_output_and_a_zero_loss:
  "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn";
* ``f_i`` counted per token instead of per assignment (``/ T`` for ``/ T·k``) ->
  test_a_uniform_router_has_balance_loss_one: "assert 2.0 == 1.0 ± 1.0e-06".
"""

from __future__ import annotations

import math

import pytest
import torch

import coursekit
from coursekit.parallel.expert import ExpertParallelMoE, MoE, Router, keep_within_capacity, load_balance_loss

D, FF, E = 8, 16, 4


@pytest.mark.parametrize("k", [0, 5, -1, 1.0])
def test_k_must_be_a_whole_number_from_one_to_e(k):
    with pytest.raises(ValueError, match=rf"^k = {k!r} experts per token out of n_experts = 4: use a whole number "
                                         r"with 1 <= k <= 4$"):
        MoE(D, FF, E, k=k)


def test_the_router_refuses_k_on_its_own():
    with pytest.raises(ValueError, match=r"k = 5 experts .* 1 <= k <= 4"):
        Router(D, E, k=5)


@pytest.mark.parametrize("n_experts", [0, -2, 4.0])
def test_n_experts_must_be_a_whole_number_from_one(n_experts):
    with pytest.raises(ValueError, match=rf"^n_experts = {n_experts!r}: use a whole number of experts, 1 or more$"):
        MoE(D, FF, n_experts, k=1)


@pytest.mark.parametrize("factor", [0, -1, math.nan, math.inf], ids=["0", "-1", "nan", "inf"])
def test_capacity_factor_must_be_finite_and_positive(factor):
    with pytest.raises(ValueError, match=rf"^capacity_factor = {factor!r}: .* use a finite factor > 0 .*, or None "
                                         r"to drop nothing$"):
        MoE(D, FF, E, k=2, capacity_factor=factor)


def test_keep_within_capacity_called_directly_refuses_too():
    chosen = torch.zeros(3, 1, dtype=torch.long)
    with pytest.raises(ValueError, match=r"capacity_factor = 0: .* > 0"):
        keep_within_capacity(chosen, E, 0)
    with pytest.raises(ValueError, match=r"n_experts = 0: "):
        keep_within_capacity(chosen, 0, None)


@pytest.mark.parametrize("k, factor", [(1, None), (4, None), (2, 0.01), (2, 1.25)])
def test_what_can_route_is_allowed(k, factor):
    """k = 1 and k = E, dropless, and a tiny factor (C = ceil(0.01·2·5/4) = 1 row an expert: still > 0)."""
    out, aux = MoE(D, FF, E, k=k, capacity_factor=factor)(torch.randn(5, D))
    assert out.shape == (5, D) and math.isfinite(aux.item())


def test_a_uniform_router_has_balance_loss_one():
    """Switch's loss E·Σ f_i·P_i with every P_i = 1/E is Σ f_i = 1, whichever experts were chosen: a property of
    the definition, checked on the layer (router weights 0: softmax of equal scores)."""
    moe = MoE(D, FF, E, k=2)
    with torch.no_grad():
        moe.router.score.weight.zero_()
    _, aux = moe(torch.randn(7, D))
    assert aux.item() == pytest.approx(1.0)


@pytest.mark.parametrize("factor", [None, 1.0])
def test_no_tokens_give_an_empty_output_and_a_zero_loss(factor):
    moe = MoE(D, FF, E, k=2, capacity_factor=factor)
    x = torch.randn(0, D, requires_grad=True)
    out, aux = moe(x)
    assert out.shape == (0, D)
    assert aux.item() == 0.0
    aux.backward(retain_graph=True)                 # the loss alone is on the router's graph: backward runs
    assert torch.equal(moe.router.score.weight.grad, torch.zeros(E, D))
    out.sum().backward()
    assert load_balance_loss(torch.empty(0, E), torch.empty(0, 2, dtype=torch.long), E).item() == 0.0


def test_one_process_expert_parallel_layer_takes_no_tokens():
    out, aux = ExpertParallelMoE(MoE(D, FF, E, k=2), group=None)(torch.randn(0, D))
    assert out.shape == (0, D)
    assert aux.item() == 0.0


def _two_ranks(rank, world_size):
    layer = ExpertParallelMoE(MoE(D, FF, E, k=2, seed=5), group=None)
    x = torch.randn(6 if rank == 0 else 0, D, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out, aux = layer(x)
    ((out * out).sum() + aux).backward()
    return {"x": x.detach(), "out": out.detach(), "aux": aux.item(), "router_grad": layer.router.score.weight.grad}


def test_a_rank_with_no_tokens_dispatches_and_combines():
    """ep = 2, rank 1 has no tokens: it sends nothing, still runs its experts on what rank 0 sends, and both
    backwards run. Rank 0's output is the one-process layer's on its tokens."""
    ranks = coursekit.launch(_two_ranks, 2, timeout=60)
    assert ranks[1]["out"].shape == (0, D)
    assert ranks[1]["aux"] == 0.0, f"rank 1 (0 tokens): aux loss {ranks[1]['aux']}"
    assert torch.isfinite(ranks[1]["router_grad"]).all()
    want, _ = MoE(D, FF, E, k=2, seed=5)(ranks[0]["x"])
    assert torch.allclose(ranks[0]["out"], want.detach(), rtol=1e-5, atol=1e-6), "rank 0's output differs"
