"""PyTorch's DDP, ZeroRedundancyOptimizer and FSDP2, run by the same loop, equal one process (and so ours)."""

import pytest

import coursekit
from coursekit.train import train
from coursekit.measure.verify import compare

from strategy_options import config_for

TIMEOUT = 300.0
TORCH = ("torch_ddp", "torch_zero1", "torch_fsdp")
OURS = {"torch_ddp": "bucketed", "torch_zero1": "zero1", "torch_fsdp": "zero3"}


def _both(rank, world_size, config):
    return [(train(rank, world_size, s, **config_for(s, config))["records"],
             train(rank, world_size, OURS[s], **config_for(OURS[s], config))["records"]) for s in TORCH]


@pytest.mark.parametrize("world_size, model", [(2, "transformer"), (3, "mlp")])
def test_pytorchs_strategies_and_ours_equal_one_process(world_size, model):
    """Tied head, frozen position embedding (transformer), a global batch of 7 that no world size divides."""
    # Adam's step is about lr wherever a gradient is tiny, so rounding differences in a tiny gradient show
    # in the weights at the scale of lr: the transformer trains at the course's 1e-3
    config = dict(model=model, steps=3, global_batch=7, optimizer="adam", lr=1e-3 if model == "transformer" else 1e-2,
                  bucket_cap_mb=0.01,
                  freeze=("pos_emb.weight",) if model == "transformer" else ())
    reference = train(0, 1, "single", **config_for("single", config))["records"]
    results = coursekit.launch(_both, world_size, config, timeout=TIMEOUT)
    for i, name in enumerate(TORCH):
        for who, j in ((name, 0), (OURS[name], 1)):
            report = compare(reference, [results[r][i][j] for r in range(world_size)])
            assert report.ok, f"{who} on {world_size} ranks ({model}): {report}"


def _held(rank, world_size):
    return {s: train(rank, world_size, s, steps=1, record=False)["memory"] for s in ("torch_zero1", "zero1")}


def test_zero_redundancy_optimizer_holds_a_shard_of_the_state_like_zero1():
    """Adam's state of ZeroRedundancyOptimizer on each rank: its parameters' share only (whole tensors)."""
    results = coursekit.launch(_held, 2, timeout=TIMEOUT)
    full = 8 * 5508  # Adam's two moments of every parameter of tiny_mlp, fp32
    for rank, held in enumerate(results):
        assert held["torch_zero1"]["optimizer"] < full, f"rank {rank} holds all of Adam's state"
    assert sum(h["torch_zero1"]["optimizer"] for h in results) >= full  # together, all of it


def _accumulated(rank, world_size, config):
    return [train(rank, world_size, s, micro_batches=3, **config)["records"] for s in TORCH]


def test_gradient_accumulation_communicates_after_the_last_micro_batch_only():
    """Planted bug: DDP's no_sync wrapped around backward only (DDP decides in forward), or around every
    micro-batch including the last: the gradients would then never be averaged."""
    config = dict(model="mlp", steps=2, global_batch=12, optimizer="sgd", lr=0.1)
    reference = train(0, 1, "single", **config)["records"]
    results = coursekit.launch(_accumulated, 2, config, timeout=TIMEOUT)
    for i, name in enumerate(TORCH):
        report = compare(reference, [results[r][i] for r in range(2)])
        assert report.ok, f"{name}, 3 micro-batches per rank: {report}"
