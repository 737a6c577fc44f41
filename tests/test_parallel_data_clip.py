"""Clipping by the global gradient norm when each rank holds only a shard of the gradients (issue 23 §2).

Expected values come from one process and ``torch.nn.utils.clip_grad_norm_`` on the whole model, never from
the code under test.

Planted bugs, seen failing:
* the square root left out (the norm is ‖g‖²) -> the one-process test;
* no all-reduce (each rank clips by its own pieces' norm) -> the sharded test at 2-4 ranks;
* the factor not capped at 1 (small gradients scaled *up* to max_norm) -> the no-clipping case;
* the norm's all-reduce issued twice -> the traffic count.
"""

from __future__ import annotations


import pytest
import torch

import coursekit
from coursekit import comm
from coursekit.models import LanguageData, loss_fn, tiny_transformer
from coursekit.parallel.data import ShardedUnits, clip_grad_norm_, shard_batch
from coursekit.train import train

BATCH = 7  # does not divide by 2, 3 or 4; neither do the units' sizes


def _one_process(max_norm: float):
    model = tiny_transformer(seed=1)
    x, y = LanguageData(seed=1).batch(0, BATCH)
    loss_fn(model(x), y).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("max_norm", [0.05, 1e6])  # clipping, and a bound so large nothing changes
def test_one_process_equals_torch(max_norm):
    want_norm, want = _one_process(max_norm)
    model = tiny_transformer(seed=1)
    x, y = LanguageData(seed=1).batch(0, BATCH)
    loss_fn(model(x), y).backward()
    norm = clip_grad_norm_(model.parameters(), max_norm, sharded=False)
    assert norm.item() == pytest.approx(want_norm, rel=1e-6)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-5, atol=1e-8, msg=n)


def _sharded(rank, world_size, max_norm, per_parameter=False):
    model = ShardedUnits(tiny_transformer(seed=1))
    x, y = LanguageData(seed=1).batch(0, BATCH)
    local_x, local_y, weight = shard_batch(x, y, rank, world_size)
    (loss_fn(model(local_x), local_y) * weight).backward()
    with comm.record() as traffic:  # the segments, or every parameter's piece of them (the same elements)
        norm = clip_grad_norm_(model.parameters() if per_parameter else model.shard_parameters(), max_norm)
    return norm.item(), model.full_gradients(), traffic.total


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("max_norm", [0.05, 1e6])
def test_sharded_gradients_clip_as_one_process_does(world_size, max_norm):
    """ZeRO-3 by units on 1-4 ranks: the norm, the clipped gradients and the traffic (one ring of one number)."""
    want_norm, want = _one_process(max_norm)
    for norm, grads, sent in coursekit.launch(_sharded, world_size, max_norm, timeout=120):
        assert norm == pytest.approx(want_norm, rel=1e-5)
        for n, g in want.items():
            torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-7, msg=n)
    assert sum(r[2] for r in coursekit.launch(_sharded, world_size, max_norm, timeout=120)) == 2 * (world_size - 1)


def _train(rank, world_size, clip):
    return train(rank, world_size, "zero3_units", model="transformer", steps=3, global_batch=BATCH, clip_norm=clip)


def test_the_strategy_option_clips_every_step():
    """``train(..., "zero3_units", clip_norm=c)``: each step's recorded gradients have norm min(‖g‖, c).

    The norm before clipping is the strategy's counter; the recorded gradients (gathered after the step) are the
    clipped ones, their norm computed here from the gathered tensors.
    """
    clip = 0.05
    for result in coursekit.launch(_train, 2, clip, timeout=120):
        assert len(result["grad_norms"]) == 3
        for norm, record in zip(result["grad_norms"], result["records"]):
            after = torch.sqrt(sum(g.double().pow(2).sum() for g in record["grads"].values())).item()
            assert after == pytest.approx(min(norm, clip), rel=1e-4), (norm, after)
            assert norm > clip  # the bound was low enough to act


@pytest.mark.parametrize("world_size", [2, 3])
def test_clipping_model_parameters_as_a_trainer_writes_it(world_size):
    """``clip_grad_norm_(model.parameters(), ...)`` after backward: each parameter's ``.grad`` is its piece of
    this rank's segment, so the pieces over the ranks are every element once and the result is one process's."""
    want_norm, want = _one_process(0.05)
    for norm, grads, _ in coursekit.launch(_sharded, world_size, 0.05, True, timeout=120):
        assert norm == pytest.approx(want_norm, rel=1e-5)
        for n, g in want.items():
            torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-7, msg=n)
