"""The figure of one round of ring attention, drawn from a recording (:func:`coursekit.widgets.ring_attention.record_rounds`).

    >>> from coursekit.widgets.ring_attention import record_rounds
    >>> fig = draw_rounds(record_rounds(4, 16, causal=True, layout="zigzag"), round_=1, query=15)

Left, the S×S grid of (query, key) tokens: each (query chunk, key chunk) pair
the ring has met so far is a box in the colour of the rank that computed it
(this round's solid, earlier ones pale, its round written in it); a pair
skipped because all its keys are in the query's future is grey and hatched;
white has not been reached yet. Middle, what each rank holds this round (its
queries, and whose key/value block) and the score elements each rank has
computed so far, zig-zag beside contiguous (dashed outlines: the whole call's).
Right, one query row's running max m and sum l = Σ e^(score − m), round by
round (hollow: a round where that query met only skipped blocks), against full
attention's (dashed). Every artist a test reads carries a ``gid``.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

LAYOUT_NAMES = {"zigzag": "zig-zag", "contiguous": "contiguous"}


def figsize() -> tuple[float, float]:
    return 13.5, 6.6


_PALETTE = (0, 1, 2, 3, 4, 5, 6, 8, 9, 7)   # tab10 with its grey last: grey means skipped here


def colour(rank: int):
    return plt.cm.tab10(_PALETTE[rank % 10])


def draw_rounds(rounds, round_: int, query: int, other=None, fig=None):
    """Draw ``rounds`` at round ``round_`` with query row ``query``; ``other``: the same call in the other
    layout, for the work comparison. Returns the figure (a new one unless ``fig`` is given)."""
    if fig is None:
        fig = plt.figure(figsize=figsize())
    fig.clf()
    spec = fig.add_gridspec(2, 3, width_ratios=[1.3, 1, 1], hspace=0.45, wspace=0.32)
    grid, hold, work = fig.add_subplot(spec[:, 0]), fig.add_subplot(spec[0, 1]), fig.add_subplot(spec[1, 1])
    top, bottom = fig.add_subplot(spec[0, 2]), fig.add_subplot(spec[1, 2])
    _grid(grid, rounds, round_, query)
    _holdings(hold, rounds, round_)
    _work(work, rounds, round_, other)
    _running(top, bottom, rounds, round_, query)
    g, s = rounds.world_size, rounds.seq_len
    fig.suptitle(f"ring attention, G = {g}, S = {s}, {'causal' if rounds.causal else 'no mask'}, "
                 f"{LAYOUT_NAMES[rounds.layout]} — round {round_} of 0…{g - 1}", fontsize=12)
    return fig


def _grid(ax, rounds, round_: int, query: int) -> None:
    s = rounds.seq_len
    for p in rounds.pairs:
        if p.round > round_:
            continue
        (qa, qb), (ka, kb) = p.q, p.k
        status = "skipped" if p.skipped else "computed"
        gid = f"{status} rank {p.rank} round {p.round} q {qa}-{qb} k {ka}-{kb}"
        if p.skipped:
            box = Rectangle((ka, qa), kb - ka, qb - qa, facecolor="#eeeeee", edgecolor="#999999", hatch="///",
                            linewidth=0.6, gid=gid)
        else:
            box = Rectangle((ka, qa), kb - ka, qb - qa, facecolor=colour(p.rank),
                            alpha=1.0 if p.round == round_ else 0.3, edgecolor="white", linewidth=0.8, gid=gid)
        ax.add_patch(box)
        if min(kb - ka, qb - qa) * 24 / s >= (2.5 if p.skipped else 1.2):   # only where the label fits
            ax.text((ka + kb) / 2, (qa + qb) / 2, "skip" if p.skipped else f"{p.round}", ha="center", va="center",
                    fontsize=8, color="#666666" if p.skipped else ("white" if p.round == round_ else "black"))
    edges = sorted({x for chunks in rounds.bounds for a, b in chunks for x in (a, b)})
    for x in edges:
        ax.axvline(x, color="#cccccc", linewidth=0.5, zorder=0)
        ax.axhline(x, color="#cccccc", linewidth=0.5, zorder=0)
    if rounds.causal:
        ax.plot([0, s], [0, s], color="black", linewidth=0.8, linestyle=":")
    ax.add_patch(Rectangle((0, query), s, 1, fill=False, edgecolor="black", linewidth=1.6, gid="query row"))
    ax.set_xlim(0, s)
    ax.set_ylim(s, 0)
    ax.set_aspect("equal")
    ax.set_xlabel("key token")
    ax.set_ylabel("query token")
    ax.set_title("(query chunk, key chunk) blocks met so far\n(number: the round; colour: the rank; hatched: "
                 "skipped)" if rounds.causal else "(query chunk, key chunk) blocks met so far\n"
                 "(number: the round; colour: the rank)", fontsize=9)


def _holdings(ax, rounds, round_: int) -> None:
    g, s = rounds.world_size, rounds.seq_len
    for r in range(g):
        for a, b in rounds.bounds[r]:
            ax.add_patch(Rectangle((a, r - 0.38), b - a, 0.3, facecolor=colour(r), alpha=0.3, edgecolor=colour(r),
                                   gid=f"queries rank {r} tokens {a}-{b}"))
        j = rounds.held[round_][r]
        for a, b in rounds.bounds[j]:
            ax.add_patch(Rectangle((a, r + 0.02), b - a, 0.36, facecolor=colour(j), edgecolor="black",
                                   linewidth=0.5, gid=f"held rank {r} kv of rank {j}"))
        ax.text(s * 1.05, r, f"K/V of rank {j}", va="center", fontsize=8)
    ax.set_xlim(0, s * 1.5)
    ax.set_ylim(g - 0.5, -0.5)
    ax.set_yticks(range(g), [f"rank {r}" for r in range(g)])
    ax.set_xticks([x for x in ax.get_xticks() if 0 <= x <= s])
    ax.set_xlabel("token")
    ax.set_title(f"round {round_}: each rank's queries (pale) and the K/V block it holds", fontsize=9)


def _work(ax, rounds, round_: int, other) -> None:
    g = rounds.world_size
    both = {r.layout: r for r in ([rounds] + ([other] if other is not None else []))}
    tallest = max(max(rec.work_through(g - 1)) for rec in both.values())
    for offset, layout in ((-0.2, "contiguous"), (0.2, "zigzag")):
        if layout not in both:
            continue
        rec, mine = both[layout], layout == rounds.layout
        so_far, total = rec.work_through(round_), rec.work_through(g - 1)
        for r in range(g):
            ax.bar(r + offset, so_far[r], width=0.38, color="#4C72B0" if layout == "zigzag" else "#DD8452",
                   alpha=1.0 if mine else 0.45, gid=f"work {layout} rank {r}",
                   label=LAYOUT_NAMES[layout] + (" (shown)" if mine else "") if r == 0 else None)
            ax.bar(r + offset, total[r], width=0.38, fill=False, edgecolor="#555555", linestyle="--",
                   linewidth=0.7, gid=f"total {layout} rank {r}")
    ax.set_xticks(range(g), [str(r) for r in range(g)])
    ax.set_ylim(0, 1.4 * tallest)            # room above the bars for the legend's two rows
    ax.set_xlabel("rank")
    ax.set_ylabel("score elements")
    ax.set_title(f"attention work, rounds 0–{round_} (dashed: all {g} rounds)", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")


def _running(top, bottom, rounds, round_: int, query: int) -> None:
    g = rounds.world_size
    m, l = rounds.running(query, round_)
    met = [any(not p.skipped and p.q[0] <= query < p.q[1] for p in rounds.pairs if p.round == s)
           for s in range(round_ + 1)]
    fm, fl = rounds.full(query)
    for ax, values, full, name in ((top, m, fm, "running max m"), (bottom, l, fl, "sum l = Σ e^(score − m)")):
        shown = [v if math.isfinite(v) else float("nan") for v in values]
        ax.plot(range(round_ + 1), shown, "-", color="#4C72B0", gid=name)
        for s, (v, filled) in enumerate(zip(shown, met)):
            ax.plot([s], [v], "o", color="#4C72B0", markerfacecolor="#4C72B0" if filled else "white")
        ax.axhline(full, color="#999999", linestyle="--", linewidth=1, gid=f"full attention {name}")
        ax.set_xlim(-0.4, g - 0.6)
        ax.set_xticks(range(g))
        ax.set_title(f"query {query} (rank {rounds.owner(query)}): {name}", fontsize=9)
    bottom.set_xlabel("round")
    top.legend(handles=[Line2D([], [], color="#999999", linestyle="--", linewidth=1, label="full attention")],
               fontsize=8, loc="lower right")  # the same dashed line as drawn
