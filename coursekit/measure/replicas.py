"""Do the ranks still agree? Two checks to run *inside* the ranks of a data-parallel run.

Data parallelism is correct only while every replica holds the same weights: the
same initial weights (a broadcast from rank 0, or the same seed everywhere), the
same averaged gradients, the same update. Break that and nothing hangs: every
rank trains happily, each its own model, and the loss just looks a little off.
:func:`check_replicas` asks every rank for its copy of each tensor and names
the first one whose copies differ, and on which ranks::

    report = check_replicas(model)              # on every rank, at the same point of the program
    print(report)       # replicas differ: first 'layers.0.weight', rank 1 differs from rank 0 by up to 0.42 ...

A NaN is the loud cousin of the same problem: one rank's bad batch makes its
gradients NaN, the all-reduce adds them to everyone's, and one step later every
rank's weights are NaN. Asked afterwards, every rank is guilty. Asked *before*
the all-reduce, :func:`nonfinite_ranks` says which ranks brought the NaN in::

    bad = nonfinite_ranks({n: p.grad for n, p in model.named_parameters()})
    if bad:                                     # the same dict on every rank: {1: 'layers.0.weight'}
        ...

Both are collectives: every rank of the group must call them, with the same
tensor names in the same order (replicas have them). Both compare bits, not
values within a tolerance: data-parallel replicas must be bit-identical (the
all-reduce gives every rank the same sum; see chapter 01 on summation order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

import torch
import torch.distributed as dist

__all__ = ["ReplicaReport", "check_replicas", "nonfinite_ranks"]


@dataclass
class ReplicaReport:
    """What :func:`check_replicas` found: the same on every rank.

    ``name`` is the first tensor whose copies differ (``None``: all agree);
    ``ranks`` the ranks whose copy differs from rank 0's; ``max_abs_diff`` and
    ``index`` (the first differing element) compare the first of them with rank 0.
    """

    checked: int
    world_size: int
    name: str | None = None
    ranks: list[int] = field(default_factory=list)
    max_abs_diff: float = 0.0
    index: tuple = ()

    @property
    def ok(self) -> bool:
        return self.name is None

    def __str__(self) -> str:
        if self.ok:
            return f"replicas agree: {self.checked} tensors bit-identical on {self.world_size} ranks"
        others = ", ".join(map(str, self.ranks))
        return (f"replicas differ: first {self.name!r}, rank{'s' if len(self.ranks) > 1 else ''} {others} "
                f"differ{'s' if len(self.ranks) == 1 else ''} from rank 0 by up to {self.max_abs_diff:.3g} "
                f"(first at {self.index})")


def _named(tensors) -> list[tuple[str, torch.Tensor]]:
    """A module's parameters, a ``{name: tensor}`` dict or ``(name, tensor)`` pairs, as a list of pairs.

    ``None`` entries (a parameter without a gradient yet) are left out, on every rank alike.
    """
    if isinstance(tensors, torch.nn.Module):
        tensors = tensors.named_parameters()
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    return [(name, t.detach()) for name, t in items if t is not None]


def check_replicas(tensors: torch.nn.Module | Mapping[str, torch.Tensor] | Iterable, group=None) -> ReplicaReport:
    """On every rank: gather each tensor's copies and name the first one that is not bit-identical everywhere.

    ``tensors``: a module (its parameters), a ``{name: tensor}`` dict or ``(name, tensor)`` pairs, in the same
    order on every rank. One ``all_gather`` per tensor: meant for the small models of a debugging session (it
    moves every rank's copy of everything), not for every step of a large run.
    """
    named = _named(tensors)
    world_size = dist.get_world_size(group)
    for name, tensor in named:
        copies = [torch.empty_like(tensor) for _ in range(world_size)]
        dist.all_gather(copies, tensor.contiguous(), group=group)
        differ = [rank for rank in range(1, world_size) if not torch.equal(copies[rank], copies[0])]
        if differ:
            diff = (copies[differ[0]].double() - copies[0].double()).abs()
            unequal = copies[differ[0]] != copies[0]  # NaN != NaN too: a NaN copy differs
            index = tuple(int(i) for i in torch.nonzero(unequal)[0]) if tensor.dim() else ()
            return ReplicaReport(len(named), world_size, name, differ, diff.nan_to_num(float("inf")).max().item(),
                                 index)
    return ReplicaReport(len(named), world_size)


def nonfinite_ranks(tensors: torch.nn.Module | Mapping[str, torch.Tensor] | Iterable, group=None) -> dict[int, str]:
    """On every rank, before the all-reduce: ``{rank: its first tensor holding a NaN or an infinity}``, else ``{}``.

    Every rank gets the same answer from one small all-reduce (one number per rank: the position, plus one, of
    its first non-finite tensor), so every rank can stop at the same step. Pass the gradients
    (``{name: p.grad ...}``): a module stands for its parameters, as in :func:`check_replicas`. Ranks are
    numbered within ``group``.
    """
    named = _named(tensors)
    world_size, me = dist.get_world_size(group), dist.get_rank(group)
    first = next((position for position, (_, t) in enumerate(named) if not torch.isfinite(t).all()), None)
    flags = torch.zeros(world_size, dtype=torch.int64)
    if first is not None:
        flags[me] = first + 1  # 0 means "all finite"
    dist.all_reduce(flags, group=group)
    return {rank: named[int(flag) - 1][0] for rank, flag in enumerate(flags.tolist()) if flag}

