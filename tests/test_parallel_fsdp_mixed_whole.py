"""Mixed precision with parameters kept whole (issue 41, item 1): the recipe ShardedUnits' docstring recommends.

``ShardedUnits(model, mp_policy="bf16", replicate=lambda n, p: p.ndim == 1)`` crashed on the first forward on
every rank (``self and mat2 must have the same dtype, but got Float and BFloat16``): the biases kept whole stayed
fp32 while their layer computed in 16 bits. Now a whole parameter computes in ``param_dtype`` with an fp32 master,
as the units do. The reference is the same model with nothing kept whole: every gradient is the same numbers,
summed in the same reduce dtype, whether a ring all-reduce or a reduce-scatter sums it.

Planted bugs, seen failing: the whole parameters' gradients left out of ``unscale_and_check`` (fp16: they stay
multiplied by the loss scale, 2^16, and the weights they move differ); the whole parameters not cast (the crash).
"""

from __future__ import annotations

import pytest
import torch

import coursekit
from coursekit.models import LanguageData, loss_fn, tiny_transformer
from coursekit.parallel.data import ShardedUnits, shard_batch

BATCH, STEPS = 7, 4


def one_dimensional(name, p):
    return p.ndim == 1


def _train(rank, world_size, policy, replicate):
    model = ShardedUnits(tiny_transformer(seed=0), mp_policy=policy, replicate=replicate)
    optimizer = torch.optim.Adam(model.shard_parameters(), lr=1e-3)
    stepped, whole_grads = [], []
    for step in range(STEPS):
        x, y, weight = shard_batch(*LanguageData(seed=0).batch(step, BATCH), rank, world_size)
        (loss_fn(model(x).float(), y) * weight).backward()
        ok = model.unscale_and_check()
        stepped.append(ok)
        grads = model.full_gradients()
        whole_grads.append({n: grads[n].clone() for n, p in model.module.named_parameters() if p.ndim == 1})
        if ok:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    params = model.full_parameters()
    model.close()
    return stepped, whole_grads, params


@pytest.mark.parametrize("policy", ["bf16", "fp16"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_whole_parameters_in_mixed_precision_train_as_the_sharded_ones(policy, world_size):
    kept = coursekit.launch(_train, world_size, policy, one_dimensional, timeout=240)
    sharded = coursekit.launch(_train, world_size, policy, None, timeout=240)
    for rank, ((steps, grads, params), (want_steps, want_grads, want_params)) in enumerate(zip(kept, sharded)):
        assert steps == want_steps, f"{policy}, rank {rank}: steps taken (True) and skipped {steps} vs {want_steps}"
        for step, (got, want) in enumerate(zip(grads, want_grads)):
            for name in want:
                torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7,
                                           msg=lambda m: f"{policy}, step {step}, {name}'s gradient: {m}")
        for name, tensor in want_params.items():
            assert params[name].dtype == torch.float32, f"{name}: the master must stay fp32"
            torch.testing.assert_close(params[name], tensor, rtol=1e-5, atol=1e-7,
                                       msg=lambda m: f"{policy}, {name} after {STEPS} steps: {m}")


def _evaluate(rank, world_size):
    model = ShardedUnits(tiny_transformer(seed=0), mp_policy="bf16", replicate=one_dimensional)
    with torch.no_grad():
        out = model(LanguageData(seed=0).batch(0, 2)[0])
    dtypes = {p.dtype for p in model.whole.values()}
    model.close()
    return out.shape, dtypes


def test_a_forward_without_grad_gives_the_masters_back():
    """Evaluation (no backward follows): the whole parameters are fp32 again after the forward."""
    for shape, dtypes in coursekit.launch(_evaluate, 2, timeout=120):
        assert dtypes == {torch.float32}, dtypes
