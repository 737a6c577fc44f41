"""The overlap measurement of ring attention (coursekit.experiments.ring_overlap)."""

import math

import torch

import coursekit
from coursekit import comm
from coursekit.experiments import hidden_share, transfers_alone
from coursekit.parallel.sequence import ring_attention, ring_traffic, shard_sequence


def test_the_transfers_alone_are_the_ring_forwards_transfers():
    """On 2-4 simulated ranks, the transfers timed alone send exactly what one ring forward sends: G − 1 passes
    of each rank's keys and values to its right. Planted bug, seen failing: G passes (one too many)."""
    for size in (2, 3, 4):
        seq = 8 * size
        k = v = torch.randn(1, 2, seq, 4)

        def alone(rank, world_size):
            transfers_alone(shard_sequence(k, 2, rank, world_size, "zigzag"),
                            shard_sequence(v, 2, rank, world_size, "zigzag"))

        def forward(rank, world_size):
            mine = shard_sequence(k, 2, rank, world_size, "zigzag")
            with torch.no_grad():
                ring_attention(mine, mine, mine, True, "zigzag", seq)

        sent = comm.simulate(alone, size).traffic
        assert sent.total == comm.simulate(forward, size).traffic.total == ring_traffic(2 * seq * 4, size)["forward"]
        assert all(t.dst == (t.src + 1) % size for t in sent.payload)


def test_hidden_share_reports_every_part_on_real_ranks():
    """2 ranks, S = 64: every rank reports the transfer, the forward, the wait and a share in [0, 1]; the wait is
    part of the forward."""
    for result in coursekit.launch(hidden_share, 2, 64, 2, 8, 2):
        assert set(result) == {"transfer", "forward", "waited", "hidden"}
        assert result["transfer"] > 0 and 0 <= result["waited"] <= result["forward"]
        assert 0.0 <= result["hidden"] <= 1.0 and not math.isnan(result["hidden"])
