"""The data x tensor mesh figure: the groups of a real Mesh, tensor groups that leave a node flagged."""

import matplotlib
import pytest

matplotlib.use("agg")

import coursekit
from coursekit.comm.mesh import Mesh
from coursekit.viz.mesh import describe, draw_mesh, mesh_layout
from coursekit.widgets.mesh import mesh_explorer


def _real_groups(rank, world_size):
    return {tp: (Mesh({"dp": world_size // tp, "tp": tp}).all_groups("tp"),
                 Mesh({"dp": world_size // tp, "tp": tp}).all_groups("dp")) for tp in (1, 2, 4)}


def test_the_drawn_groups_are_those_of_a_real_mesh():
    """Planted bug, seen failing here: the grid laid out tp-major (tp = outer axis: tensor groups [0, 2], [1, 3])."""
    real = coursekit.launch(_real_groups, 4, timeout=120)[0]
    for tp, (tp_groups, dp_groups) in real.items():
        plan = mesh_layout(4, tp, gpus_per_node=2)
        assert plan["tp_groups"] == tp_groups and plan["dp_groups"] == dp_groups, f"tp={tp}: {plan} vs {real[tp]}"


def test_tensor_groups_crossing_a_node_are_flagged_and_drawn_red():
    """12 GPUs, 4 per node, tp = 3: [3, 4, 5] and [6, 7, 8] span two nodes. Planted bug, seen failing here:
    a rank's node taken as rank % gpus_per_node (its slot in the node) instead of rank // gpus_per_node."""
    assert mesh_layout(12, 3, 4)["crossing"] == [1, 2]
    assert mesh_layout(8, 4, 2)["crossing"] == [0, 1]
    assert mesh_layout(8, 2, 4)["crossing"] == []
    fig = draw_mesh(12, 3, 4)
    red = [p for p in fig.axes[0].patches if p.get_edgecolor()[:3] == (1.0, 0.0, 0.0)]
    assert sorted(int(t.get_text()) for p in red for t in fig.axes[0].texts
                  if t.get_position() == (p.get_x() + 0.45, p.get_y() + 0.45)) == [3, 4, 5, 6, 7, 8]
    assert not [p for p in fig.axes[1].patches if p.get_edgecolor()[:3] == (1.0, 0.0, 0.0)]  # dp panel: none
    assert "2 of 4 tensor groups cross" in describe(12, 3, 4) and "use tp ≤ 4" in describe(12, 3, 4)
    assert describe(8, 2, 4).endswith("every tensor group is inside one node.")


@pytest.mark.parametrize("world_size, tp, gpus_per_node", [(8, 2, 4), (16, 2, 8), (12, 3, 4)])
def test_red_means_crossing_a_node_and_nothing_else(world_size, tp, gpus_per_node):
    """Chapter 05 drew group {6, 7} filled red (tab10's fourth colour) beside "every tensor group inside one node".
    Planted, seen failing: the tab10 palette with its red."""
    fig = draw_mesh(world_size, tp, gpus_per_node)
    crossing = mesh_layout(world_size, tp, gpus_per_node)["crossing"]
    for panel in fig.axes:
        for patch in panel.patches:
            r, g, b, _ = patch.get_facecolor()
            assert not (r > 0.75 and g < 0.3 and b < 0.3), f"{patch.get_label()} is filled red"
            group = int(patch.get_label().rsplit(" ", 1)[1])
            marked = patch.get_edgecolor()[:3] == (1.0, 0.0, 0.0)
            assert marked == (panel is fig.axes[0] and group in crossing), f"{patch.get_label()}: red edge {marked}"


def test_a_degree_that_does_not_divide_the_gpus_is_refused():
    with pytest.raises(ValueError, match="tp=3 must divide the 8 GPUs"):
        mesh_layout(8, 3, 4)


def test_explorer_draws_at_once_and_keeps_the_degree_when_it_still_divides(monkeypatch):
    import coursekit.widgets.mesh as explorer

    calls = []
    real = explorer.draw_mesh
    monkeypatch.setattr(explorer, "draw_mesh", lambda *a: calls.append(a) or real(*a))
    box = mesh_explorer(world_size=8, tp=2, gpus_per_node=4)
    assert calls == [(8, 2, 4)]  # drawn without waiting for an event
    gpus, degree, sentence = box.children[0].children[0], box.children[1], box.children[2]
    gpus.value = 6
    assert degree.options == (1, 2, 3, 6) and degree.value == 2 and calls[-1] == (6, 2, 4)
    degree.value = 3
    assert calls[-1] == (6, 3, 4) and "cross a node boundary" in sentence.value
