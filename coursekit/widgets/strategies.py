"""A slider over the number of GPUs that redraws the four-strategy figure.

    >>> from coursekit.widgets.strategies import strategy_explorer
    >>> strategy_explorer()          # in a notebook cell: shows the slider and the figure
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from ..viz.strategies import draw_strategies


def strategy_explorer(n_gpus: int = 2, max_gpus: int = 8, n_layers: int = 8) -> widgets.VBox:
    """An ``IntSlider`` (number of GPUs) above the figure; the default state is drawn at once."""
    slider = widgets.IntSlider(value=n_gpus, min=1, max=max_gpus, description="GPUs", continuous_update=False)
    output = widgets.Output()

    def redraw(_change=None) -> None:
        with output:
            output.clear_output(wait=True)
            fig = draw_strategies(slider.value, n_layers=n_layers, batch=2 * max_gpus)
            display(fig)
            plt.close(fig)

    slider.observe(redraw, names="value")
    redraw()
    return widgets.VBox([slider, output])
