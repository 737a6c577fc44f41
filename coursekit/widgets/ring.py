"""Step through a ring all-reduce: a slider and a Play button over every step of both phases.

    >>> from coursekit.widgets.ring import ring_explorer
    >>> ring_explorer()          # in a notebook cell

The steps come from the simulator running :func:`coursekit.collectives.ring_all_reduce`
itself (the same code real ranks run), replayed over the seed's labels a₁ … d₄.
"""

from __future__ import annotations

import io

import ipywidgets as widgets
import matplotlib.pyplot as plt

from ..collectives import ring_walkthrough
from ..viz.collectives import draw_ring_step, ring_figsize


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def ring_explorer(world_size: int = 4, max_world_size: int = 8) -> widgets.VBox:
    """GPUs (2 … ``max_world_size``), a step slider with Play, the drawing and the seed's sentences.

    The default state (before step 1) is drawn at once, without waiting for an event.
    """
    gpus = widgets.IntSlider(value=world_size, min=2, max=max_world_size, description="GPUs",
                             continuous_update=False)
    step = widgets.IntSlider(value=0, min=0, max=2 * (world_size - 1), description="step")
    play = widgets.Play(value=0, min=0, max=2 * (world_size - 1), interval=900, description="Play")
    widgets.jslink((play, "value"), (step, "value"))
    image = widgets.Image(format="png")
    words = widgets.HTML()
    fig = plt.figure()
    plt.close(fig)  # drawn into the Image widget only, never shown twice by the inline backend
    cache: dict[int, list] = {}

    def steps_for(g: int) -> list:
        if g not in cache:
            cache[g] = ring_walkthrough(g)  # the simulator: instant
        return cache[g]

    def redraw(_change=None) -> None:
        steps = steps_for(gpus.value)
        fig.set_size_inches(*ring_figsize(gpus.value))
        draw_ring_step(steps, step.value, fig=fig)
        image.value = _png(fig)
        if step.value == 0:
            words.value = "<i>Press Play or move the step slider.</i>"
        else:
            lines = steps[step.value - 1].describe()
            words.value = "<br>".join(lines[:8]) + ("<br>…" if len(lines) > 8 else "")

    def new_world(_change=None) -> None:
        last = 2 * (gpus.value - 1)
        step.value = min(step.value, last)
        play.value = min(play.value, last)
        step.max = play.max = last
        redraw()

    gpus.observe(new_world, names="value")
    step.observe(redraw, names="value")
    redraw()
    return widgets.VBox([gpus, widgets.HBox([play, step]), image, words])
