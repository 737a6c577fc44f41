"""Pick p, m, v and a schedule; the planned pipeline is redrawn at once (no processes start).

    >>> from coursekit.widgets.pipeline import schedule_explorer
    >>> schedule_explorer()        # in a notebook cell: controls, the numbers, the chart -- drawn at once

The chart is :func:`coursekit.viz.pipeline.draw_plan` of
:func:`coursekit.parallel.pipeline.plan`; the sentence under the controls
gives the bubble (planned and the paper's formula) and the peak activations
each rank holds. A size a schedule cannot take (ZB-H1 with m < p, say) shows
the generator's message instead of a chart.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from ..parallel.pipeline import bubble_formula, make_schedule, plan
from ..viz.pipeline import draw_plan

LABELS = {"GPipe": "gpipe", "1F1B": "1f1b", "interleaved 1F1B": "interleaved", "ZB-H1 (zero bubble)": "zb_h1"}


def describe(name: str, p: int, m: int, v: int = 1) -> str:
    """One paragraph on schedule ``name`` at p, m, v: its bubble against the formula, and memory per rank."""
    try:
        planned = plan(make_schedule(name, p, m, v))
    except ValueError as error:
        return f"Not available: {error}"
    s = planned.schedule
    formula = bubble_formula(name, p, m, s.stages_per_rank)
    peaks = ", ".join(f"rank {r}: {n}" for r, n in enumerate(planned.peak_activations))
    unit = "stage-micro-batches (1/v of a rank's layers each)" if s.stages_per_rank > 1 else "micro-batches"
    text = (f"Bubble {float(planned.bubble_fraction):.1%} of the GPU time (formula {float(formula):.1%}). "
            f"Peak activations held, in {unit}: {peaks}.")
    if s.split_backward:
        text += " Until W: " + ", ".join(f"rank {r}: {n}" for r, n in enumerate(planned.peak_in_flight)) + "."
    return text


def schedule_explorer(schedule: str = "1f1b", p: int = 4, m: int = 8, v: int = 2) -> widgets.VBox:
    """Controls above the chart; every change redraws. The default state is drawn immediately."""
    names = widgets.Dropdown(options=list(LABELS.items()), value=schedule, description="schedule")
    ranks = widgets.IntSlider(value=p, min=1, max=8, description="p (ranks)", continuous_update=False)
    micro = widgets.IntSlider(value=m, min=1, max=16, description="m (micro-b.)", continuous_update=False)
    chunks = widgets.IntSlider(value=v, min=1, max=4, description="v (stages/rank)", continuous_update=False)
    text = widgets.HTML()
    output = widgets.Output()

    def redraw(_change=None) -> None:
        chunks.disabled = names.value != "interleaved"
        v_now = chunks.value if names.value == "interleaved" else 1
        text.value = describe(names.value, ranks.value, micro.value, v_now)
        with output:
            output.clear_output(wait=True)
            if not text.value.startswith("Not available"):
                fig = draw_plan(plan(make_schedule(names.value, ranks.value, micro.value, v_now)))
                display(fig)
                plt.close(fig)

    for control in (names, ranks, micro, chunks):
        control.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([names, chunks]), widgets.HBox([ranks, micro]), text, output])
