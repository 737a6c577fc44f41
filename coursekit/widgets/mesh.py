"""Data × tensor parallelism on nodes: which ranks form each group, and which tensor groups leave a node.

    >>> from coursekit.widgets.mesh import mesh_explorer
    >>> mesh_explorer()          # in a notebook cell: the controls and the two panels, drawn at once
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from ..viz.mesh import describe, draw_mesh


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def mesh_explorer(world_size: int = 8, tp: int = 2, gpus_per_node: int = 4, max_gpus: int = 32) -> widgets.VBox:
    """Sliders for GPUs and GPUs per node, a choice of tensor degree (a divisor of the GPUs); every change redraws."""
    gpus = widgets.IntSlider(value=world_size, min=1, max=max_gpus, description="GPUs", continuous_update=False)
    per_node = widgets.IntSlider(value=gpus_per_node, min=1, max=16, description="GPUs / node",
                                 continuous_update=False)
    degree = widgets.Dropdown(options=_divisors(world_size), value=tp, description="tp degree")
    text = widgets.HTML()
    output = widgets.Output()

    def redraw(_change=None) -> None:
        text.value = describe(gpus.value, degree.value, per_node.value)
        with output:
            output.clear_output(wait=True)
            fig = draw_mesh(gpus.value, degree.value, per_node.value)
            display(fig)
            plt.close(fig)

    def new_world(_change=None) -> None:
        options = _divisors(gpus.value)
        keep = degree.value if degree.value in options else max(d for d in options if d <= degree.value)
        degree.unobserve(redraw, names="value")
        degree.options = options  # resets the value to the first option
        degree.value = keep
        degree.observe(redraw, names="value")
        redraw()

    gpus.observe(new_world, names="value")
    for control in (per_node, degree):
        control.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([gpus, per_node]), degree, text, output])
