"""Figures of a pipeline schedule: the plan on one time axis, and the plan above a measured run.

    >>> from coursekit.parallel.pipeline.schedules import interleaved_1f1b, one_f_one_b, plan
    >>> fig = draw_plan(plan(one_f_one_b(p=4, m=8)))              # one row per rank; empty = bubble
    >>> fig = draw_plans([plan(one_f_one_b(4, 8)), plan(interleaved_1f1b(4, 8, 2))])  # one axis, one legend
    >>> fig = draw_plan_and_measured(plan(one_f_one_b(4, 8)), spans)  # doctest: +SKIP  (spans: Tracer.gather())

Each box is one compute action of :func:`coursekit.parallel.pipeline.plan`,
drawn where the plan puts it: forwards blue, backwards green, weight
gradients (zero bubble) red; the later chunks of an interleaved rank are a
paler shade of the same colour. The label is the micro-batch (and the stage
when a rank holds several). Whatever is left white is the bubble, so the
fraction in the title is the white area.

**One time axis.** The plan times one action of a *chunk* as one unit; an
interleaved rank's chunk holds 1/v of its layers, so its F takes 1/v of a
full stage's. Every chart here is drawn in **full-stage units** (a stage's F
= 1, its backward = 2): the x position is the plan's time divided by v. Drawn
in chunk units, interleaved 1F1B (p = 4, m = 8, v = 2: 57 units) would look
1.7x longer than 1F1B (33) when it is shorter (28.5).

The measured chart below a plan comes from the executor's spans, which carry
the same names (``F3@s1``; W spans have kind ``"weight"``). "peak" is the most
micro-batches a rank holds between F and B (with W: also until W).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ..parallel.pipeline import Plan, bubble_formula, measured_bubble
from .timeline import COLOURS, draw_timeline

OP_COLOURS = {"F": COLOURS["forward"], "B": COLOURS["backward"], "W": COLOURS.get("weight", "#C44E52")}
OP_NAMES = {"F": "forward (F)", "B": "backward (B)", "W": "weight gradient (W)"}
LATER_CHUNK_ALPHA = 0.55  # the shade of an interleaved rank's second (and later) chunks


def full_stage_scale(plan: Plan) -> float:
    """Plan units per full-stage unit: 1/v (one chunk holds 1/v of a rank's layers)."""
    return 1.0 / plan.schedule.stages_per_rank


def drawn_makespan(plan: Plan) -> float:
    """The plan's length in full-stage units: what the chart's x axis shows."""
    return float(plan.makespan) * full_stage_scale(plan)


def colours_used(plan: Plan) -> list[tuple[str, str, float]]:
    """``(label, colour, alpha)`` of every kind of box the plan draws, in legend order."""
    s, out = plan.schedule, []
    names = {**OP_NAMES, "B": "input gradient (B)"} if s.split_backward else OP_NAMES
    chunks = sorted({a.stage // s.n_ranks > 0 for spans in plan.spans for a, _, _ in spans})
    for later in chunks:
        for op in "FBW":
            if any(a.op == op and (a.stage // s.n_ranks > 0) == later for spans in plan.spans for a, _, _ in spans):
                what = ", chunk 2" + ("" if s.stages_per_rank == 2 else f"–{s.stages_per_rank}")
                label = names[op] + (what if later else ", chunk 1" if s.stages_per_rank > 1 else "")
                out.append((label, OP_COLOURS[op], LATER_CHUNK_ALPHA if later else 1.0))
    return out


def _title(plan: Plan, heading: str | None) -> str:
    """``heading — bubble x%`` and the formula's value only where it differs: each number said once."""
    s = plan.schedule
    many = s.stages_per_rank > 1
    text = heading or (f"{s.name}: p = {s.n_ranks}, m = {s.n_micro_batches}" + (f", v = {s.stages_per_rank}"
                                                                                if many else ""))
    text += f"  —  bubble {float(plan.bubble_fraction):.1%}"
    if s.name in ("gpipe", "1f1b", "interleaved", "zb_h1"):
        formula = bubble_formula(s.name, s.n_ranks, s.n_micro_batches, s.stages_per_rank)
        text += " (= the formula)" if formula == plan.bubble_fraction else f" (formula {float(formula):.1%})"
    return text + f", length {drawn_makespan(plan):g}"


def _xlabel(plans: list[Plan]) -> str:
    """What one unit of the shared axis is, for every schedule drawn on it."""
    split = any(p.schedule.split_backward for p in plans)
    chunks = sorted({p.schedule.stages_per_rank for p in plans if p.schedule.stages_per_rank > 1})
    return ("time, full-stage units (a stage's F = 1, its backward = 2" + (": B = 1 + W = 1" if split else "")
            + "".join(f"; a chunk of 1/{v} of a rank's layers: 1/{v} of that" for v in chunks) + ")")


def _legend(ax, entries: list[tuple[str, str, float]]) -> None:
    """One legend, to the right of the axes: it never covers the x-axis label or a box."""
    handles = [Patch(facecolor=colour, alpha=alpha, label=label) for label, colour, alpha in entries]
    handles.append(Patch(facecolor="white", edgecolor="0.6", label="empty = bubble"))
    ax.legend(handles=handles, fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def merged_entries(entries: list[tuple[str, str, float]]) -> list[tuple[str, str, float]]:
    """One legend entry per colour and shade: labels of the same box kind from several plans are joined
    (``"backward (B) / input gradient (B)"``), and a first chunk's is the plain kind's (``"forward (F)"``)."""
    labels: dict[tuple[str, float], list[str]] = {}
    for label, colour, alpha in entries:
        base = label.removesuffix(", chunk 1")
        names = labels.setdefault((colour, alpha), [])
        if base not in names:
            names.append(base)
    return [(" / ".join(names), colour, alpha) for (colour, alpha), names in labels.items()]


def draw_plan(plan: Plan, ax=None, title: str | None = None, legend: bool = True, xmax: float | None = None):
    """Draw ``plan`` as a Gantt chart in full-stage units, rank 0 on top; returns the figure.

    ``title`` replaces the heading (default: schedule, p, m, v); the bubble is always appended, once.
    ``xmax`` (full-stage units) sets a common axis for several charts. Every box has ``gid`` set to its
    action (``"F3@s1"``), so a test (or a reader) can find which box is which.
    """
    s, scale = plan.schedule, full_stage_scale(plan)
    length = drawn_makespan(plan)
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(14, 4 + 0.32 * (xmax or length)), 0.8 + 0.55 * s.n_ranks))
    else:
        fig = ax.figure
    many = s.stages_per_rank > 1
    for rank, spans in enumerate(plan.spans):
        y = s.n_ranks - 1 - rank
        for action, start, end in spans:
            later = action.stage // s.n_ranks > 0
            x0, x1 = float(start) * scale, float(end) * scale
            ax.add_patch(Rectangle((x0, y + 0.1), x1 - x0, 0.8, facecolor=OP_COLOURS[action.op],
                                   alpha=LATER_CHUNK_ALPHA if later else 1.0, edgecolor="white", linewidth=0.8,
                                   gid=str(action)))
            # the stage under the micro-batch where the box has room for it (a chunk's forward is 1/v wide)
            label = f"{action.micro_batch}" + (f"\ns{action.stage}" if many and x1 - x0 >= 0.99 else "")
            ax.text((x0 + x1) / 2, y + 0.5, label, ha="center", va="center", fontsize=8,
                    color="black" if later else "white")
        held, in_flight = plan.peak_activations[rank], plan.peak_in_flight[rank]
        ax.text(length + 0.01 * (xmax or length), y + 0.5,
                f"peak {held}" + (f"\n({in_flight} until W)" if in_flight != held else ""), va="center", fontsize=8)
    ax.set_xlim(0, (xmax or length) * 1.09 or 1)
    ax.set_ylim(0, s.n_ranks)
    ax.set_yticks([s.n_ranks - 1 - r + 0.5 for r in range(s.n_ranks)], [f"rank {r}" for r in range(s.n_ranks)])
    ax.set_xlabel(_xlabel([plan]))
    ax.set_title(_title(plan, title), fontsize=10)
    if legend:
        _legend(ax, colours_used(plan))
    fig.tight_layout()
    return fig


def draw_plans(plans: list[Plan], titles: list[str] | None = None):
    """Several plans stacked on **one** time axis (full-stage units), with one legend for every colour used."""
    plans = list(plans)
    rows = sum(p.schedule.n_ranks for p in plans)
    fig, axes = plt.subplots(len(plans), 1, figsize=(13, 0.9 * len(plans) + 0.5 * rows), sharex=True, squeeze=False)
    axes = list(axes[:, 0])
    longest = max(drawn_makespan(p) for p in plans)
    for k, (ax, planned) in enumerate(zip(axes, plans)):
        draw_plan(planned, ax=ax, title=titles[k] if titles else None, legend=False, xmax=longest)
        ax.set_xlabel(_xlabel(plans) if ax is axes[-1] else "")
    entries = list(dict.fromkeys(entry for planned in plans for entry in colours_used(planned)))
    entries.sort(key=lambda entry: -entry[2])  # every full shade first, then the later chunks'  (a stable sort)
    _legend(axes[0], merged_entries(entries))
    fig.tight_layout()
    return fig


def draw_plan_and_measured(plan: Plan, spans: list, title: str | None = None):
    """The planned schedule (full-stage units) above the measured Gantt chart of the same run (ms).

    ``spans`` are :class:`coursekit.measure.trace.Span` from the executor, one step. Each axis has its own clock:
    the plan in units, the run in ms; where the measured boxes keep the plan's shape, the executor follows
    its schedule. The plan has its own legend (every colour it uses); the measured chart the timeline's.
    The measured title gives the bubble over the plan's window (first compute action to last,
    :func:`coursekit.parallel.pipeline.measured_bubble`) and, apart, the step's tail after it -- the
    dashed line marks where the schedule's actions end and the tail begins.
    """
    n = plan.schedule.n_ranks
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 2.4 + 1.3 * n))
    draw_plan(plan, ax=top, title=f"planned: {plan.schedule.name}, p = {n}, m = {plan.schedule.n_micro_batches}"
              + (f", v = {plan.schedule.stages_per_rank}" if plan.schedule.stages_per_rank > 1 else ""))
    measured = measured_bubble(spans)
    text = (f"{title or 'measured'}  —  bubble {measured.bubble:.1%} (the schedule's actions); "
            f"tail {measured.tail_share:.1%} of the step (optimizer, end-of-step sync)")
    draw_timeline(spans, ax=bottom, title=text, hidden_share=False)
    if measured.window > 0:  # the timeline's clock: ms since its first span
        bottom.axvline((measured.end - min(s.start for s in spans)) * 1e3, color="0.3", linestyle="--",
                       linewidth=0.8)
    fig.tight_layout()
    return fig
