"""Which global ranks form each tensor group and each data group, node by node (seed claim P8).

    >>> from coursekit.viz.mesh import mesh_layout, draw_mesh
    >>> plan = mesh_layout(world_size=8, tp=4, gpus_per_node=2)
    >>> plan["tp_groups"], plan["crossing"]
    ([[0, 1, 2, 3], [4, 5, 6, 7]], [0, 1])
    >>> fig = draw_mesh(world_size=8, tp=4, gpus_per_node=2)

The groups are those of ``Mesh({"dp": world_size // tp, "tp": tp})`` (the same
grid and the same rule, :mod:`coursekit.comm.mesh`; tested against a real mesh):
tensor parallelism is the innermost axis, so its ranks are neighbours. A
tensor group that spans two nodes all-reduces activations over the network
at every layer: the figure marks it in red.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle

from ..comm.mesh import groups_along


def mesh_layout(world_size: int, tp: int, gpus_per_node: int) -> dict:
    """The groups of a data × tensor mesh, and which tensor groups cross a node boundary.

    Returns ``tp_groups`` and ``dp_groups`` (global ranks), ``node`` (each rank's node: ``rank //
    gpus_per_node``) and ``crossing`` (indices into ``tp_groups`` of groups on more than one node).
    """
    if world_size < 1 or gpus_per_node < 1:
        raise ValueError(f"world_size ({world_size}) and gpus_per_node ({gpus_per_node}) must be at least 1.")
    if tp < 1 or world_size % tp:
        raise ValueError(f"the tensor-parallel degree tp={tp} must divide the {world_size} GPUs "
                         f"(the mesh is dp = {world_size} // tp by tp).")
    grid = torch.arange(world_size).view(world_size // tp, tp)
    node = [rank // gpus_per_node for rank in range(world_size)]
    tp_groups, dp_groups = groups_along(grid, 1), groups_along(grid, 0)
    crossing = [i for i, group in enumerate(tp_groups) if len({node[r] for r in group}) > 1]
    return {"tp_groups": tp_groups, "dp_groups": dp_groups, "node": node, "crossing": crossing}


def describe(world_size: int, tp: int, gpus_per_node: int) -> str:
    """One sentence: the mesh, and whether every tensor group stays inside a node."""
    plan = mesh_layout(world_size, tp, gpus_per_node)
    nodes = max(plan["node"]) + 1
    head = (f"dp = {world_size // tp} × tp = {tp} on {world_size} GPUs ({nodes} node{'s' if nodes > 1 else ''} "
            f"of {gpus_per_node}): ")
    if not plan["crossing"]:
        return head + "every tensor group is inside one node."
    return (head + f"{len(plan['crossing'])} of {len(plan['tp_groups'])} tensor groups cross a node boundary "
            f"(their per-layer all-reduces go over the network); use tp ≤ {gpus_per_node} dividing {gpus_per_node}.")


def draw_mesh(world_size: int, tp: int, gpus_per_node: int, ax=None):
    """Two panels of GPUs, one row per node: coloured by tensor group (left) and by data group (right)."""
    plan = mesh_layout(world_size, tp, gpus_per_node)
    if ax is None:
        nodes = max(plan["node"]) + 1
        fig, ax = plt.subplots(1, 2, figsize=(9, 0.6 + 0.55 * nodes), squeeze=True)
    else:
        fig = ax[0].figure
    # red is kept for a tensor group that crosses a node, so no group is filled with it (tab10's fourth colour)
    palette = [plt.get_cmap("tab10")(i) for i in range(10) if i != 3]
    for panel, (key, title) in zip(ax, (("tp_groups", "tensor groups (tp)"), ("dp_groups", "data groups (dp)"))):
        for g, group in enumerate(plan[key]):
            bad = key == "tp_groups" and g in plan["crossing"]
            for rank in group:
                column, row = rank % gpus_per_node, plan["node"][rank]
                panel.add_patch(Rectangle((column, -row - 1), 0.9, 0.9, facecolor=palette[g % len(palette)],
                                          edgecolor="red" if bad else "white", linewidth=3 if bad else 0.5,
                                          hatch="//" if bad else None,
                                          label=f"{key[:2]} group {g}"))
                panel.text(column + 0.45, -row - 0.55, str(rank), ha="center", va="center", fontsize=8)
        panel.set_xlim(-0.1, gpus_per_node)
        panel.set_ylim(-(max(plan["node"]) + 1) - 0.1, 0.1)
        panel.set_yticks([-n - 0.55 for n in range(max(plan["node"]) + 1)])
        panel.set_yticklabels([f"node {n}" for n in range(max(plan["node"]) + 1)], fontsize=8)
        panel.set_xticks([])
        panel.set_title(title, fontsize=9)
        panel.set_aspect("equal")
        for side in panel.spines.values():
            side.set_visible(False)
    crossing = len(plan["crossing"])
    fig.suptitle(f"dp = {world_size // tp} × tp = {tp}, {gpus_per_node} GPUs per node: " +
                 (f"{crossing} of {len(plan['tp_groups'])} tensor groups cross a node boundary (red)" if crossing
                  else "every tensor group inside one node"), fontsize=9, color="red" if crossing else "black")
    fig.tight_layout()
    return fig
