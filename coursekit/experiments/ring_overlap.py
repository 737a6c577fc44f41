"""When ring attention's transfers hide behind its compute (Liu et al. 2023's condition), measured on real ranks.

At each ring step a rank computes its L queries against the key/value block it holds while the next block
travels. Forward, per step and per sequence: compute ``4·L²·h`` floating-point operations (``q kᵀ`` and
``p v``, h the hidden width, all heads), transfer ``2·L·h`` numbers (the keys and the values). The transfer
hides when it takes no longer than the compute:

    4·L²·h / F  ≥  2·L·h·s / B      ⇔      L  ≥  s·F / (2·B)

(F the FLOP/s of one device, B the link's bytes per second, s bytes per number): the chunk each rank holds
must be at least about F/B tokens long (s = 2, bf16) -- compute grows as L², the transfer as L.

:func:`hidden_share` measures it on real ranks: the transfers of one forward alone (the same blocks sent
to the same neighbours, nothing computed), then the forward with its compute, and how long the forward
still waited for a block after computing the one it held (the record's ``waited`` seconds of the phase
``"ring kv"``, timed by :class:`coursekit.comm.Work`). The hidden share is
``1 − waited / transfer``.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from .. import comm
from ..comm.mesh import rank_size
from ..parallel.sequence.layout import shard_sequence
from ..parallel.sequence.core import ring_attention

__all__ = ["hidden_share", "transfers_alone"]


def transfers_alone(k: torch.Tensor, v: torch.Tensor, group=None) -> float:
    """Seconds for the G − 1 passes of a key/value block to the right, with nothing computed in between."""
    rank, size = rank_size(group)
    right, left = (rank + 1) % size, (rank - 1) % size
    begin = time.perf_counter()
    for _ in range(size - 1):
        into = [torch.empty_like(k), torch.empty_like(v)]
        works = [comm.isend(k, group=group, group_dst=right), comm.irecv(into[0], group=group, group_src=left),
                 comm.isend(v, group=group, group_dst=right), comm.irecv(into[1], group=group, group_src=left)]
        for work in works:
            work.wait()
        k, v = into
    return time.perf_counter() - begin


def hidden_share(rank: int, world_size: int, seq_len: int, heads: int = 4, head_dim: int = 16, repeats: int = 5,
                 kernel: str = "fused") -> dict[str, float]:
    """One causal ring-attention forward on ``seq_len`` tokens (zig-zag), this rank's medians over ``repeats``.

    Returns seconds: ``"transfer"`` (the forward's transfers alone), ``"forward"`` (the whole forward),
    ``"waited"`` (waiting for a block after computing, inside the forward), and ``"hidden"``, the share of
    the transfer time the compute hid (``1 − waited / transfer``, at least 0). Run it on every rank.
    """
    g = torch.Generator().manual_seed(0)
    q, k, v = (shard_sequence(torch.randn(1, heads, seq_len, head_dim, generator=g), 2, rank, world_size, "zigzag")
               for _ in range(3))
    ring_attention(q, k, v, True, "zigzag", seq_len, kernel=kernel)  # warm-up
    transfer, forward, waited = [], [], []
    for _ in range(repeats):
        dist.barrier()
        transfer.append(transfers_alone(k.contiguous(), v.contiguous()))
        dist.barrier()
        begin = time.perf_counter()
        with torch.no_grad(), comm.record() as traffic:
            ring_attention(q, k, v, True, "zigzag", seq_len, kernel=kernel)
        forward.append(time.perf_counter() - begin)
        waited.append(traffic.waited.get("ring kv", 0.0))
    out = {"transfer": statistics.median(transfer), "forward": statistics.median(forward),
           "waited": statistics.median(waited)}
    out["hidden"] = max(0.0, 1.0 - out["waited"] / out["transfer"]) if out["transfer"] > 0 else float("nan")
    return out
