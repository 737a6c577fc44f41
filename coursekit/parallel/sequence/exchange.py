"""The one exchange the sequence split is built from, and the lengths every rank must agree on first.

:func:`exchange` sends one tensor to every other rank and receives one from each (``coursekit.comm``
``isend``/``irecv``: counted, and the same code in the simulator); Ulysses' all-to-all, the sequence
gather (:mod:`coursekit.parallel.sequence.comm`) and the Megatron-style split
(:mod:`coursekit.parallel.sequence.tensor`) are made of it.

:func:`agree_lengths` answers "how long is the whole sequence?" when the caller did not say
(``seq_len=None``). A rank can only guess *its length × G*, which is right only when the chunks are even.
With uneven chunks (7 tokens over 4 ranks: 2, 2, 2, 1) the ranks guess different totals (8 and 4), size
their receive buffers for different blocks, and gloo aborts the receiver ("Received data size doesn't match
expected size", exit code −6). So the ranks tell each other their lengths first: one element to each peer,
recorded as *control* traffic (phase ``"sequence lengths"``), like the collectives' length check: it is
bookkeeping, not payload, so ``Traffic.total`` stays the method's formula. Passing ``seq_len=`` skips it.
"""

from __future__ import annotations

import torch

from ... import comm
from ...comm.mesh import rank_size

__all__ = ["exchange", "agree_lengths"]


def exchange(outgoing: list[torch.Tensor], incoming_shapes: list[list[int]], group, name: str) -> list[torch.Tensor]:
    """Send ``outgoing[j]`` to rank j and receive a tensor of ``incoming_shapes[j]`` from it; keep our own.

    The one exchange every collective of the sequence split is built from (here and in
    :mod:`coursekit.parallel.sequence.tensor`): ``comm`` ``isend``/``irecv`` under the phase ``name``, so
    it is counted and runs in the simulator. Returns the G tensors in rank order (ours is ``outgoing[rank]``).
    """
    rank, size = rank_size(group)
    received = [outgoing[rank] if j == rank else outgoing[rank].new_empty(incoming_shapes[j]) for j in range(size)]
    with comm.phase(name):
        works = [comm.irecv(received[j], group=group, group_src=j) for j in range(size) if j != rank]
        works += [comm.isend(outgoing[j].contiguous(), group=group, group_dst=j) for j in range(size) if j != rank]
    for work in works:
        work.wait()
    return received


def agree_lengths(local_len: int, group=None) -> list[int]:
    """Every rank's token count, in rank order, the same list on every rank of ``group`` (one exchange)."""
    rank, size = rank_size(group)
    if size == 1:
        return [local_len]
    mine = torch.tensor([local_len], dtype=torch.int64)
    with comm.control():
        return [int(t) for t in exchange([mine] * size, [[1]] * size, group, "sequence lengths")]
