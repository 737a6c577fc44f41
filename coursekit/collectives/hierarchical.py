"""Hierarchical all-reduce: a ring inside each node, rings of shards across nodes, a ring inside again.

What large clusters do beyond one flat ring. With ``n`` nodes of ``k`` GPUs
(``Mesh({"node": n, "local": k})``, global rank = ``node·k + local``):

1. **inner reduce-scatter** (chapter 01's :func:`~coursekit.collectives.ring.ring_reduce_scatter`
   on ``inner``, the node's GPUs): local rank ``l`` ends with the node's sum
   of shard ``(l + 1) % k``, ``≈ N/k`` elements;
2. **outer all-reduce** (:func:`~coursekit.collectives.ring.ring_all_reduce` of that
   shard on ``outer``, the GPUs with the same local rank on every node): the
   shard now holds the sum over all ``G = n·k`` GPUs;
3. **inner all-gather** (:func:`~coursekit.collectives.ring.ring_all_gather` on ``inner``):
   every GPU gets every finished shard.

    >>> import torch, coursekit
    >>> from coursekit.comm.mesh import Mesh
    >>> def step(rank, world_size):
    ...     mesh = Mesh({"node": 2, "local": 2})
    ...     grad = torch.full((5,), float(rank + 1))
    ...     return hierarchical_all_reduce(grad, inner=mesh["local"], outer=mesh["node"]).tolist()
    >>> coursekit.launch(step, 4)[3]
    [10.0, 10.0, 10.0, 10.0, 10.0]

Traffic per rank (what it sends; it receives as much). The inner ring moves
``2(k−1)/k·N`` elements over the node's fast links, the outer ring
``2(n−1)/n·S`` over the network, where ``S ≈ N/k`` is the rank's shard, and
every GPU's network link carries a share. That is what a flat ring sends
over each link too when it runs as ``k`` channels, as NCCL runs it (one
ring alone would send ``2(G−1)/G·N`` through one link per node): the
hierarchical all-reduce saves steps, not network bytes. Exactly, with
``len_k(j)`` the length of segment ``j`` of
``torch.tensor_split(flat, k)``::

    inside  = 2N − len_k((l+1)%k) − len_k((l+2)%k)            (ring_traffic(N, k)[l])
    across  = 2S − len_n((j+1)%n) − len_n((j+2)%n),  S = len_k((l+1)%k),  j = node

(:func:`hierarchical_traffic`). Steps: ``2(k−1)`` inside plus ``2(n−1)``
across, against ``2(G−1)`` for one flat ring: 268 instead of 2,046 latencies
at 1,024 GPUs in nodes of 8. The modeled times and the crossover are in
:mod:`coursekit.netsim`.

The stages' transfers are labelled ``"inner reduce-scatter"``,
``"outer reduce-scatter"``, ``"outer all-gather"``, ``"inner all-gather"``
(the ring's own phase names with the stage in front): the network model runs
one ``(phase, step)`` as one step, so unprefixed labels would merge step 0 of
the inner and the outer reduce-scatter into one step and the model would
time them as if they overlapped.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .. import comm
from ..comm import state as comm_state
from .base import finish_all_reduce, start_all_reduce
from .ring import owned_segment, ring_all_gather, ring_all_reduce, ring_reduce_scatter, segment_bounds

__all__ = ["hierarchical_all_reduce", "hierarchical_traffic"]


class _Prefixed:
    """A recorder that forwards every transfer to ``traffic`` with ``"<stage> "`` before its phase."""

    __slots__ = ("traffic", "stage")

    def __init__(self, traffic, stage: str):
        self.traffic, self.stage = traffic, stage

    @property
    def transfers(self) -> "_Prefixed":
        return self

    def append(self, transfer) -> None:
        phase = transfer.phase if transfer.kind == "control" else f"{self.stage} {transfer.phase}"
        self.traffic.transfers.append(replace(transfer, phase=phase))

    def note_wait(self, phase, seconds: float) -> None:
        self.traffic.note_wait(f"{self.stage} {phase}", seconds)


class _stage:
    """``with _stage("inner"):`` labels the transfers of the block ``"inner <phase>"`` in every recorder."""

    __slots__ = ("stage", "block")

    def __init__(self, stage: str):
        self.stage = stage

    def __enter__(self) -> None:
        self.block = comm.using(recorders=tuple(_Prefixed(r, self.stage) for r in comm_state.recorders()))
        self.block.__enter__()

    def __exit__(self, *exc) -> bool:
        return self.block.__exit__(*exc)


def hierarchical_all_reduce(tensor: torch.Tensor, inner=None, outer=None) -> torch.Tensor:
    """Sum ``tensor`` over every rank of ``inner × outer``, in place, and return it (like ``dist.all_reduce``).

    ``inner``: the group of this rank's node (``mesh["local"]``); ``outer``:
    the group of the ranks with this rank's local index on every node
    (``mesh["node"]``). Either may be a :class:`~coursekit.comm.mesh.MeshAxis`, a
    process group, or (in :mod:`coursekit.netsim`'s dry run) a rank list
    group. Each rank's outer group must hold the ranks whose inner index
    equals its own, so that they carry the same shard.

        >>> hierarchical_all_reduce(grad, inner=mesh["local"], outer=mesh["node"])   # doctest: +SKIP
    """
    work, flat, _, _ = start_all_reduce(tensor, "hierarchical_all_reduce", inner)
    with _stage("inner"):
        shard = ring_reduce_scatter(flat, group=inner)    # the node's sum of segment (l + 1) % k
    with _stage("outer"):
        ring_all_reduce(shard, group=outer)               # in place on the view: the sum over all nodes
    with _stage("inner"):
        ring_all_gather(shard, flat, group=inner)         # every finished shard to every GPU of the node
    return finish_all_reduce(tensor, work)


def hierarchical_traffic(numel: int, gpus_per_node: int, nodes: int) -> dict[int, tuple[int, int]]:
    """``{global rank: (elements sent inside the node, elements sent across nodes)}`` of
    :func:`hierarchical_all_reduce` (each rank receives as much as it sends, on each level).

        >>> hierarchical_traffic(10, 2, 2)     # shards of 5: inside 2·10 − 5 − 5, across 2·5 − 3 − 2
        {0: (10, 5), 1: (10, 5), 2: (10, 5), 3: (10, 5)}
    """
    k, n = gpus_per_node, nodes

    def sent(length: int, size: int, me: int) -> int:
        if size == 1:
            return 0
        lengths = [stop - start for start, stop in segment_bounds(length, size)]
        return 2 * length - lengths[(me + 1) % size] - lengths[(me + 2) % size]

    shards = [stop - start for start, stop in segment_bounds(numel, k)]
    return {node * k + local: (sent(numel, k, local), sent(shards[owned_segment(local, k)], n, node))
            for node in range(n) for local in range(k)}
