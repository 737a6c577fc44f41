"""ZeRO's default buckets: as few blocking ring calls per step as each stage's memory story allows.

Every bucket costs one ring call (reduce-scatter) and one more for the gather, and each call has a
fixed cost of its own (chapter 01's bench), so the defaults keep the number of buckets small.
"""

import coursekit
from coursekit.models import count_parameters, tiny_transformer
from coursekit.train import train


def _buckets(rank, world_size):
    return {s: train(rank, world_size, s, model="transformer", steps=1, global_batch=4, record=False)["bucket_sizes"]
            for s in ("zero1", "zero2", "zero3")}


def test_default_buckets_zero1_one_zero2_and_zero3_two_halves():
    """ZeRO-1's gradients are all complete at the end of backward, so it reduce-scatters one bucket;
    ZeRO-2/3 keep two buckets (so half the gradients are freed before backward ends), not six.

    Seen failing with the planted bug "ZeRO-1 keeps the 25,000-element buckets of stages 2-3"
    (``bucket_elements=25_000`` for every stage): "zero1 makes 6 ring reduce-scatters per step, not 1:
    [16832, 20672, 12480, 16640, 20672, 17536]".
    """
    results = coursekit.launch(_buckets, 2, timeout=240)
    psi = count_parameters(tiny_transformer())
    for rank, sizes in enumerate(results):
        assert sizes["zero1"] == [psi], (f"zero1 makes {len(sizes['zero1'])} ring reduce-scatters per step, "
                                         f"not 1: {sizes['zero1']}")
        for stage in ("zero2", "zero3"):
            assert sizes[stage] == [49_984, 54_848], f"rank {rank}, {stage}: buckets {sizes[stage]}"


def _control_messages_per_step(rank, world_size, stage):
    import torch

    from coursekit import comm
    from coursekit.models import tiny_mlp
    from coursekit.parallel.data import ZeRO

    model = ZeRO(tiny_mlp(seed=0), lambda params: torch.optim.SGD(params, lr=0.1), stage=stage, bucket_elements=2000)
    counts = []
    for step in range(3):
        with comm.record() as traffic:
            model(torch.full((4, 16), float(rank + step))).sum().backward()
            model.step()
            model.zero_grad()
        counts.append(len(traffic.control))
    return counts, len(model.buckets)


def test_zero_checks_the_ring_lengths_in_its_first_step_only():
    """The first step's ring calls check lengths (one control message each); later steps skip the check,
    since the buckets' layout is the same on every rank by construction.

    Seen failing with the planted bugs "the check is never skipped" (``_checks`` returning ``{}``:
    "ZeRO-1, rank 0: control messages per step [6, 6, 6]", three buckets, expected [6, 0, 0]) and
    "skipped from the very first call" ("... [0, 0, 0]").
    """
    for stage in (1, 2, 3):
        results = coursekit.launch(_control_messages_per_step, 2, stage, timeout=120)
        for rank, (counts, buckets) in enumerate(results):
            calls = {1: 2, 2: 2, 3: 3}[stage] * buckets  # per step and bucket: RS + all-gather; ZeRO-3 gathers twice
            assert counts == [calls, 0, 0], f"ZeRO-{stage}, rank {rank}: control messages per step {counts}"
