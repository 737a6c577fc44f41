"""Chapter 01's figures: sizes in KiB/MiB, whole-number G ticks, the master visible beside the ring, legends."""

import matplotlib

matplotlib.use("agg")

from coursekit.viz.collectives import size_label, plot_rank_load, plot_timings, plot_traffic  # noqa: E402


def test_sizes_read_in_kib_and_mib():
    assert [size_label(b) for b in (512, 4096, 2**20, 64 * 2**20)] == ["512 B", "4 KiB", "1 MiB", "64 MiB"]


def _rows():
    return [{"algorithm": a, "G": g, "N": 10, "measured": m * (g - 1) * 10, "formula": m * (g - 1) * 10}
            for g in range(2, 6) for a, m in (("naive", g), ("master", 2), ("ring", 2))]


def test_the_master_is_not_hidden_under_the_ring_and_g_ticks_are_whole():
    """Planted bugs: master drawn like the ring (same values: one series hides the other); fractional G ticks."""
    ax = plot_traffic(_rows())
    lines = {line.get_label(): line for line in ax.get_lines()}
    master, ring = lines["master (= ring): formula"], lines["ring: formula"]
    assert master.get_linestyle() != ring.get_linestyle()
    assert lines["master (= ring): counted"].get_marker() != lines["ring: counted"].get_marker()
    ax.figure.canvas.draw()
    assert all(float(t).is_integer() for t in ax.get_xticks()), ax.get_xticks()


def test_fitted_lines_have_legend_entries_and_the_rank_legend_sits_beside_the_bars():
    rows = [{"algorithm": "ring", "bytes": b, "seconds": 1e-4 + b * 1e-9} for b in (4096, 2**20)]
    ax = plot_timings(rows, {"ring": (1e-4, 1e-9)})
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "ring: fitted α + β·bytes" in labels
    ax.figure.canvas.draw()
    assert ax.xaxis.get_major_formatter()(2**20, 0) == "1 MiB"
    ax = plot_rank_load({"master": {0: 7, 1: 1}, "ring": {0: 2, 1: 2}})
    ax.figure.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1, "the legend must not cover the last bar"
