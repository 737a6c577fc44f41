"""Chapter 02's headline experiment (coursekit/experiments/data_parallel_speedup.py): the three variants train the
same model, and the emulated link holds each all-reduce for its bytes.

Planted, seen failing: each rank's loss as a mean over the whole batch instead of its half (0.995 against
1.991); the link's sleep removed (the waiting step shorter than its transfers).
"""

from __future__ import annotations

import pytest

import coursekit
from coursekit.experiments.data_parallel_speedup import DP_VARIANTS, dp_step_times

SMALL = dict(iterations=2, tokens=66, blocks=2, width=32, hidden=64)


def test_the_three_variants_train_the_same_model():
    ranks = coursekit.launch(dp_step_times, 2, **SMALL)
    losses = ranks[0]["losses"]
    assert losses == ranks[1]["losses"]
    for v in DP_VARIANTS:
        assert losses[v] == pytest.approx(losses["one process"], rel=1e-5), losses


def test_the_link_holds_each_all_reduce_for_its_bytes():
    link = 2e6  # bytes per second: the 2-block model's gradients take tens of milliseconds
    ranks = coursekit.launch(dp_step_times, 2, **SMALL, link=link)
    parameters = 2 * (32 * 64 * 2 + 64 + 32)
    transfer = parameters * 4 / link  # a 2-rank ring all-reduce puts every byte once on each rank's link
    for rank in ranks:
        assert min(rank["waiting"]) >= transfer, (rank["waiting"], transfer)


def test_it_refuses_another_world_size_in_one_sentence():
    with pytest.raises(ValueError, match="runs on 2 ranks"):
        dp_step_times(0, 3)
