"""Chapter 08's strategy calculator: pick a model and a machine, see which layouts fit and how fast they run.

    >>> from coursekit.widgets.costmodel import strategy_calculator
    >>> box = strategy_calculator()   # a notebook cell ending in strategy_calculator() shows it, drawn at once
    >>> [type(c).__name__ for c in box.children]
    ['HBox', 'HBox', 'HBox', 'HBox', 'HTML', 'Image']

The charts are :func:`coursekit.viz.costmodel.draw_calculator`: the planner's fastest layouts that fit
(:func:`coursekit.costmodel.plan`) and plain data parallelism beside them. :func:`calculator_inputs` turns
the controls' values into the cost model's arguments; the chapter's static image of the default state calls
it with the same defaults, so the image and the widget's first drawing are the same question.
"""

from __future__ import annotations

import io
from dataclasses import replace

import ipywidgets as widgets
import matplotlib.pyplot as plt

from ..costmodel import Candidate, Hardware, ModelConfig, num_params
from ..viz.costmodel import CALCULATOR_FIGSIZE, PRESETS, calculator_candidates, draw_calculator, layout_label

__all__ = ["DEFAULTS", "calculator_inputs", "summary", "strategy_calculator"]

SEQ_LENS = tuple(2 ** i for i in range(6, 16))             # 64 ... 32,768 tokens
GLOBAL_BATCHES = (8, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048)
GPU_MEMORY_GB = (16, 24, 40, 48, 80, 94, 141, 192)         # V100 16, ..., A100/H100 80, H200 141, B200 192
GPU_COUNTS = tuple(2 ** i for i in range(0, 11))           # 1 ... 1,024
NODE_SIZES = (1, 2, 4, 8, 16)
NVLINK_GBS = (50, 150, 300, 450, 900)                      # GB/s each way: ..., A100 300, H100 450, B200 900
NETWORK_GBS = (3.125, 12.5, 25, 50, 100)                   # GB/s each way: 25 Gb/s ... 800 Gb/s per GPU

DEFAULTS = {"preset": "Llama-style 7B", "seq_len": 4096, "global_batch": 64, "gpu_gb": 80, "gpus": 16,
            "gpus_per_node": 8, "nvlink_gbs": 300, "network_gbs": 25}


def calculator_inputs(preset: str = DEFAULTS["preset"], seq_len: int = DEFAULTS["seq_len"],
                      global_batch: int = DEFAULTS["global_batch"], gpu_gb: float = DEFAULTS["gpu_gb"],
                      gpus: int = DEFAULTS["gpus"], gpus_per_node: int = DEFAULTS["gpus_per_node"],
                      nvlink_gbs: float = DEFAULTS["nvlink_gbs"], network_gbs: float = DEFAULTS["network_gbs"]
                      ) -> tuple[ModelConfig, Hardware, int, int]:
    """The controls' values as ``(config, hardware, gpus, global_batch)``: the preset at ``seq_len`` tokens, an A100
    priced kernel by kernel (:meth:`Hardware.a100`: 312 TFLOP/s bf16, each matmul at its size's efficiency) with
    ``gpu_gb`` GB, NVLink inside a node, the network between."""
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r}: choose one of {sorted(PRESETS)}.")
    config = replace(PRESETS[preset], seq_len=seq_len)
    hardware = replace(Hardware.a100(), memory=gpu_gb * 1e9, gpus_per_node=gpus_per_node,
                       intra_bandwidth=nvlink_gbs * 1e9, bandwidth=network_gbs * 1e9,
                       name=f"A100 priced by shape, {gpu_gb:g} GB, {gpus_per_node} per node")
    return config, hardware, gpus, global_batch


def summary(candidates: list[Candidate], config: ModelConfig, hardware: Hardware, gpus: int) -> str:
    """One sentence: the model's size, and the fastest layout that fits with its step time (or that none fits)."""
    count = num_params(config).total
    size = f"{config.name}: {count / 1e9:.3g} B parameters" if count >= 1e9 else f"{config.name}: {count:,} parameters"
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        return f"{size}. No layout fits {gpus} GPUs of {hardware.memory / 1e9:.0f} GB: add GPUs or memory."
    best = fitting[0]
    return (f"{size}. Fastest that fits: {layout_label(best.layout).replace(chr(10), ', ')} -- "
            f"{_seconds(best.seconds)} a step, {best.memory.total / 1e9:.3g} GB on its most loaded GPU.")


def _seconds(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=72)
    return buffer.getvalue()


def strategy_calculator(**defaults) -> widgets.VBox:
    """Eight controls above one sentence and the charts; every change redraws. ``defaults`` override
    :data:`DEFAULTS`. The default state is drawn at once (no event needed), so papermill and a static copy show it."""
    values = {**DEFAULTS, **defaults}

    def slider(description, options, key, fmt=str):
        return widgets.SelectionSlider(options=[(fmt(o), o) for o in options], value=values[key],
                                       description=description, continuous_update=False,
                                       style={"description_width": "10em"}, layout={"width": "30em"})

    controls = {
        "preset": widgets.Dropdown(options=list(PRESETS), value=values["preset"], description="model",
                                   style={"description_width": "10em"}, layout={"width": "30em"}),
        "seq_len": slider("sequence (tokens)", SEQ_LENS, "seq_len"),
        "global_batch": slider("global batch", GLOBAL_BATCHES, "global_batch"),
        "gpu_gb": slider("GPU memory (GB)", GPU_MEMORY_GB, "gpu_gb"),
        "gpus": slider("GPUs", GPU_COUNTS, "gpus"),
        "gpus_per_node": slider("GPUs per node", NODE_SIZES, "gpus_per_node"),
        "nvlink_gbs": slider("NVLink (GB/s)", NVLINK_GBS, "nvlink_gbs"),
        "network_gbs": slider("network (GB/s)", NETWORK_GBS, "network_gbs", lambda g: f"{g:g}"),
    }
    words = widgets.HTML()
    image = widgets.Image(format="png")
    fig = plt.figure(figsize=CALCULATOR_FIGSIZE)
    plt.close(fig)  # drawn into the Image widget only, never shown twice by the inline backend

    def redraw(_change=None) -> None:
        config, hardware, gpus, global_batch = calculator_inputs(**{k: c.value for k, c in controls.items()})
        candidates = calculator_candidates(config, hardware, gpus, global_batch)
        draw_calculator(config, hardware, gpus, global_batch, fig=fig, candidates=candidates)
        image.value = _png(fig)
        words.value = summary(candidates, config, hardware, gpus)

    for control in controls.values():
        control.observe(redraw, names="value")
    redraw()
    c = list(controls.values())
    return widgets.VBox([widgets.HBox(c[0:2]), widgets.HBox(c[2:4]), widgets.HBox(c[4:6]), widgets.HBox(c[6:8]),
                         words, image])
