"""One row of a step's communication table, and a quantity per axis: what :mod:`.comm` and :mod:`.experts` build.

A :class:`Collective` is ``count`` runs of one collective over a group; its :attr:`~Collective.sent` is what one
GPU sends (the table in :mod:`.comm`'s docstring). :class:`PerAxis` holds bytes or seconds per axis of a layout.
Both live here, below :mod:`.comm` and :mod:`.experts`, so that each can build rows without importing the other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Collective", "PerAxis", "AXES", "OPS"]

# innermost last: the mesh is laid out pp, dp, sp, tp (torchtitan's order); ep is the inner part of dp
AXES = ("dp", "tp", "pp", "sp", "ep")
OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send")


@dataclass(frozen=True)
class Collective:
    """One row of a step: ``count`` times ``op`` of ``numel`` elements over ``group`` GPUs along ``axis``.

    ``numel`` is an even share, fractional when the tokens do not divide by the ranks (31 over 2: 15.5
    each); summed over the ranks it is exact. ``what`` says what the row carries, for a learner's table.
    ``axes``: the mesh axes the group spans when it is more than ``axis`` alone (``("sp", "dp")``: the
    gradients' one all-reduce over the flattened dp×sp group; ``("edp",)``: an expert's gradient over the
    ``dp/ep`` ranks that hold it); empty for a group along ``axis``.
    """

    axis: str
    op: str
    group: int
    numel: float
    count: int
    what: str = ""
    axes: tuple[str, ...] = ()

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"Collective.op must be one of {OPS} (got {self.op!r}).")

    @property
    def sent(self) -> float:
        """Elements one GPU sends, all ``count`` runs together (:mod:`.comm`'s table)."""
        G, N = self.group, self.numel
        each = {"all_reduce": 2 * (G - 1) * N / G, "send": N}.get(self.op, (G - 1) * N / G)
        return self.count * each


@dataclass(frozen=True)
class PerAxis:
    """A quantity per axis of the layout (bytes or seconds); ``total`` is their sum."""

    dp: float = 0.0
    tp: float = 0.0
    pp: float = 0.0
    sp: float = 0.0
    ep: float = 0.0

    @property
    def total(self) -> float:
        return self.dp + self.tp + self.pp + self.sp + self.ep
