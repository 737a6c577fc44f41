"""Step through ring attention's rounds: who holds which key/value block, which blocks are done, one query's max and sum.

    >>> from coursekit.widgets.ring_attention import ring_attention_explorer
    >>> ring_attention_explorer()      # in a notebook cell: controls, one paragraph, the figure -- drawn at once

Nothing here is a second copy of the algorithm. :func:`record_rounds` runs the
library's :func:`coursekit.parallel.sequence.ring_attention` on tiny
tensors on the single-process simulator (``comm.simulate``, one thread per
rank) and *listens* to it: while it runs, the module's own ``_mask``,
``block_attention`` and ``merge`` are wrapped so that every (query chunk, key
chunk) pair the ring meets is noted with its round (skipped or computed), with
each block's score maximum and the running log-sum-exp the merge leaves. The
work per rank is the library's :func:`attention_work` count. One recording per
(G, S, causal, layout) is cached, so the round and query sliders redraw from it.
"""

from __future__ import annotations

import io
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from .. import comm
from ..parallel.sequence import core as _ring
from ..parallel.sequence import attention_work, chunk_bounds, ring_attention, shard_sequence
from ..viz.ring_attention import LAYOUT_NAMES, draw_rounds, figsize

HEAD_DIM = 8


@dataclass
class Pair:
    """One (query chunk, key chunk) pair rank ``rank`` met in round ``round``: computed, or skipped (all future)."""

    rank: int
    round: int
    q: tuple[int, int]
    k: tuple[int, int]
    skipped: bool


@dataclass
class RingRounds:
    """What one ring attention call did, round by round (from :func:`record_rounds`).

    ``held[s][r]``: whose key/value block rank r held in round s. ``running_max[s, i]`` and
    ``running_lse[s, i]``: query i's running score maximum and log-sum-exp after round s
    (``-inf`` before its first block). ``work[r]``: rank r's :class:`~coursekit.parallel.sequence.AttentionWork`.
    """

    world_size: int
    seq_len: int
    causal: bool
    layout: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    bounds: list
    pairs: list = field(default_factory=list)
    held: list = field(default_factory=list)
    running_max: torch.Tensor | None = None
    running_lse: torch.Tensor | None = None
    work: list = field(default_factory=list)

    def owner(self, position: int) -> int:
        """The rank whose queries (and keys) include token ``position``."""
        return next(r for r, chunks in enumerate(self.bounds) if any(a <= position < b for a, b in chunks))

    def work_through(self, round_: int) -> list[int]:
        """Score elements each rank computed in rounds 0 … ``round_`` (the library's count, per ring step)."""
        return [sum(w.per_step[:round_ + 1]) for w in self.work]

    def running(self, query: int, round_: int) -> tuple[list[float], list[float]]:
        """Query ``query``'s running max m and sum l = Σ e^(score − m) after each round 0 … ``round_``."""
        m = self.running_max[:round_ + 1, query]
        lse = self.running_lse[:round_ + 1, query]
        return m.tolist(), torch.exp(lse - m).nan_to_num(0.0).tolist()

    def full(self, query: int) -> tuple[float, float]:
        """Query ``query``'s max and sum of exponentials over every key it may see: full attention's."""
        scores = self.q[query] @ self.k.T * HEAD_DIM ** -0.5
        if self.causal:
            scores = scores[:query + 1]
        m = scores.max()
        return m.item(), torch.exp(scores - m).sum().item()


def tensors(seq_len: int, seed: int = 12) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole sequence's q, k, v, ``(seq_len, 8)`` float64, drawn ×2 from ``seed`` as chapter 06's cell draws them."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(seq_len, HEAD_DIM, generator=gen, dtype=torch.float64) * 2 for _ in range(3))


_listening_lock = threading.Lock()
_here = threading.local()


@contextmanager
def _listening():
    """Wrap the ring module's ``block_mask``, ``block_attention`` and ``merge`` to note what each simulated rank does."""
    mask_fn, block_fn, merge_fn = _ring.block_mask, _ring.block_attention, _ring.merge

    def mask(q_pos, k_pos, causal):
        out = mask_fn(q_pos, k_pos, causal)
        if getattr(_here, "log", None) is not None:
            key = int(k_pos[0])
            owner = next(r for r, chunks in enumerate(_here.bounds) if any(a <= key < b for a, b in chunks))
            round_ = (_here.rank - owner) % len(_here.bounds)  # at step s rank r holds rank (r - s)'s keys
            _here.log.append(("pair", round_, q_pos, k_pos, isinstance(out, str)))
        return out

    def block(q, k, v, mask=None, scale=None):
        o, lse = block_fn(q, k, v, mask, scale)
        if getattr(_here, "log", None) is not None:
            scores = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
            if mask is not None:
                scores = scores.masked_fill(mask, float("-inf"))
            _here.log.append(("block", scores.amax(-1).reshape(-1), lse.reshape(-1)))
        return o, lse

    def merge(o1, lse1, o2, lse2):
        o, lse = merge_fn(o1, lse1, o2, lse2)
        if getattr(_here, "log", None) is not None:
            _here.log.append(("merge", lse.reshape(-1)))
        return o, lse

    with _listening_lock:
        _ring.block_mask, _ring.block_attention, _ring.merge = mask, block, merge
        try:
            yield
        finally:
            _ring.block_mask, _ring.block_attention, _ring.merge = mask_fn, block_fn, merge_fn


def record_rounds(world_size: int = 4, seq_len: int = 16, causal: bool = True, layout: str = "zigzag",
                  seed: int = 12) -> RingRounds:
    """Run ring attention (forward) on G simulated ranks over :func:`tensors` and note every round."""
    q, k, v = tensors(seq_len, seed)
    bounds = chunk_bounds(seq_len, world_size, layout)
    logs = [[] for _ in range(world_size)]
    works = [attention_work(seq_len, rank, world_size, layout, causal) for rank in range(world_size)]

    def run(rank, size):
        _here.log, _here.rank, _here.bounds = logs[rank], rank, bounds
        try:
            mine = [shard_sequence(t.view(1, 1, seq_len, HEAD_DIM), 2, rank, size, layout) for t in (q, k, v)]
            return ring_attention(*mine, causal, layout, seq_len)
        finally:
            _here.log = None

    with _listening():
        comm.simulate(run, world_size)
    rounds = RingRounds(world_size, seq_len, causal, layout, q, k, v, bounds, work=works)
    rounds.running_max = torch.full((world_size, seq_len), float("-inf"), dtype=q.dtype)
    rounds.running_lse = torch.full((world_size, seq_len), float("-inf"), dtype=q.dtype)
    rounds.held = [[None] * world_size for _ in range(world_size)]
    for rank, log in enumerate(logs):
        m = torch.full((seq_len,), float("-inf"), dtype=q.dtype)
        lse = m.clone()
        where, done_round = None, 0
        for event in log:
            if event[0] == "pair":
                _, round_, q_pos, k_pos, skipped = event
                for s in range(done_round, round_):        # rounds finished: snapshot this rank's queries
                    rounds.running_max[s], rounds.running_lse[s] = _keep(rounds, s, rank, m, lse)
                done_round = round_
                where = q_pos
                pair = Pair(rank, round_, (int(q_pos[0]), int(q_pos[-1]) + 1), (int(k_pos[0]), int(k_pos[-1]) + 1),
                            skipped)
                rounds.pairs.append(pair)
                rounds.held[round_][rank] = rounds.owner(pair.k[0])
            elif event[0] == "block":
                m[where] = torch.maximum(m[where], event[1])
                lse[where] = event[2]           # the first block of these queries; a merge that follows replaces it
            else:
                lse[where] = event[1]
        for s in range(done_round, world_size):
            rounds.running_max[s], rounds.running_lse[s] = _keep(rounds, s, rank, m, lse)
    return rounds


def _keep(rounds: RingRounds, s: int, rank: int, m: torch.Tensor, lse: torch.Tensor):
    """Round ``s``'s rows with ``rank``'s queries replaced by its current state."""
    mine = torch.zeros(rounds.seq_len, dtype=torch.bool)
    for a, b in rounds.bounds[rank]:
        mine[a:b] = True
    return torch.where(mine, m, rounds.running_max[s]), torch.where(mine, lse, rounds.running_lse[s])


def describe(rounds: RingRounds, round_: int, query: int, other: RingRounds | None = None) -> str:
    """The paragraph under the controls: who holds what, blocks done and skipped, the query's m and l, the work."""
    g = rounds.world_size
    now = [p for p in rounds.pairs if p.round == round_]
    computed, skipped = sum(not p.skipped for p in now), sum(p.skipped for p in now)
    holds = ", ".join(f"rank {r} ← K/V of rank {j}" for r, j in enumerate(rounds.held[round_]))
    m, l = rounds.running(query, round_)
    text = (f"<b>Round {round_} of 0…{g - 1}</b>: {holds}. This round {computed} (query chunk, key chunk) "
            f"block{'s' * (computed != 1)} computed" + (f", {skipped} skipped (entirely in the future)" if skipped
                                                          else "") + ".<br>")
    owner = rounds.owner(query)
    if m[-1] == float("-inf"):
        text += f"Query {query} (rank {owner}) has met no key yet.<br>"
    else:
        text += f"Query {query} (rank {owner}): running max m = {m[-1]:.3f}, sum l = Σ e^(score − m) = {l[-1]:.3f}"
        if round_ == g - 1:
            fm, fl = rounds.full(query)
            same = abs(fm - m[-1]) < 1e-9 and abs(fl - l[-1]) < 1e-9 * max(1.0, fl)
            text += f" — {'equal to' if same else 'NOT equal to'} full attention's (m = {fm:.3f}, l = {fl:.3f})"
        text += ".<br>"
    text += "Score elements computed so far, per rank: " + "; ".join(
        f"{LAYOUT_NAMES[r.layout]} {r.work_through(round_)}" for r in ([rounds] + ([other] if other else []))) + "."
    return text


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    return buffer.getvalue()


def ring_attention_explorer(world_size: int = 4, seq_len: int = 16, causal: bool = True, layout: str = "zigzag",
                            round_: int = 0, query: int = 7) -> widgets.VBox:
    """G (2–8), S, causal, layout, the round and the query above one paragraph and the figure; every change
    redraws. The default state is drawn at once. ``query``: a global token position."""
    style = {"description_width": "7em"}
    g = widgets.IntSlider(value=world_size, min=2, max=8, description="G (ranks)", continuous_update=False,
                          style=style)
    length = widgets.IntSlider(value=seq_len, min=16, max=64, description="S (tokens)", continuous_update=False,
                               style=style)
    mask = widgets.Checkbox(value=causal, description="causal mask")
    order = widgets.ToggleButtons(options=[(v, k) for k, v in LAYOUT_NAMES.items()], value=layout,
                                  description="layout")
    step = widgets.IntSlider(value=round_, min=0, max=world_size - 1, description="round", style=style)
    row = widgets.IntSlider(value=min(query, seq_len - 1), min=0, max=seq_len - 1,
                            description="query token", style=style)
    words = widgets.HTML()
    image = widgets.Image(format="png")
    fig = plt.figure(figsize=figsize())
    plt.close(fig)  # drawn into the Image widget only, never shown twice by the inline backend
    cache: dict[tuple, RingRounds] = {}
    busy = [False]

    def rounds_for(lay: str) -> RingRounds:
        key = (g.value, length.value, mask.value, lay)
        if key not in cache:
            cache[key] = record_rounds(*key)  # the simulator: a few hundredths of a second
        return cache[key]

    def redraw(_change=None) -> None:
        if busy[0]:
            return
        busy[0] = True
        try:
            step.max, row.max = g.value - 1, length.value - 1   # the values follow (clamped) before we draw
        finally:
            busy[0] = False
        here = rounds_for(order.value)
        other = rounds_for("contiguous" if order.value == "zigzag" else "zigzag")
        draw_rounds(here, step.value, row.value, other=other, fig=fig)
        image.value = _png(fig)
        words.value = describe(here, step.value, row.value, other)

    for control in (g, length, mask, order, step, row):
        control.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([g, length]), widgets.HBox([mask, order]), widgets.HBox([step, row]),
                         words, image])
