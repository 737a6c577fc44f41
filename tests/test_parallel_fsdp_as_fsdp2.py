"""``ShardedUnits`` used the way FSDP2 is (issue 23 §2 and §4): what a peer's test suite written for FSDP2 needs.

Stanford CS336's FSDP tests, run against ``ShardedUnits`` through a thin adapter outside this project, found three
gaps, each a test here:

* an optimiser built on ``model.parameters()`` (FSDP2's way) with ``zero_grad(set_to_none=True)``: the pieces
  were cleared, the segments' gradients under them were not, and the next backward added to them (the second
  step's gradients twice the first's);
* no way to keep a trainable parameter whole (CS336 leaves its norms unsharded): ``replicate=``;
* the communication thread left running when a rank exits (SIGABRT at exit in 6 of 16 runs under
  ``torch.multiprocessing.spawn``): ``close()`` joins it.

Expected values come from one process (``torch.nn.utils.clip_grad_norm_`` for clipping) and from the model's
sizes, never from the code under test.
"""

from __future__ import annotations

import time

import pytest
import torch

import coursekit
from coursekit.models import LanguageData, loss_fn, tiny_transformer
from coursekit.parallel.data import CommThread, ShardedUnits, clip_grad_norm_, shard_batch
from coursekit.train import train
from coursekit.measure.verify import compare

BATCH, STEPS = 7, 3  # 7 divides by no world size in 2..4


def one_dimensional(name, param):
    """Keep norms and biases whole, as CS336's FSDP assignment does."""
    return param.ndim == 1


def _one_process(max_norm=None):
    model = tiny_transformer(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x, y = LanguageData(seed=0).batch(step, BATCH)
        loss_fn(model(x), y).backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _over_model_parameters(rank, world_size, replicate, max_norm):
    model = ShardedUnits(tiny_transformer(seed=0), replicate=replicate)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # FSDP2's way, not shard_parameters()
    whole = {n: p.numel() for n, p in model.whole.items()}
    for step in range(STEPS):
        x, y, weight = shard_batch(*LanguageData(seed=0).batch(step, BATCH), rank, world_size)
        (loss_fn(model(x), y) * weight).backward()
        if max_norm is not None:
            clip_grad_norm_([u.shard for u in model.units], max_norm, whole=list(model.whole.values()))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    whole_after = {n: p.numel() for n, p in model.whole.items()}
    params = model.full_parameters()
    model.close()
    return params, whole, whole_after


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("replicate, max_norm", [(None, None), (one_dimensional, 0.05)])
def test_an_optimizer_over_model_parameters_trains_as_one_process(world_size, replicate, max_norm):
    """SGD with momentum over ``model.parameters()``, ``zero_grad(set_to_none=True)`` every step, 3 steps: the
    weights equal one process's. With norms and biases kept whole and clipping by the global norm (counted once).

    Planted bugs, seen failing: the segments' gradients kept when the pieces were cleared (every step after the
    first on the sum of all gradients so far: "tok_emb.weight: ... Mismatched elements: 1023 / 1024", at every
    N); the whole parameters' squares added before the all-reduce, so every rank's copy counts, and their
    gradients left out of the scaling (the clipped case fails at N = 1, 2 and 3).
    """
    want = _one_process(max_norm)
    for params, whole, whole_after in coursekit.launch(_over_model_parameters, world_size, replicate, max_norm,
                                                       timeout=240):
        for name, tensor in want.items():
            torch.testing.assert_close(params[name], tensor, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
        assert whole == whole_after, "a parameter kept whole must stay whole on every rank"
        if replicate is not None:
            assert whole and all(n.endswith(("weight", "bias")) for n in whole), whole


def _kept_whole(rank, world_size):
    result = train(rank, world_size, "zero3_units", model="transformer", steps=STEPS, global_batch=BATCH,
                   replicate=one_dimensional, count_traffic=True)
    return result["records"], result["traffic"], result["elements_all_reduced"]


@pytest.mark.parametrize("world_size", [2, 3])
def test_parameters_kept_whole_train_as_one_process_and_cost_an_all_reduce(world_size):
    """``train(..., "zero3_units", replicate=...)`` with Adam: every step equals one process; the traffic is the
    units' 3(N-1) elements per sharded element plus the ring all-reduce's 2(N-1) per whole one, exactly.

    Planted bugs, seen failing: the whole parameters' gradients not divided by N (the one-process comparison);
    the whole parameters also left in their units (the ranks' reduce-scatters no longer match: the length check
    stops them with a ValueError naming the rank).
    """
    reference = train(0, 1, "single", model="transformer", steps=STEPS, global_batch=BATCH)["records"]
    results = coursekit.launch(_kept_whole, world_size, timeout=240)
    report = compare(reference, [records for records, _, _ in results])
    assert report.ok, f"zero3_units with norms and biases whole, {world_size} ranks: {report}"
    model = tiny_transformer(seed=0)
    whole = sum(p.numel() for n, p in model.named_parameters() if p.ndim == 1)
    sharded = sum(p.numel() for p in model.parameters()) - whole  # the tied weight counts once
    traffic = coursekit.comm.Traffic.merge([t for _, t, _ in results])
    n = world_size
    assert traffic.total == STEPS * (3 * (n - 1) * sharded + 2 * (n - 1) * whole)
    assert all(reduced == STEPS * whole for _, _, reduced in results)


def test_replicate_names_that_are_not_parameters_are_refused():
    with pytest.raises(ValueError, match="not trainable parameters of the model"):
        ShardedUnits(tiny_transformer(seed=0), replicate=["blocks.0.norm1.weight", "no.such.weight"])


def test_close_waits_for_the_communication_thread():
    """``close()`` returns once the thread has finished its queued work and stopped (joined), so a rank never
    exits with it alive. Planted bug, seen failing: ``close`` only queues the stop (the thread still sleeping)."""
    thread = CommThread()
    thread.run("slow job", lambda: time.sleep(0.5))
    thread.close()
    assert not thread.thread.is_alive()
