"""The network explorer (chapter 01): its default state drawn at construction, every slider redraws.

Each test names the bug it was seen failing on (planted in coursekit/widgets/netsim.py, then restored).
"""

import matplotlib

matplotlib.use("agg")

import coursekit.widgets.netsim as explorer  # noqa: E402
from coursekit.netsim import closed_form_time  # noqa: E402


def _spy(monkeypatch):
    drawn = []
    real = explorer.draw_explorer
    monkeypatch.setattr(explorer, "draw_explorer",
                        lambda nbytes, g, net, **k: drawn.append((nbytes, g, net)) or real(nbytes, g, net, **k))
    return drawn


def test_default_state_is_drawn_at_construction(monkeypatch):
    """Planted: no redraw() at construction -> 'assert [] == [...]' and an empty image."""
    drawn = _spy(monkeypatch)
    box = explorer.network_explorer()
    assert [(n, g, net.gpus_per_node) for n, g, net in drawn] == [(4 << 20, 1024, 8)]
    net = drawn[0][2]
    assert net.bandwidth == 50e9 and net.latency == 10e-6        # 400 Gb/s = 50 GB/s each way, 10 µs
    words, image = box.children[3], box.children[4]
    assert bytes(image.value).startswith(b"\x89PNG")
    # 2(G−1) = 2046 steps of 10 µs + 512 B/50 GB/s: 8 channels, one per GPU's network link, each carrying a
    # segment of 4 MiB/(8·1024) (8·G divides N); NVLink's 7 segments at 450 GB/s take less
    ring = 2046 * (10e-6 + (4 << 20) / (8 * 1024) / 50e9)
    assert abs(closed_form_time("ring", 1024, (4 << 20) // 4, net) - ring) < 1e-12
    assert f"ring {ring * 1e3:g} ms" in words.value, words.value


def test_every_slider_redraws(monkeypatch):
    """Planted: the latency slider not observed -> ('latency (µs)', 4): 'assert 4 == 5', not redrawn."""
    drawn = _spy(monkeypatch)
    box = explorer.network_explorer()
    (g, size), (bandwidth, latency), node = box.children[0].children, box.children[1].children, box.children[2]
    image = box.children[4]
    for i, (control, value) in enumerate(((g, 64), (size, 1 << 30), (bandwidth, 100), (latency, 2), (node, 4))):
        before = image.value
        control.value = value
        assert len(drawn) == i + 2, (control.description, len(drawn))
        assert image.value != before, f"{control.description}: the image did not change"
    nbytes, world_size, net = drawn[-1]
    assert (nbytes, world_size, net.gpus_per_node) == (1 << 30, 64, 4)
    assert (net.bandwidth, net.latency) == (100e9 / 8, 2e-6)
    assert "G = 64, 1 GiB" in box.children[3].value


def test_ring_step_writes_the_seeds_sums_past_five_gpus():
    """Chapter 01's ring step-through at G = 6, end of the reduce-scatter: the complete segment is the
    seed's written-out sum of six terms (R5), never Σ or a₁+…+f₁, in a font of 11 pt or more.
    Planted: the old shortening (Σ for a complete sum) -> cells read "Σ₂", "c₃+…+a₃"."""
    from coursekit.collectives import ring_walkthrough
    from coursekit.viz.collectives import draw_ring_step

    fig = draw_ring_step(ring_walkthrough(6), 5)
    cells = [t for t in fig.axes[0].texts if "+" in t.get_text() or len(t.get_text()) == 2]
    texts = [t.get_text() for t in cells]
    assert not any("Σ" in s or "…" in s for s in texts), texts
    complete = [s for s in texts if s.count("+") == 5]
    assert len(complete) == 6, texts          # one complete segment per GPU
    assert all(set("abcdef") <= set(s) for s in complete)
    assert min(t.get_fontsize() for t in cells) >= 11
