"""What ring attention really computes, watched from outside: the score elements of every block it attends to,
per rank and per ring step, on the simulator. Each token's value is its global position, so a block's keys say
whose block it is, and the step is ``(rank - owner) mod G`` -- nothing here asks the library's own count."""

import threading

import torch

from coursekit import comm
from coursekit.parallel.sequence import chunk_bounds, core, ring_attention, shard_sequence

_lock = threading.Lock()


def computed_per_step(world_size: int, seq_len: int, causal: bool, layout: str) -> list[list[int]]:
    """``[rank][step]``: the score elements (L_q · L_k) of the blocks rank computed at that step (textbook kernel)."""
    bounds = chunk_bounds(seq_len, world_size, layout)
    seen = [[0] * world_size for _ in range(world_size)]
    attend = core.block_attention

    def watched(q, k, v, mask=None, scale=None):
        rank, first_key = comm.get_rank(), int(k[0, 0, 0, 0])
        owner = next(r for r, chunks in enumerate(bounds) if any(a <= first_key < b for a, b in chunks))
        seen[rank][(rank - owner) % world_size] += q.shape[-2] * k.shape[-2]
        return attend(q, k, v, mask, scale)

    def run(rank, size):
        x = torch.arange(seq_len, dtype=torch.float64).view(1, 1, seq_len, 1).expand(1, 1, seq_len, 2)
        mine = shard_sequence(x, 2, rank, size, layout).contiguous()
        ring_attention(mine, mine, mine, causal, layout, seq_len)

    with _lock:
        core.block_attention = watched
        try:
            comm.simulate(run, world_size)
        finally:
            core.block_attention = attend
    return seen
