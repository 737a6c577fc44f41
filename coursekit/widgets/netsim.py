"""Move G, the message size, the network link and the node size: the modeled all-reduce times redraw at once.

    >>> from coursekit.widgets.netsim import network_explorer
    >>> network_explorer()        # in a notebook cell: controls, one sentence, the two charts, drawn at once

The charts are :func:`coursekit.viz.netsim.draw_explorer`: the closed forms of
:mod:`coursekit.netsim` (tested equal to the model replaying recorded traces),
so any G up to 1,024 redraws in a blink. Inside a node the GPUs talk over
NVLink (``intra_bandwidth``, ``intra_latency``, fixed here); the sliders set the
network link between nodes.
"""

from __future__ import annotations

import io

import ipywidgets as widgets
import matplotlib.pyplot as plt

from ..netsim import Network
from ..viz.collectives import size_label
from ..viz.netsim import SIZES, WORLD_SIZES, draw_explorer, summary

BANDWIDTHS_GBPS = (25, 50, 100, 200, 400, 800)       # network link per GPU, each way
LATENCIES_US = (1, 2, 5, 10, 20, 50)
NODE_SIZES = (1, 2, 4, 8, 16)
NVLINK = 450e9, 2e-6                                # H100 NVLink 4: 450 GB/s each way; latency assumed


def network(bandwidth_gbps: float, latency_us: float, gpus_per_node: int) -> Network:
    """The explorer's network: ``bandwidth_gbps`` Gb/s and ``latency_us`` µs between nodes, NVLink inside."""
    return Network(bandwidth_gbps * 1e9 / 8, latency_us / 1e6, gpus_per_node=gpus_per_node,
                   intra_bandwidth=NVLINK[0], intra_latency=NVLINK[1])


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=72)
    return buffer.getvalue()


def network_explorer(nbytes: int = 4 << 20, world_size: int = 1024, bandwidth_gbps: int = 400,
                     latency_us: int = 10, gpus_per_node: int = 8) -> widgets.VBox:
    """Five sliders above one sentence and the charts; every change redraws. The default state is
    drawn immediately (no event needed), so it also shows under papermill and in a static copy."""
    def slider(description, options, value, fmt=str):
        return widgets.SelectionSlider(options=[(fmt(o), o) for o in options], value=value,
                                       description=description, continuous_update=False,
                                       style={"description_width": "9em"}, layout={"width": "30em"})

    g = slider("G (GPUs)", WORLD_SIZES, world_size)
    size = slider("message size", SIZES, nbytes, size_label)
    bandwidth = slider("link (Gb/s each way)", BANDWIDTHS_GBPS, bandwidth_gbps)
    latency = slider("latency (µs)", LATENCIES_US, latency_us)
    node = slider("GPUs per node", NODE_SIZES, gpus_per_node)
    words = widgets.HTML()
    image = widgets.Image(format="png")
    fig = plt.figure(figsize=(12, 4.4))
    plt.close(fig)  # drawn into the Image widget only, never shown twice by the inline backend

    def redraw(_change=None) -> None:
        net = network(bandwidth.value, latency.value, node.value)
        draw_explorer(size.value, g.value, net, fig=fig)
        image.value = _png(fig)
        words.value = summary(size.value, g.value, net)

    for control in (g, size, bandwidth, latency, node):
        control.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([g, size]), widgets.HBox([bandwidth, latency]), node, words, image])
