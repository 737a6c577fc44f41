"""Uneven sequences without ``seq_len=`` (issue 26): the ranks agree on the lengths instead of guessing.

A rank alone can only guess the whole length as its own times G. With 7 tokens over 4 ranks (2, 2, 2, 1) the
ranks guessed 8 and 4, sized their receive buffers for different blocks, and gloo aborted a rank ("Received
data size doesn't match expected size", exit code -6) -- for ring attention (contiguous and zig-zag) and for
Ulysses. Expected values are full attention's on the whole sequence, computed here.
"""

import pytest
import torch

from coursekit import comm, launch
from coursekit.launch import RankError
from coursekit.parallel.sequence import full_attention, ring_attention, shard_sequence, ulysses_attention

B, H, D = 1, 4, 8
METHODS = {"ring contiguous": ("contiguous", lambda q, k, v: ring_attention(q, k, v, True, "contiguous")),
           "ring zigzag": ("zigzag", lambda q, k, v: ring_attention(q, k, v, True, "zigzag")),
           "ulysses": ("contiguous", lambda q, k, v: ulysses_attention(q, k, v, True))}


def _qkv(seq):
    g = torch.Generator().manual_seed(3)
    return [torch.randn(B, H, seq, D, generator=g, dtype=torch.float64) for _ in range(3)]


def _worst_error(rank, size, method, seq):
    """This rank's largest difference from full attention, forward and backward, with no seq_len given."""
    layout, attention = METHODS[method]
    q, k, v = _qkv(seq)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    full = full_attention(*leaves, True)
    full.sum().backward()
    mine = [shard_sequence(t, 2, rank, size, layout).requires_grad_() for t in (q, k, v)]
    out = attention(*mine)
    out.sum().backward()
    expected = [full.detach()] + [t.grad for t in leaves]
    got = [out.detach()] + [t.grad for t in mine]
    return max((g - shard_sequence(e, 2, rank, size, layout)).abs().max().item() for e, g in zip(expected, got))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("size,seq", [(2, 7), (4, 11)])
def test_uneven_chunks_without_seq_len_are_exact_on_real_ranks(method, size, seq):
    """Before the fix: RankError, 'rank N was killed by signal SIGABRT' (gloo's size check)."""
    errors = launch(_worst_error, size, method, seq, timeout=120)
    assert max(errors) < 1e-10, f"{method} at {size} ranks, S={seq}: max |diff| {max(errors):.3g} per rank {errors}"


def test_the_lengths_exchange_is_control_traffic_the_same_in_the_simulator():
    """One element to each peer, marked control: the payload stays the method's own formula."""
    q, k, v = _qkv(11)

    def run(rank, size):
        with comm.record() as traffic:
            out = ulysses_attention(*(shard_sequence(t, 2, rank, size) for t in (q, k, v)))
        return out, traffic

    results, _ = comm.simulate(run, 4)
    traffic = comm.Traffic.merge([t for _, t in results])
    lengths = [t for t in traffic.control if t.phase == "sequence lengths"]
    assert len(lengths) == 4 * 3 and all(t.numel == 1 for t in lengths), lengths
    assert not [t for t in traffic.payload if t.phase == "sequence lengths"]
    full = full_attention(q, k, v, True)
    for rank, (out, _) in enumerate(results):
        assert torch.allclose(out, shard_sequence(full, 2, rank, 4), atol=1e-12)


def test_shards_no_cut_gives_are_refused_on_every_rank_with_the_lengths():
    def wrong_shards(rank, size):
        q = torch.randn(B, H, 3 if rank == 0 else 1, D)  # 3 + 1 tokens: an even cut gives 2 + 2
        return ring_attention(q, q, q, True)

    with pytest.raises(RankError) as info:
        launch(wrong_shards, 2, timeout=60)
    assert info.value.rank == 0, "every rank sees the same lengths and raises: the lowest is reported"
    assert "the ranks hold [3, 1] tokens" in str(info.value) and "[2, 2]" in str(info.value), str(info.value)
