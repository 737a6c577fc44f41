"""Sequence × data parallelism on a 2-D mesh: one axis splits each sequence, the other splits the batch (P9).

P9 says sequence parallelism is orthogonal to data parallelism. On ``Mesh({"dp": D, "sp": G})`` both run at
once: the ``dp`` axis cuts the global batch into D slices (chapter 02's :func:`shard_batch`), and along the
``sp`` axis the G ranks of one slice each take their part of every sequence and run **ring attention**
(Liu et al. 2023) among themselves. After backward, each rank's gradient holds its tokens' share of its
slice's loss: summed over ``sp`` (one ring all-reduce per step), then averaged over ``dp`` (another). Every
message stays on one axis:

=========  ====================================================  ================================
axis       forward and backward, per step, over all ranks         gradients, per step
=========  ====================================================  ================================
``sp``     ring attention ``(6G−4)·b·S·h`` per layer per slice,   ``2(G−1)·Ψ`` per sp group (sum)
           the logits gathered once, ``(G−1)·b·S·V`` per slice
``dp``     nothing                                               ``2(D−1)·Ψ`` per dp group (mean)
=========  ====================================================  ================================

(``b``: a slice's samples, ``Ψ``: parameters; :func:`sequence_data_traffic`.) :func:`traffic_per_axis`
splits what :func:`coursekit.comm.record` counted by the axis each message travelled along.

    >>> def run(rank, world_size):        # on Mesh({"dp": world_size // 2, "sp": 2}), built by train (or mesh=...)
    ...     return train(rank, world_size, "sequence_data", model="transformer", sp=2, count_traffic=True)
    >>> coursekit.launch(run, 4)                                    # doctest: +SKIP
"""

from __future__ import annotations

import torch

from ...mesh import coordinates_of
from ...strategy import Setup, register
from ...traffic import Traffic
from .split import RingAttentionStrategy

__all__ = ["SequenceDataParallel", "traffic_per_axis", "sequence_data_traffic"]


@register("sequence_data")
class SequenceDataParallel(RingAttentionStrategy):
    """Ring attention along ``sp``, the batch split along ``dp``: ``mesh=`` a Mesh with both, or option ``sp``."""

    options = {"collectives": "ring", "layout": "zigzag", "sp": 2}
    axes = ("dp", "sp")  # no mesh given: Mesh({"dp": world // sp, "sp": sp}), from the option sp

    def __init__(self, setup: Setup):
        super().__init__(setup)
        self.mesh, self.sp_group = setup.mesh, setup.group("sp")

    @property
    def data_rank(self) -> int:
        return self.mesh["dp"].rank

    @property
    def data_size(self) -> int:
        return self.mesh["dp"].size

    def synchronize(self) -> None:
        super().synchronize()  # summed over sp: each rank saw its own tokens of its slice
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.data_size == 1 or not params:
            return
        with self.span("comm", "all-reduce grads over dp"):
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            self.all_reduce(flat, group=self.mesh["dp"].group)
            for p, g in zip(params, flat.split([p.numel() for p in params])):
                p.grad.copy_(g.view_as(p) / self.data_size)


def traffic_per_axis(traffic: Traffic, mesh_shape: dict[str, int]) -> dict[str, int]:
    """Elements sent along each axis of a mesh ``{"dp": D, "sp": G}`` (ranks laid out as :class:`Mesh` does).

    A message whose sender and receiver differ only in their ``sp`` coordinate travelled along ``sp``;
    one that crosses both axes would be counted under ``"both"`` (there should be none).
    """
    out = {name: 0 for name in mesh_shape} | {"both": 0}
    for t in traffic.payload:
        src, dst = coordinates_of(t.src, mesh_shape), coordinates_of(t.dst, mesh_shape)
        differ = [n for n in mesh_shape if src[n] != dst[n]]
        out[differ[0] if len(differ) == 1 else "both"] += t.numel
    return out


def sequence_data_traffic(batch: int, seq_len: int, d_model: int, vocab: int, n_layers: int, params: int,
                          dp: int, sp: int) -> dict[str, int]:
    """Elements sent along each axis in one step (the formula of the table above), ``batch`` the global batch.

    Batch slices as :func:`shard_batch` cuts them (the first ``batch % dp`` one sample larger).
    """
    slices = [len(part) for part in torch.arange(batch).tensor_split(dp)]
    ring_per_sample = n_layers * (2 * (sp - 1) + (4 * sp - 2)) * seq_len * d_model if sp > 1 else 0
    gather_per_sample = (sp - 1) * seq_len * vocab
    return {"sp": sum(slices) * (ring_per_sample + gather_per_sample) + dp * 2 * (sp - 1) * params,
            "dp": sp * 2 * (dp - 1) * params, "both": 0}
