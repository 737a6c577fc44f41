"""The elements a strategy reports moving are read from the one record comm keeps, and equal the formulas.

Each data-parallel strategy's ``elements_*`` counters come from ``Strategy.record`` (the loop records every step's
forward, backward, synchronize and step into it; the collectives of :mod:`coursekit.collectives` and torch's
through :mod:`coursekit.comm` add one :class:`~coursekit.comm.traffic.Collective` each). Nothing is counted by hand,
so a collective that is skipped, doubled or sized wrongly shows in the numbers.

Planted bugs, seen failing: the counted all-gather measuring the segment instead of everything gathered (ZeRO and
FSDP's all-gathered fall to 1/N); a collective on one rank counted (nonzero at world size 1).
"""

import pytest

import coursekit
from coursekit.models import tiny_mlp
from coursekit.train import train

STEPS, BATCH = 3, 12
PSI = sum(p.numel() for p in tiny_mlp(0).parameters())  # the course MLP's trainable elements


def _counts(rank, world_size, strategy, options):
    result = train(rank, world_size, strategy, model="mlp", steps=STEPS, global_batch=BATCH, optimizer="adam",
                   lr=0.01, record=False, **options)
    return {k: v for k, v in result.items() if k.startswith("elements_") and v is not None}


# Per step, in units of Ψ: ZeRO-1 and -2 reduce-scatter the gradients once and all-gather the updated parameters
# once; ZeRO-3 (one flat shard, or FSDP's units) gathers the parameters twice, for forward and again for backward
# (the ZeRO paper's 3Ψ against DDP's 2Ψ); DDP all-reduces each gradient element once.
PER_STEP = {
    "zero1": {"elements_reduce_scattered": 1, "elements_all_gathered": 1},
    "zero2": {"elements_reduce_scattered": 1, "elements_all_gathered": 1},
    "zero3": {"elements_reduce_scattered": 1, "elements_all_gathered": 2},
    "zero3_units": {"elements_reduce_scattered": 1, "elements_all_gathered": 2, "elements_all_reduced": 0},
    "bucketed": {"elements_reduced": 1},
}


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("strategy", sorted(PER_STEP))
def test_elements_moved_equal_the_formula(strategy, world_size):
    options = {"bucket_elements": 1000} if strategy != "zero3_units" else {}  # several buckets, uneven ones
    got = coursekit.launch(_counts, world_size, strategy, options, timeout=180)
    want = {name: STEPS * times * PSI for name, times in PER_STEP[strategy].items()}
    for rank, counts in enumerate(got):
        assert counts == want, f"{strategy} on {world_size} ranks, rank {rank}: counted {counts}, formula {want}"


def test_parameters_kept_whole_are_all_reduced_once_a_step():
    """FSDP with the 1-D parameters kept whole: those are all-reduced (plain DP), the rest sharded as before."""
    whole = sum(p.numel() for p in tiny_mlp(0).parameters() if p.ndim == 1)
    got = coursekit.launch(_counts, 2, "zero3_units", {"replicate": lambda name, p: p.ndim == 1}, timeout=180)
    want = {"elements_all_reduced": STEPS * whole, "elements_reduce_scattered": STEPS * (PSI - whole),
            "elements_all_gathered": 2 * STEPS * (PSI - whole)}
    assert got[0] == want, f"counted {got[0]}, formula {want}"


@pytest.mark.parametrize("strategy", ["zero1", "zero3", "zero3_units", "bucketed"])
def test_one_rank_moves_nothing(strategy):
    """On one rank no collective is issued, so none is counted."""
    counts = coursekit.launch(_counts, 1, strategy, {}, timeout=120)[0]
    assert counts and not any(counts.values()), f"{strategy} on 1 rank counted {counts}"


def test_a_strategys_record_keeps_collectives_not_messages():
    """The loop records every step into ``Strategy.record``; a long pipeline run must not hold each message it sent.
    Planted, seen failing: the record a plain ``Traffic()`` (one transfer kept per send)."""
    import torch

    from coursekit import comm
    from coursekit.strategy import Setup, Strategy

    def step(rank, world_size):
        record = Strategy(Setup(torch.nn.Linear(2, 2), lambda params: torch.optim.SGD(params, lr=0.1))).record
        with comm.record(record):
            t = torch.ones(4)
            if rank == 0:
                comm.send(t, dst=1)
            else:
                comm.recv(t, src=0)
        return len(record.transfers)

    assert comm.simulate(step, 2).results == [0, 0]
