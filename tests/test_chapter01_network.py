"""Chapter 01's network claims, read from the committed notebook and derived here by hand.

The cluster: 1,000 or 1,024 GPUs in nodes of k = 8, 50 GB/s and 10 µs between nodes, 450 GB/s and 2 µs inside.
The flat ring runs 8 channels (NCCL's), so a step's busiest side is a network link carrying one segment of
N/(8·G) elements; the hierarchical all-reduce runs 2(k−1) NVLink steps of ⌈N/k⌉ and 2(n−1) network steps of
N/(k·n). Planted, seen failing: the notebook as committed before channels (its ring 0.579 s, "4.6x faster");
the takeaways saying "1.4× faster" and "4.3 GiB".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "01_gradient_sync.ipynb"
IB, A_IB, NVLINK, A_IN, K = 50e9, 10e-6, 450e9, 2e-6, 8


def _cells() -> list[tuple[str, str]]:
    """(kind, text) per cell: a markdown cell's source, a code cell's printed output."""
    out = []
    for cell in json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            out.append(("markdown", "".join(cell["source"])))
        else:
            out.append(("code", "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))))
    return out


def _printed(marker: str) -> str:
    return next(text for kind, text in _cells() if kind == "code" and marker in text)


def test_interview_ring_and_hierarchical_times_are_the_hand_derived_ones():
    """14 GB of bf16 on 1,000 GPUs: N = 7·10⁹, s = N/8,000 = 875,000 elements. Ring: 1,998 steps of
    10 µs + 1.75 MB / 50 GB/s = 45 µs -> 0.090 s. One ring: 1,998 steps of 10 µs + 14 MB / 50 GB/s -> 0.579 s.
    Hierarchical: 14·(2 µs + 1.75 GB/450 GB/s) + 248·(10 µs + 14 MB/50 GB/s) -> 0.126 s: 1.4× the ring's
    time, and the takeaway says so."""
    N, G, b = 7 * 10**9, 1000, 2
    n = G // K
    ring = 2 * (G - 1) * (A_IB + N / (K * G) * b / IB)
    one_ring = 2 * (G - 1) * (A_IB + N / G * b / IB)
    hier = 2 * (K - 1) * (A_IN + N / K * b / NVLINK) + 2 * (n - 1) * (A_IB + N / (K * n) * b / IB)
    text = _printed("parameter server")
    assert "1998 steps, 8 channels" in text and f"-> {ring:.3f} s" in text, text
    assert f"one network link per node: {one_ring:.3f} s" in text, text
    assert "262 steps" in text and f"-> {hier:.3f} s" in text, text
    assert f"the hierarchical all-reduce {hier / ring:.1f}× slower than the ring" in text, text
    takeaway = next(t for kind, t in _cells() if kind == "markdown" and "parameter server needs minutes" in t)
    assert f"{hier / ring:.1f}× slower" in takeaway and "262 steps against 1,998" in takeaway, takeaway


def test_crossover_cell_shows_latency_winning_small_and_channels_winning_large():
    """1,024 GPUs, 4 MiB of float32 (N = 2²⁰): ring 2,046·(10 µs + 128·4 B / 50 GB/s) = 20.48 ms, hierarchical
    14·(2 µs + 131,072·4 B / 450 GB/s) + 254·(10 µs + 1,024·4 B / 50 GB/s) = 2.61 ms. The crossover, ring from
    the size where 2,046·α + 2(G−1)/G·N·b/(8B) meets the hierarchical line, is a few GiB: the cell prints one
    and the takeaway quotes it."""
    G, N, b = 1024, 2**20, 4
    ring = 2 * (G - 1) * (A_IB + N / (K * G) * b / IB)
    hier = 2 * (K - 1) * (A_IN + N / K * b / NVLINK) + 2 * (G // K - 1) * (A_IB + N / G * b / IB)
    text = _printed("ring beats hierarchical")
    assert f"at 4 MiB: hierarchical {hier * 1e3:.2f} ms, ring {ring * 1e3:.2f} ms" in text, text
    assert "flat ring: 2,046 steps" in text and "hierarchical: 268 steps" in text, text
    # solve ring = hierarchical: both are a + c·N above a few elements
    ring_a, ring_c = 2 * (G - 1) * A_IB, 2 * (G - 1) * b / (G * K * IB)
    hier_a = 2 * (K - 1) * A_IN + 2 * (G // K - 1) * A_IB
    hier_c = 2 * (K - 1) * b / (K * NVLINK) + 2 * (G // K - 1) * b / (G * IB)
    gib = (ring_a - hier_a) / (hier_c - ring_c) * b / 2**30
    printed = float(re.search(r"ring beats hierarchical from ([\d.]+) GiB", text).group(1))
    assert abs(printed - gib) < 0.01, (printed, gib)
    takeaway = next(t for kind, t in _cells() if kind == "markdown" and "wins by latency" in t)
    assert f"From {printed:.2f} GiB on, the flat ring is the faster" in takeaway, takeaway
