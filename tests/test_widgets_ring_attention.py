"""Chapter 06's ring attention explorer: drawn at construction, every control redraws, and what it draws is the
library's own run (blocks, work per rank) and equals full attention (one query's running max and sum).

Each test names the bug planted by hand (in coursekit/widgets/ring_attention.py) to see it fail, then restored.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("agg")

import matplotlib.text  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import coursekit.widgets.ring_attention as explorer  # noqa: E402
from coursekit.parallel.sequence import chunk_bounds  # noqa: E402
from coursekit.viz.ring_attention import draw_rounds  # noqa: E402
from figure_support import drawn_texts  # noqa: E402
from ring_blocks import computed_per_step  # noqa: E402


def _spy(monkeypatch):
    drawn = []
    real = explorer.draw_rounds

    def spy(rounds, round_, query, other=None, fig=None):
        fig = real(rounds, round_, query, other=other, fig=fig)
        drawn.append((rounds, round_, query, other, _gids(fig)))
        return fig
    monkeypatch.setattr(explorer, "draw_rounds", spy)
    return drawn


def _gids(fig) -> dict:
    return {a.get_gid(): a for ax in fig.axes for a in list(ax.patches) + list(ax.lines) if a.get_gid()}


def _state(entry):
    rounds, round_, query, other, _ = entry
    return rounds.world_size, rounds.seq_len, rounds.causal, rounds.layout, round_, query, other.layout


def test_default_state_is_drawn_at_construction(monkeypatch):
    """Planted: no ``redraw()`` at construction -> 'assert [] == [(4, 16, True, ...)]' (nothing drawn)."""
    drawn = _spy(monkeypatch)
    box = explorer.ring_attention_explorer()
    assert [_state(d) for d in drawn] == [(4, 16, True, "zigzag", 0, 7, "contiguous")]
    words, image = box.children[3], box.children[4]
    assert bytes(image.value).startswith(b"\x89PNG")
    assert "Round 0 of 0…3" in words.value and "rank 1 ← K/V of rank 1" in words.value


def test_every_control_redraws_and_round_and_layout_change_what_is_drawn(monkeypatch):
    """Planted: the widget ignores the round (draws round 0 whatever the slider says) -> 'assert (2 == 2 and
    <memory> != <memory>)', the image unchanged; contiguous recorded for zig-zag (``rounds_for`` always
    "contiguous") -> the default state reads 'contiguous' (and rank 0's queries are not chunks 0 and 2G−1);
    the query slider not observed -> "('query token', 2) assert 2 == 3"."""
    drawn = _spy(monkeypatch)
    box = explorer.ring_attention_explorer()
    (g, length), (mask, order), (step, row) = (box.children[i].children for i in range(3))
    image = box.children[4]

    def queries_of_rank_0(gids):
        return sorted((round(p.get_x()), round(p.get_x() + p.get_width())) for gid, p in gids.items()
                      if gid.startswith("queries rank 0 "))

    assert queries_of_rank_0(drawn[-1][-1]) == [(0, 2), (14, 16)]   # zig-zag: chunks 0 and 2G−1 of 2 tokens
    before = image.value
    step.value = 2
    assert len(drawn) == 2 and image.value != before
    gids = drawn[-1][-1]
    assert "computed rank 0 round 2 q 14-16 k 4-6" in gids, sorted(gids)[:6]   # zig-zag: rank 0 holds rank 2's K/V
    assert "skipped rank 0 round 2 q 0-2 k 4-6" in gids
    assert not any(" round 3 " in gid for gid in gids)                           # round 3 not reached yet
    assert [gid for gid in gids if gid.startswith("held rank 0 ")] == ["held rank 0 kv of rank 2"]
    for control, value in ((row, 8), (order, "contiguous"), (mask, False), (g, 3), (length, 20)):
        before = image.value
        control.value = value
        assert len(drawn) == 3 + [row, order, mask, g, length].index(control), (control.description, len(drawn))
        assert image.value != before, f"{control.description}: the image did not change"
    assert _state(drawn[-1]) == (3, 20, False, "contiguous", 2, 8, "zigzag")
    assert queries_of_rank_0(drawn[-1][-1]) == [(0, 7)]                          # 20 tokens in 3 chunks: 7, 7, 6
    g.value = 2                                                                  # the round follows G down
    assert step.max == 1 and step.value == 1 and len(drawn) == 8 and drawn[-1][1] == 1


def _work_per_rank(world_size, seq_len, causal, layout):
    """What the ring computed at each step, watched from outside (not the library's count)."""
    return computed_per_step(world_size, seq_len, causal, layout)


@pytest.mark.parametrize("world_size,seq_len,causal", [(4, 16, True), (3, 17, True), (3, 17, False)])
def test_drawn_work_per_rank_is_the_librarys_count(world_size, seq_len, causal):
    """Bars equal the blocks the ring computed, summed over rounds 0…s, dashed outlines its whole total.
    Planted: ``work_through`` sums ``per_step[:round_]`` (this round left out) -> '12 != 0' at round 0."""
    both = {lay: explorer.record_rounds(world_size, seq_len, causal, lay) for lay in ("zigzag", "contiguous")}
    want = {lay: _work_per_rank(world_size, seq_len, causal, lay) for lay in both}
    for round_ in (0, world_size - 1):
        fig = draw_rounds(both["zigzag"], round_, 0, other=both["contiguous"])
        gids = _gids(fig)
        for lay, per_rank in want.items():
            for rank, per_step in enumerate(per_rank):
                assert gids[f"work {lay} rank {rank}"].get_height() == sum(per_step[:round_ + 1]), (lay, rank, round_)
                assert gids[f"total {lay} rank {rank}"].get_height() == sum(per_step)
        matplotlib.pyplot.close(fig)
    if causal and seq_len == 16:   # zig-zag balanced, contiguous not: 2G+1 = 9 blocks of 4 each; contiguous r+1 blocks of 16
        assert [sum(s) for s in want["zigzag"]] == [36] * 4 and [sum(s) for s in want["contiguous"]] == [16, 32, 48, 64]


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [True, False])
def test_running_max_and_sum_equal_full_attention(causal, layout):
    """One query's m and l after round s, independently: full attention's scores over the keys of the blocks rank r
    held in rounds 0…s (rank (r − s') mod G's), causal-masked. Planted: the merge's lse not noted (each block's own
    kept) -> '(3, 1) 1.110 == 1.152', l wrong from the second block on; m from the last block only (no running
    max) -> '(4, 1) 4.860 == 15.139', m falls back."""
    world_size, seq_len = 3, 17
    rounds = explorer.record_rounds(world_size, seq_len, causal, layout)
    q, k, _ = explorer.tensors(seq_len)
    scores = q @ k.T / 8 ** 0.5
    bounds = chunk_bounds(seq_len, world_size, layout)
    for i in range(seq_len):
        r = rounds.owner(i)
        seen = torch.zeros(seq_len, dtype=torch.bool)
        for s in range(world_size):
            assert rounds.held[s][r] == (r - s) % world_size
            for a, b in bounds[(r - s) % world_size]:
                seen[a:b] = True
            keys = seen & (torch.arange(seq_len) <= i) if causal else seen
            m_want = scores[i][keys].max()
            l_want = torch.exp(scores[i][keys] - m_want).sum()
            m, l = rounds.running(i, s)
            assert m[-1] == pytest.approx(m_want.item(), abs=1e-12), (i, s)
            assert l[-1] == pytest.approx(l_want.item(), rel=1e-12), (i, s)
        assert (m[-1], l[-1]) == pytest.approx(rounds.full(i), rel=1e-12)
    query = seq_len - 5
    fig = draw_rounds(rounds, world_size - 1, query)
    gids = _gids(fig)
    m, l = rounds.running(query, world_size - 1)
    assert list(gids["running max m"].get_ydata()) == pytest.approx(m)
    assert list(gids["sum l = Σ e^(score − m)"].get_ydata()) == pytest.approx(l)
    assert "equal to full attention" in explorer.describe(rounds, world_size - 1, query)
    matplotlib.pyplot.close(fig)


def test_the_legend_draws_full_attention_as_the_dashed_line_it_is():
    """Issue 26 §6: the legend's "full attention" entry was a grey patch for a dashed line. Planted bug, seen
    failing: the Patch handle back ("Rectangle, not a dashed line")."""
    rounds = explorer.record_rounds(2, 8, True, "zigzag")
    fig = draw_rounds(rounds, 0, 3)
    entries = [(text.get_text(), handle) for ax in fig.axes if ax.get_legend() is not None
               for text, handle in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles)]
    handle = dict(entries)["full attention"]
    assert isinstance(handle, matplotlib.lines.Line2D) and handle.get_linestyle() == "--", (
        f"{type(handle).__name__}, not a dashed line")


def _texts(fig):
    return drawn_texts(fig)[0]


@pytest.mark.parametrize("world_size,seq_len,causal,layout", [(2, 16, False, "zigzag"), (4, 16, True, "zigzag"),
                                                              (8, 16, True, "zigzag"), (8, 64, True, "contiguous"),
                                                              (3, 17, True, "contiguous")])
def test_every_text_is_legible_and_none_overlaps_another(world_size, seq_len, causal, layout):
    """Issue 43 (legible at 100%): no text under 8 pt at the figure's own size, at the widget's smallest and
    largest G and S, and no two texts on top of each other. Seen failing on the old module -> "text under 8 pt:
    [(7.0, '0'), (7.0, '1'), (7.0, 'contiguous'), (7.0, 'full attention'), ...]"; planted: the block labels back at
    7 pt and "K/V of rank j" at 7.5 -> "[(7.0, '0'), ..., (7.5, 'K/V of rank 0')]"; "K/V of rank j" at 22 pt ->
    "texts on top of each other: [('K/V of rank 1', 'K/V of rank 2'), ...]"."""
    other = explorer.record_rounds(world_size, seq_len, causal, "contiguous" if layout == "zigzag" else "zigzag")
    fig = draw_rounds(explorer.record_rounds(world_size, seq_len, causal, layout), world_size - 1, seq_len - 1,
                      other=other)
    texts = _texts(fig)
    small = sorted({(t.get_fontsize(), t.get_text()[:20]) for t, _ in texts if t.get_fontsize() < 8})
    assert not small, f"text under 8 pt: {small[:6]}"
    overlaps = [(a.get_text()[:20], b.get_text()[:20]) for i, (a, box_a) in enumerate(texts)
                for b, box_b in texts[i + 1:] if box_a.overlaps(box_b)]
    assert not overlaps, f"texts on top of each other: {overlaps[:5]}"
    matplotlib.pyplot.close(fig)
