"""Hierarchical all-reduce on a real 2 × 2 mesh: equal to dist.all_reduce, traffic per level exact.

Each test names the bug it was seen failing on (planted in coursekit/collectives/hierarchical.py, then restored).
"""

from __future__ import annotations

import pytest
import torch

import coursekit
from coursekit import comm, netsim
from coursekit.collectives.hierarchical import hierarchical_all_reduce, hierarchical_traffic

SIZES = (1001, 7, 4)     # uneven (1001 = 501 + 500 per node, shards of 251/250), tiny, even


def _mesh_run(rank, world_size, sizes):
    import torch.distributed as dist

    from coursekit.comm.mesh import Mesh

    mesh = Mesh({"node": 2, "local": 2})
    out = []
    for numel in sizes:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(10 * rank + numel))
        reference = x.clone()
        dist.all_reduce(reference)
        with comm.record() as traffic:
            result = hierarchical_all_reduce(x, inner=mesh["local"], outer=mesh["node"])
        out.append((result is x, x, reference, traffic))
    return out


@pytest.fixture(scope="module")
def real_runs():
    return coursekit.launch(_mesh_run, 4, SIZES)


def _lengths(numel: int, parts: int) -> list[int]:
    """The test's own split: torch.tensor_split's segment lengths."""
    return [len(piece) for piece in torch.arange(numel).tensor_split(parts)]


def _expected_per_rank(numel: int, k: int, n: int) -> dict[int, tuple[int, int]]:
    """Sent inside / across per global rank, from the ring's rule (a rank sends every segment of its
    ring but the one it ends up owning, (r+1) % size, in reduce-scatter and but (r+2) % size in
    all-gather); the shard of local rank l is segment (l+1) % k of the tensor."""
    inner = _lengths(numel, k)
    out = {}
    for node in range(n):
        for local in range(k):
            shard = inner[(local + 1) % k]
            outer = _lengths(shard, n)
            inside = 2 * numel - inner[(local + 1) % k] - inner[(local + 2) % k]
            across = 2 * shard - outer[(node + 1) % n] - outer[(node + 2) % n]
            out[node * 2 + local] = (inside, across)
    return out


def test_equals_dist_all_reduce_in_place_and_bit_identical(real_runs):
    """Planted: the outer all-reduce over the inner axis (group=inner) -> the length check refuses,
    "ring_all_reduce: rank 1 has 501 elements of torch.float32 but rank 0 has 500" (N=1001)."""
    for i, numel in enumerate(SIZES):
        for rank, runs in enumerate(real_runs):
            same_object, x, reference, _ = runs[i]
            assert same_object, "hierarchical_all_reduce must return the tensor it was given (in place)"
            assert torch.allclose(x, reference, atol=1e-5), \
                f"N={numel} rank {rank}: max |diff| {(x - reference).abs().max().item():.3g} vs dist.all_reduce"
            assert torch.equal(x, real_runs[0][i][1]), f"N={numel}: rank {rank} differs from rank 0 in its bits"


def test_traffic_per_level_is_the_formula(real_runs):
    """Per rank, inside the node 2(k−1)/k·N and across 2(n−1)/n·N/k (exactly, for uneven N).
    Planted: inner and outer axes swapped (inner=mesh["node"], outer=mesh["local"]) -> the sum is still
    right on 2 × 2, but rank 0 sends (500, 1001) instead of (1001, 501) elements (inside, across)."""
    for i, numel in enumerate(SIZES):
        traffic = comm.Traffic.merge([runs[i][3] for runs in real_runs])
        counted = {r: [0, 0] for r in range(4)}
        for t in traffic.payload:
            counted[t.src][0 if t.src // 2 == t.dst // 2 else 1] += t.numel
        want = _expected_per_rank(numel, 2, 2)
        assert {r: tuple(v) for r, v in counted.items()} == want, f"N={numel}: counted (inside, across) per rank"
        if numel % 4 == 0:   # the docstring's closed forms, k = n = 2
            assert all(v == (2 * (2 - 1) * numel // 2, 2 * (2 - 1) * numel // 4) for v in want.values())


@pytest.mark.parametrize("numel,k,n", [(1001, 2, 2), (10, 2, 2), (1001, 4, 3), (37, 3, 4), (5, 2, 3), (64, 8, 2)])
def test_hierarchical_traffic_formula(numel, k, n):
    """Planted: the shard taken as segment l instead of (l+1) % k (an off-by-one shard index) -> N=1001,
    k=n=2: rank 0 across 500 instead of 501."""
    want = {}
    inner = _lengths(numel, k)
    for node in range(n):
        for local in range(k):
            shard = inner[(local + 1) % k]
            outer = _lengths(shard, n)
            inside = 0 if k == 1 else 2 * numel - inner[(local + 1) % k] - inner[(local + 2) % k]
            across = 0 if n == 1 else 2 * shard - outer[(node + 1) % n] - outer[(node + 2) % n]
            want[node * k + local] = (inside, across)
    assert hierarchical_traffic(numel, k, n) == want


def test_stages_are_labelled_apart_in_the_order_they_run(real_runs):
    """Planted: no stage prefix (the ring's own labels) -> ('reduce-scatter', 0) of the inner and the
    outer stage merge: 3 labels instead of 4."""
    traffic = comm.Traffic.merge([runs[0][3] for runs in real_runs])
    assert [key for key, _ in traffic.steps()] == [("inner reduce-scatter", 0), ("outer reduce-scatter", 0),
                                                   ("outer all-gather", 0), ("inner all-gather", 0)]


def test_dry_run_records_what_real_ranks_record(real_runs):
    """The network model's dry run (rank lists as groups) gives the real 2 × 2 run's trace, transfer by
    transfer. Planted: the dry transport's irecv keyed by the group rank instead of the global one
    -> the length check reads no message: "rank 0 has 500 elements ... but rank 1 has 0 elements"."""
    for i, numel in enumerate(SIZES):
        real = comm.Traffic.merge([runs[i][3] for runs in real_runs])
        dry = netsim.replay._recorded("hierarchical", 4, numel, gpus_per_node=2)
        assert dry.trace() == real.trace(), f"N={numel}: dry-run trace differs from the real ranks'"
