"""The device mesh: one object that owns every process group of a run.

The ranks are laid out in a grid with one named *axis* per kind of
parallelism, e.g. ``Mesh({"dp": 2, "tp": 2})`` puts 4 ranks in a 2 × 2 grid
(``torch.arange(4).view(2, 2)``, as picotron's grid does). Ranks that differ
only along one axis form that axis's group: rank 1's ``tp`` group is ``[0, 1]``
and its ``dp`` group is ``[1, 3]``. Every strategy takes these groups, by axis
name (``DataParallel(model, group=mesh["dp"])``; ``train(..., mesh=mesh)`` hands
the whole mesh in), so the data × tensor hybrid, the pipeline and the capstone
never build groups of their own.

    >>> import coursekit
    >>> def where(rank, world_size):
    ...     mesh = Mesh({"dp": 2, "tp": 2})
    ...     return mesh.coordinates(), mesh["dp"].ranks, mesh["tp"].ranks
    >>> coursekit.launch(where, 4)[1]
    ({'dp': 0, 'tp': 1}, [1, 3], [0, 1])

Names follow ``torch.distributed.device_mesh.init_device_mesh(device, shape,
mesh_dim_names=...)``: the same shape and names give the same groups (tested).
In this course an *axis* is an axis of the mesh and a *dim* a dimension of a
tensor; the two words are never mixed. No global singleton: make one mesh per
run and pass it along (``train(..., mesh=mesh)``: each strategy takes the axes it needs by name).

:func:`rank_size` answers "which rank am I in this group, of how many" for any
group, axis or none, on real ranks, in the simulator and in a plain notebook cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from . import state as comm_state
from .gloo_threads import batch_gloo_loop_threads

__all__ = ["Mesh", "MeshAxis", "as_group", "rank_size", "groups_along", "coordinates_of"]


@dataclass(frozen=True)
class MeshAxis:
    """One axis of a :class:`Mesh`, seen from this rank.

    ``group`` is the process group of the ranks that share every other
    coordinate with this one; ``rank`` is this rank's index in it (its
    coordinate along the axis), ``size`` its length, ``ranks`` the global
    ranks of the group in order. Pass it wherever a ``group=`` is taken.
    """

    name: str
    size: int
    rank: int
    ranks: list[int]
    group: Any


def groups_along(grid: torch.Tensor, axis: int) -> list[list[int]]:
    """Every group along ``axis`` of a grid of global ranks: move that axis last, then each row is one group.

        >>> groups_along(torch.arange(4).view(2, 2), 0)      # the dp groups of Mesh({"dp": 2, "tp": 2})
        [[0, 2], [1, 3]]
    """
    return grid.movedim(axis, -1).reshape(-1, grid.shape[axis]).tolist()


def coordinates_of(rank: int, axes: dict[str, int]) -> dict[str, int]:
    """Where global ``rank`` sits in a mesh of shape ``axes`` (``{name: size}``), by axis name; needs no ranks.

    The grid is ``torch.arange(world).view(sizes)`` (row-major, the last axis innermost), so this is
    ``rank`` written in the mixed radix of the sizes:

        >>> coordinates_of(3, {"dp": 2, "tp": 2})
        {'dp': 1, 'tp': 1}
    """
    coordinates = {}
    for name, size in reversed(axes.items()):
        rank, coordinates[name] = divmod(rank, size)
    return dict(reversed(coordinates.items()))


class Mesh:
    """Named axes over all ranks, with one process group per axis for this rank.

    Args:
        axes: ``{name: size}`` in order, outermost first, e.g. ``{"dp": 2, "pp": 1, "tp": 2}``.
            The sizes must multiply to the world size. The last axis is the
            innermost: its ranks are neighbours (on real machines, put tensor
            parallelism there, inside one node).

    Must be built on every rank, in the same order, after ``torch.distributed``
    is initialised (inside :func:`coursekit.launch`): creating a group is a
    collective call.
    """

    def __init__(self, axes: dict[str, int]):
        if not dist.is_initialized():
            raise RuntimeError("Mesh needs ranks: build it inside a function run by coursekit.launch(fn, n).")
        self.shape, self.axes = _validate(axes, dist.get_world_size())
        self.grid = torch.arange(dist.get_world_size()).view(self.shape)
        me = dist.get_rank()
        self._axes: dict[str, MeshAxis] = {}
        for index, name in enumerate(self.axes):
            for ranks in groups_along(self.grid, index):  # every rank creates every group, in one order
                group = dist.new_group(ranks)
                if me in ranks:
                    self._axes[name] = MeshAxis(name, len(ranks), ranks.index(me), ranks, group)
        self._flat: dict[tuple[str, ...], MeshAxis] = {}
        batch_gloo_loop_threads()  # each new gloo group has its own event-loop thread (see coursekit.comm.gloo_threads)

    def __getitem__(self, name: str) -> MeshAxis:
        if name not in self._axes:
            raise KeyError(f"this mesh has axes {list(self.axes)}, not {name!r}.")
        return self._axes[name]

    def group(self, name: str):
        """The process group along axis ``name`` that contains this rank."""
        return self[name].group

    def size(self, name: str) -> int:
        """How many ranks lie along axis ``name``."""
        return self[name].size

    def flatten(self, names) -> MeshAxis:
        """Several axes as one: the ranks that share every *other* coordinate, e.g. ``mesh.flatten(("dp", "sp"))``.

        What torchtitan writes ``mesh["dp", "sp"]._flatten()``: one group for a collective that spans both
        axes (the gradients of sequence × data parallelism, all-reduced once over all D·G ranks that hold a
        part of the global batch). The axis is named ``"dp×sp"``; a rank's index in it is its coordinates
        along the named axes read as one number, the first outermost (``dp·G + sp``), as in :attr:`grid`.
        ``names`` in the mesh's order. Building the groups is collective: every rank calls ``flatten`` with
        the same names, in the same order (the first call builds them, later ones return the same axis).

            >>> def flat(rank, world_size):
            ...     return Mesh({"dp": 2, "sp": 2, "tp": 1}).flatten(("dp", "sp")).ranks
            >>> coursekit.launch(flat, 4)[0]                          # doctest: +SKIP
            [0, 1, 2, 3]
        """
        names = (names,) if isinstance(names, str) else tuple(names)
        unknown = [n for n in names if n not in self.axes]
        if unknown or not names:
            raise KeyError(f"this mesh has axes {list(self.axes)}; flatten takes some of them, not {list(names)}.")
        order = [self.axes.index(n) for n in names]
        if order != sorted(set(order)):
            raise ValueError(f"flatten takes distinct axes in the mesh's order {list(self.axes)}, got {list(names)}.")
        if names not in self._flat:
            others = [i for i in range(len(self.axes)) if i not in order]
            size = 1
            for i in order:
                size *= self.shape[i]
            me = dist.get_rank()
            for ranks in self.grid.permute(others + order).reshape(-1, size).tolist():  # every rank, one order
                group = dist.new_group(ranks)
                if me in ranks:
                    self._flat[names] = MeshAxis("×".join(names), size, ranks.index(me), ranks, group)
            batch_gloo_loop_threads()
        return self._flat[names]

    def coordinates(self) -> dict[str, int]:
        """This rank's coordinate on each axis, by name: its rank in each axis's group (``{"dp": 0, "tp": 1}``)."""
        return {name: axis.rank for name, axis in self._axes.items()}

    def all_groups(self, name: str) -> list[list[int]]:
        """The global ranks of *every* group along axis ``name`` (this rank's and the others')."""
        if name not in self.axes:
            raise KeyError(f"this mesh has axes {list(self.axes)}, not {name!r}.")
        return groups_along(self.grid, self.axes.index(name))

    def __repr__(self) -> str:
        shape = " × ".join(f"{name}={size}" for name, size in zip(self.axes, self.shape))
        return f"Mesh({shape}, this rank at {self.coordinates()})"


def _validate(axes: dict[str, int], world_size: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    if not isinstance(axes, dict) or not axes:
        raise ValueError(f"Mesh takes a dict of axis names and sizes, e.g. Mesh({{'dp': 2, 'tp': 2}}); got {axes!r}.")
    for name, size in axes.items():
        if not isinstance(name, str) or not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"axis {name!r} has size {size!r}: each axis needs a string name and a size >= 1.")
    total = 1
    for size in axes.values():
        total *= size
    if total != world_size:
        sizes = " × ".join(map(str, axes.values()))
        raise ValueError(f"the mesh {dict(axes)} has {sizes} = {total} ranks but the world has {world_size}; "
                         f"make the sizes multiply to {world_size} (use 1 for an axis you do not split).")
    return tuple(axes.values()), tuple(axes)


def as_group(group):
    """The process group behind ``group``: a :class:`MeshAxis`, a process group, or None (the whole world)."""
    return group.group if isinstance(group, MeshAxis) else group


def rank_size(group=None) -> tuple[int, int]:
    """``(rank, size)``: this rank's index in ``group`` and the group's size, or ``(0, 1)`` when there are no ranks.

    ``group`` is a process group, a :class:`MeshAxis` or None (every rank). Asked of whatever carries this
    thread's calls: the transport set by ``comm.using`` (inside ``comm.simulate``, the simulator's ranks),
    else ``torch.distributed`` on real ranks; with neither (one process, a notebook cell) one rank of one,
    so code written for many ranks also runs, unchanged, on one.

        >>> rank_size()
        (0, 1)
    """
    group = as_group(group)
    transport = comm_state.active()
    if transport is not None:
        return transport.rank(group), transport.world_size(group)
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)
