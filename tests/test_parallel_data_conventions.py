"""DataParallel follows DDP's conventions, and equals torch's DistributedDataParallel step for step."""

import pytest
import torch
import torch.distributed as dist

import coursekit
from coursekit.models import TeacherData, loss_fn, tiny_mlp, tiny_transformer, LanguageData
from coursekit.parallel.data import DataParallel, shard_batch
from coursekit.measure.verify import TOLERANCES

TIMEOUT = 180.0


def _local_gradients(model_fn, x, y, world_size):
    """Every rank's own gradient of its slice (no communication), gathered: the test's reference."""
    plain = model_fn()
    loss_fn(plain(x), y).backward()
    everyone = [None] * world_size
    dist.all_gather_object(everyone, [p.grad for p in plain.parameters()])
    return [sum(grads[i] for grads in everyone) / world_size for i in range(len(everyone[0]))]


def _averaged_when_backward_returns(rank, world_size):
    x, y, _ = shard_batch(*TeacherData().batch(0, 12), rank, world_size)
    mean = _local_gradients(lambda: tiny_mlp(seed=0), x, y, world_size)
    model = DataParallel(tiny_mlp(seed=0), bucket_elements=1000)
    loss_fn(model(x), y).backward()  # no finish_gradient_synchronization() call
    after_backward = [p.grad.clone() for p in model.module.parameters()]
    model.finish_gradient_synchronization()  # a second time: nothing left to do
    again = [p.grad.clone() for p in model.module.parameters()]
    return mean, after_backward, again


def test_gradients_are_the_average_when_backward_returns():
    """Planted bug: no end-of-backward callback, so forgetting finish_gradient_synchronization() leaves sums
    (still in flight); or a second finish divides again."""
    for rank, (mean, after, again) in enumerate(coursekit.launch(_averaged_when_backward_returns, 3,
                                                                 timeout=TIMEOUT)):
        for i, (want, got) in enumerate(zip(mean, after)):
            assert torch.allclose(got, want, atol=1e-6), f"rank {rank}, parameter {i}: not the average"
        assert all(torch.equal(a, b) for a, b in zip(after, again)), f"rank {rank}: a second finish changed it"


def _set_to_none(rank, world_size):
    x, y, _ = shard_batch(*TeacherData().batch(0, 8), rank, world_size)
    model = DataParallel(tiny_mlp(seed=0), bucket_elements=1000)
    loss_fn(model(x), y).backward()
    first = [p.grad.clone() for p in model.module.parameters()]
    model.zero_grad(set_to_none=True)
    cleared = [p.grad is None for p in model.module.parameters()]
    loss_fn(model(x), y).backward()  # autograd makes fresh gradients; the hooks copy them into the buckets
    second = [p.grad.clone() for p in model.module.parameters()]
    model.zero_grad(set_to_none=False)
    zeroed = [p.grad is not None and not p.grad.any() for p in model.module.parameters()]
    return first, cleared, second, zeroed


def test_zero_grad_honours_set_to_none():
    """Planted bug: zero_grad ignores set_to_none (gradients stay allocated, or the next step is not averaged)."""
    for rank, (first, cleared, second, zeroed) in enumerate(coursekit.launch(_set_to_none, 2, timeout=TIMEOUT)):
        assert all(cleared), f"rank {rank}: zero_grad(set_to_none=True) left gradients"
        assert all(torch.equal(a, b) for a, b in zip(first, second)), f"rank {rank}: second step not averaged"
        assert all(zeroed), f"rank {rank}: zero_grad(set_to_none=False) must zero the gradients in place"


def test_bucket_cap_mb_is_megabytes_as_in_ddp():
    """Planted bug: bucket_cap_mb read as elements, or as 10**6 bytes instead of DDP's 2**20."""
    elements = [b.buffer.numel() for b in DataParallel(tiny_mlp(seed=0), bucket_elements=1088).buckets]
    in_mb = [b.buffer.numel() for b in DataParallel(tiny_mlp(seed=0), bucket_cap_mb=1088 * 4 / 2**20).buckets]
    assert elements == in_mb == [4 + 256 + 64, 4096, 64 + 1024]
    assert len(DataParallel(tiny_mlp(seed=0)).buckets) == 1  # DDP's default of 25 MB holds all 5,508 elements
    with pytest.raises(ValueError, match="bucket_cap_mb must be a positive number of megabytes"):
        DataParallel(tiny_mlp(), bucket_cap_mb=0)


def _ours_and_torchs(rank, world_size, steps, cap_mb):
    data = LanguageData(seed=0)
    ours = DataParallel(tiny_transformer(seed=0), bucket_cap_mb=cap_mb)
    theirs = torch.nn.parallel.DistributedDataParallel(tiny_transformer(seed=0), bucket_cap_mb=cap_mb)
    runs = []
    for model in (ours, theirs):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        grads = []
        for step in range(steps):
            x, y, w = shard_batch(*data.batch(step, 9), rank, world_size)
            (loss_fn(model(x), y) * w).backward()
            grads.append({n: p.grad.clone() for n, p in model.module.named_parameters()})
            optimizer.step()
            optimizer.zero_grad()
        runs.append((grads, {n: p.detach().clone() for n, p in model.module.named_parameters()}))
    return runs


@pytest.mark.parametrize("world_size", [2, 3])
def test_equal_to_torch_distributed_data_parallel(world_size):
    """Same model, batches (9 samples: uneven), bucket_cap_mb and AdamW: every gradient and weight equal to DDP's."""
    rtol, atol = TOLERANCES[torch.float32]
    for rank, ((our_grads, our_params), (their_grads, their_params)) in enumerate(
            coursekit.launch(_ours_and_torchs, world_size, 3, 0.1, timeout=TIMEOUT)):
        for step, (ours, theirs) in enumerate(zip(our_grads, their_grads)):
            assert ours.keys() == theirs.keys()
            for name in ours:
                assert torch.allclose(ours[name], theirs[name], rtol=rtol, atol=atol), (
                    f"rank {rank}, step {step}: gradient of {name} differs from DDP's "
                    f"(max diff {(ours[name] - theirs[name]).abs().max():.2e})")
        for name in our_params:
            assert torch.allclose(our_params[name], their_params[name], rtol=rtol, atol=atol), (
                f"rank {rank}: {name} after 3 steps differs from DDP's")
