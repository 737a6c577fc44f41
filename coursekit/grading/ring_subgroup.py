"""Exercise 01's ring inside a process group: the tp groups of a 2 × 2 mesh, a hidden variant.

``reduce_scatter(tensor, group=None)`` and ``all_gather(segment, out, group=None)`` take a group, as the
library's collectives do. On 4 real ranks laid out as ``Mesh({"dp": 2, "tp": 2})`` each rank runs both phases
over its tp group (``[0, 1]`` or ``[2, 3]``): its ring has G = 2 ranks, numbered 0 and 1 within the group, whose
global ranks are not 0 and 1 in the second group. ``comm.isend(t, dst, group)`` takes a *global* ``dst``, as
``torch.distributed`` does; a ring that passes its group-local neighbour there (``(r + 1) % G``) works in the
whole world and in the first group only. ``group_dst=``/``group_src=`` name a rank within the group.

The simulator runs one world of ranks, so this case runs on real ranks only.
"""

from __future__ import annotations

import torch

from .. import comm
from ..collectives import owned_segment, segment_bounds
from ..comm.mesh import Mesh
from .ring_judge import ring_input
from .scoring import CheckFailed

__all__ = ["SUBGROUP", "subgroup_rank", "judge_subgroup", "subgroup_case"]

SUBGROUP = {"dp": 2, "tp": 2}
NUMEL = 9  # two segments, 5 and 4: each rank of a group owns a different one
WHERE = "4 ranks as Mesh({'dp': 2, 'tp': 2}), each ring over its tp group ([0, 1] and [2, 3]), length 9"
LOCAL_PEERS = ("comm.isend/irecv's dst/src is a global rank, as in torch.distributed: inside a group name the "
               "neighbour by its rank within the group with group_dst=/group_src= (or pass its global rank)")


def subgroup_rank(rank, world_size, reduce_scatter, all_gather):
    """Both phases over this rank's tp group: (owned segment, out after all_gather, traffic, the group's ranks)."""
    tp = Mesh(SUBGROUP)["tp"]
    x = ring_input(rank, NUMEL, torch.float32)
    with comm.record() as traffic:
        mine = reduce_scatter(x, group=tp.group)
        owned = mine.detach().clone() if isinstance(mine, torch.Tensor) else None
        all_gather(mine, x, group=tp.group)
    return owned, x, traffic, tp.ranks


def judge_subgroup(results: list) -> str | None:
    """None if every rank's ring stayed in its group and got its group's sums, else the first thing wrong."""
    for rank, (owned, out, traffic, ranks) in enumerate(results):
        full = sum(ring_input(r, NUMEL, torch.float32).double() for r in ranks)
        local = ranks.index(rank)
        start, stop = segment_bounds(NUMEL, len(ranks))[owned_segment(local, len(ranks))]
        if owned is None or not torch.equal(owned.reshape(-1).double(), full[start:stop]):
            return (f"{WHERE}: rank {rank} (rank {local} of group {ranks}): reduce_scatter did not return segment "
                    f"{owned_segment(local, len(ranks))} summed over its group's ranks {ranks}")
        if not torch.equal(out.double(), full):
            return (f"{WHERE}: rank {rank} (rank {local} of group {ranks}): after all_gather out is not the sum over "
                    f"its group's ranks {ranks}")
        strangers = [t.dst for t in traffic.payload if t.dst not in ranks]
        if strangers:
            return f"{WHERE}: rank {rank} sent to rank {strangers[0]}, outside its group {ranks}; {LOCAL_PEERS}"
    return None


def subgroup_case(ctx, submission) -> str | None:
    """The tp sub-group case, run on real ranks and judged: None when right, else what went wrong."""
    try:
        results = ctx.launch(subgroup_rank, 4, submission.reduce_scatter, submission.all_gather, case=WHERE)
    except CheckFailed as failed:  # a peer outside the group: comm's own sentence says dst/src are global
        said = str(failed)
        return said if said.startswith(WHERE) else f"{WHERE}: {said}"
    return judge_subgroup(results)
