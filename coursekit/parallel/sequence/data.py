"""Sequence × data parallelism on a 2-D mesh: one axis splits each sequence, the other splits the batch (P9).

P9 says sequence parallelism is orthogonal to data parallelism. On ``Mesh({"dp": D, "sp": G})`` both run at
once: the ``dp`` axis cuts the global batch into D slices (chapter 02's :func:`shard_batch`), and along the
``sp`` axis the G ranks of one slice each take their part of every sequence and run **ring attention**
(Liu et al. 2023) among themselves; each computes the loss on its own tokens (no logits gathered). After
backward, each rank's gradient holds its tokens' share of its slice's loss: the global gradient is their
sum over all D·G ranks, divided by D (the slices' losses are averaged). So the gradients are all-reduced
**once**, over the flattened ``dp×sp`` group (:meth:`coursekit.comm.mesh.Mesh.flatten`; torchtitan flattens
``mesh["dp", "cp"]`` the same way, Megatron-LM has its data-and-context-parallel group), not summed over
``sp`` and then averaged over ``dp``: one ring of D·G ranks sends ``2(DG−1)·Ψ`` in all, two rings
``2(G−1)·Ψ·D + 2(D−1)·Ψ·G``; at D = G = 2, 6Ψ against 8Ψ.

The ring over ``dp×sp`` visits the ranks in the mesh's order (``dp·G + sp``): G−1 of every G of its links
join two ranks of one slice (along ``sp``); the link from a slice's last rank to the next slice's first
changes both coordinates, so its messages cross **both** axes (``"dp×sp"`` below). Per step, over all ranks:

==========  ============================================  ===========================================
axis        forward and backward                          gradients (one ring of Ψ over D·G ranks)
==========  ============================================  ===========================================
``sp``      ring attention ``(6G−4)·b·S·h`` per layer      what rank ``r`` sends on the links inside a
            per slice                                      slice (``r mod G ≠ G−1``)
``dp``      nothing                                        only when G = 1: every link
``dp×sp``   nothing                                        the D links between slices (when G > 1)
==========  ============================================  ===========================================

(``b``: a slice's samples, ``Ψ``: parameters; rank ``r`` of a ring sends :func:`coursekit.collectives.ring.ring_traffic`'s
share, ``2(DG−1)/(DG)·Ψ`` when D·G divides Ψ; :func:`sequence_data_traffic`.) :func:`traffic_per_axis`
splits what :func:`coursekit.comm.record` counted by the axes each message travelled along.

    >>> def run(rank, world_size):        # on Mesh({"dp": world_size // 2, "sp": 2}), built by train (or mesh=...)
    ...     return train(rank, world_size, "sequence_data", model="transformer", sp=2, count_traffic=True)
    >>> coursekit.launch(run, 4)                                    # doctest: +SKIP
"""

from __future__ import annotations

import torch

from ...comm.mesh import coordinates_of
from ...collectives.ring import ring_traffic
from ..data import all_reduce_flat
from ...strategy import Setup, register
from ...comm.traffic import Traffic
from .split import RingAttentionStrategy

__all__ = ["SequenceDataParallel", "traffic_per_axis", "sequence_data_traffic"]


@register("sequence_data")
class SequenceDataParallel(RingAttentionStrategy):
    """Ring attention along ``sp``, the batch split along ``dp``: ``mesh=`` a Mesh with both, or option ``sp``.

    The gradients are all-reduced once over ``dp×sp`` (every rank holding a part of the global batch) and
    divided by D; the reported loss reduces each rank's summed loss and token count over the same group.
    """

    options = {"collectives": "ring", "layout": "zigzag", "kernel": "textbook", "sp": 2}
    axes = ("dp", "sp")  # no mesh given: Mesh({"dp": world // sp, "sp": sp}), from the option sp

    def __init__(self, setup: Setup):
        super().__init__(setup)
        self.mesh, self.sp_group = setup.mesh, setup.group("sp")
        self.batch_axis = self.mesh.flatten(("dp", "sp"))  # collective: every rank builds the strategy
        self.loss_group = self.batch_axis.group

    @property
    def data_rank(self) -> int:
        return self.mesh["dp"].rank

    @property
    def data_size(self) -> int:
        return self.mesh["dp"].size

    def synchronize(self) -> None:
        with self.span("comm", "all-reduce grads over dp×sp"):  # Σ over every token's share; the slices averaged
            all_reduce_flat([p.grad for p in self.model.parameters()], self.batch_axis.group, self.all_reduce,
                            divide_by=self.data_size)


def _axes_between(src: int, dst: int, mesh_shape: dict[str, int]) -> str:
    """The axes along which two global ranks differ, joined by ``×`` in the mesh's order (``"dp×sp"``)."""
    a, b = coordinates_of(src, mesh_shape), coordinates_of(dst, mesh_shape)
    return "×".join(n for n in mesh_shape if a[n] != b[n])


def traffic_per_axis(traffic: Traffic, mesh_shape: dict[str, int]) -> dict[str, int]:
    """Payload elements sent along each axis of a mesh ``{"dp": D, "sp": G}`` (ranks laid out as :class:`Mesh`).

    A message whose sender and receiver differ only in their ``sp`` coordinate travelled along ``sp``; one
    that changes several coordinates is counted under those axes joined by ``×`` (``"dp×sp"``: the
    gradients' ring over the flattened group crosses from one slice to the next). Every single axis and
    the key of all of them are always present (0 when nothing travelled there).
    """
    out = {name: 0 for name in mesh_shape} | {"×".join(mesh_shape): 0}
    for t in traffic.payload:
        key = _axes_between(t.src, t.dst, mesh_shape)
        out[key] = out.get(key, 0) + t.numel
    return out


def sequence_data_traffic(batch: int, seq_len: int, d_model: int, n_layers: int, params: int,
                          dp: int, sp: int) -> dict[str, int]:
    """Payload elements sent along ``"sp"``, ``"dp"`` and ``"dp×sp"`` in one step (the table above).

    ``batch`` is the global batch, cut into slices as :func:`shard_batch` cuts it (the first ``batch % dp``
    one sample larger). Ring attention along ``sp``; the gradients' ring all-reduce over the ``dp·sp`` ranks
    of the flattened group, rank ``r`` sending :func:`coursekit.collectives.ring.ring_traffic`'s share to rank ``r + 1``,
    counted under the axes that link crosses.
    """
    slices = [len(part) for part in torch.arange(batch).tensor_split(dp)]
    ring_per_sample = n_layers * (2 * (sp - 1) + (4 * sp - 2)) * seq_len * d_model if sp > 1 else 0
    shape = {"dp": dp, "sp": sp}
    out = {"sp": sum(slices) * ring_per_sample, "dp": 0, "dp×sp": 0}
    world = dp * sp
    if world > 1:
        for rank, sent in ring_traffic(params, world).items():
            out[_axes_between(rank, (rank + 1) % world, shape)] += sent
    return out
