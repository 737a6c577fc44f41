"""Chapter 07's experiments measure what they say they measure.

* ``imbalance``: the busiest expert over the mean (1 even, E when one expert takes all);
* ``dropped_share``: a router forced to send every token to expert 0 keeps exactly ceil(factor·k·T/E) of them in
  each block (hand-counted), and drops nothing without a capacity;
* ``routed_share`` / ``FixedRouter``: a share s of the tokens goes to rank 0's experts, spread over them, and the
  layer computes exactly the rows the share says on each rank (read from the dispatch, on real ranks);
* ``train_moe``: records the imbalance at every recorded step, and the bias nudge moves the biases.

Planted bugs, seen failing: imbalance as max/min -> "assert inf == 4.0"; ``routed_share`` sending 80% of the share
-> "rank 0 computed 6 rows, the share says 8"; ``dropped_share`` dividing all blocks' kept assignments by one
block's -> "dropped 0.75, hand count 0.875".
"""

from __future__ import annotations

import math

import pytest
import torch

import coursekit
from coursekit.experiments.expert_balance import MoERegressor, dropped_share, imbalance, train_moe
from coursekit.experiments.expert_imbalance import FixedRouter, predicted_ratio, routed_share
from coursekit.parallel.expert.core import ExpertParallelMoE, MoE, dispatch, route


def test_imbalance_is_the_busiest_over_the_mean():
    assert imbalance(torch.tensor([3, 3, 3, 3])) == 1.0
    assert imbalance(torch.tensor([8, 0, 0, 0])) == 4.0
    assert imbalance(torch.tensor([4, 2, 2, 0])) == 2.0, "[4, 2, 2, 0]: mean 2, busiest 4"


@pytest.mark.parametrize("factor, tokens, experts", [(1.0, 40, 8), (1.25, 37, 8), (2.0, 30, 4)])
def test_a_forced_router_drops_all_but_the_capacity(factor, tokens, experts):
    model = MoERegressor(n_experts=experts, capacity_factor=factor, blocks=2)
    for moe in model.moes:
        moe.router.bias[0] = 100.0                       # every token's choice: expert 0
    capacity = math.ceil(factor * tokens / experts)      # k = 1
    got = dropped_share(model, torch.randn(tokens, 32))
    assert got == pytest.approx(1 - capacity / tokens), f"dropped {got}, hand count {1 - capacity / tokens}"
    assert dropped_share(MoERegressor(n_experts=experts), torch.randn(tokens, 32)) == 0.0


def test_the_share_goes_to_rank_0s_experts_spread_over_them():
    chosen = routed_share(16, 0.75, n_experts=4, ep=2)
    assert chosen.tolist() == [0, 1] * 6 + [2, 3] * 2
    assert routed_share(10, 1.0, 4).tolist() == [0, 1] * 5
    assert routed_share(10, 0.5, 4).tolist() == [0, 1, 0, 1, 0, 2, 3, 2, 3, 2]


def _rows_computed(rank, world_size, share, tokens):
    moe = MoE(8, 16, 4, k=1)
    layer = ExpertParallelMoE(moe)
    layer.router = FixedRouter(routed_share(tokens, share, 4, world_size), 4)
    x = torch.randn(tokens, 8)
    _, _, routing = route(layer.router, x, 4, None)
    rows, per_expert, _ = dispatch(x, routing)
    out, _ = layer(x)
    return rows.shape[0], per_expert, out.shape[0]


@pytest.mark.parametrize("share", [0.5, 0.75, 1.0])
def test_each_rank_computes_the_rows_its_share_says(share):
    tokens = 8
    ranks = coursekit.launch(_rows_computed, 2, share, tokens, timeout=60)
    want = [2 * round(share * tokens), 2 * (tokens - round(share * tokens))]
    for rank, (rows, per_expert, out_rows) in enumerate(ranks):
        assert rows == want[rank], f"rank {rank} computed {rows} rows, the share says {want[rank]}"
        assert sum(per_expert) == rows and out_rows == tokens


def test_training_records_imbalance_and_nudges_the_bias():
    plain = train_moe(seed=0, steps=4, record_every=2)
    assert plain.steps == [0, 2, 4] and len(plain.imbalance) == 3 and len(plain.loss) == 4
    assert all(1.0 <= v <= 8.0 for v in plain.imbalance)
    nudged = train_moe(seed=0, steps=4, bias_rate=1e-3, record_every=2)
    assert nudged.imbalance[0] == plain.imbalance[0], "step 0 is before any training: the same model"
    assert sum(c.sum() for c in nudged.counts) == sum(c.sum() for c in plain.counts) == 2 * 4096


def test_the_prediction_adds_the_experts_time_for_the_extra_rows():
    """An even step of 1.0 s; the experts alone take 0.8 s on an even load and 1.4 s on twice it (0.2 s of weight
    gradients at any load): at imbalance 2 the busiest rank's step takes 0.6 s more, at 1.5 0.3 s more."""
    times = {0.5: [1.0, 1.0, 1.0], 1.0: [1.7, 1.9, 1.8], "experts": [0.8, 0.8, 0.8], "experts ×2": [1.4, 1.4, 1.4]}
    assert predicted_ratio(times, 2.0) == pytest.approx(1.6)
    assert predicted_ratio(times, 1.5) == pytest.approx(1.3)
    assert predicted_ratio(times, 1.0) == pytest.approx(1.0)
