"""Where does plain data parallelism stop fitting? Sliders over model size, GPUs, ZeRO stage, precision.

    >>> from coursekit.widgets.memory import memory_explorer
    >>> memory_explorer()          # in a notebook cell: the controls and the bars, drawn at once
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from ..measure.memory import formula_bytes, max_parameters
from ..viz.memory import STAGE_LABELS, draw_memory_formula


def describe(psi: float, world_size: int, stage: int, precision: str, gpu_bytes: float) -> str:
    """One sentence: does it fit, and the largest model each stage fits in ``gpu_bytes`` per GPU."""
    need = sum(formula_bytes(psi, world_size, stage, precision).values())
    verdict = "fits" if need <= gpu_bytes else "does NOT fit"
    largest = ", ".join(f"{STAGE_LABELS[s]} {max_parameters(gpu_bytes, world_size, s, precision) / 1e9:.3g} B"
                        for s in range(4))
    return (f"{STAGE_LABELS[stage]}: {need / 1e9:.3g} GB of model state per GPU — {verdict} in "
            f"{gpu_bytes / 1e9:.0f} GB. Largest model that fits (model state only): {largest}.")


def memory_explorer(psi_billions: float = 7.5, world_size: int = 64, stage: int = 0, precision: str = "mixed",
                    gpu_gb: float = 80.0) -> widgets.VBox:
    """Controls above the bars; every change redraws. The default state is drawn immediately."""
    size = widgets.FloatLogSlider(value=psi_billions, base=10, min=-1, max=3, step=0.05,
                                  description="Ψ (billions)", continuous_update=False, readout_format=".3g")
    gpus = widgets.IntSlider(value=world_size, min=1, max=1024, description="GPUs", continuous_update=False)
    stages = widgets.Dropdown(options=[(label, s) for s, label in STAGE_LABELS.items()], value=stage,
                              description="stage")
    precisions = widgets.ToggleButtons(options=["mixed", "fp32"], value=precision, description="precision")
    memory = widgets.FloatSlider(value=gpu_gb, min=8, max=192, step=8, description="GPU GB",
                                 continuous_update=False)
    text = widgets.HTML()
    output = widgets.Output()

    def redraw(_change=None) -> None:
        psi, gpu_bytes = size.value * 1e9, memory.value * 1e9
        text.value = describe(psi, gpus.value, stages.value, precisions.value, gpu_bytes)
        with output:
            output.clear_output(wait=True)
            fig = draw_memory_formula(psi, gpus.value, precisions.value, gpu_bytes=gpu_bytes, stage=stages.value)
            display(fig)
            plt.close(fig)

    for control in (size, gpus, stages, precisions, memory):
        control.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([size, gpus]), widgets.HBox([stages, memory]), precisions, text, output])
