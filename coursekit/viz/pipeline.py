"""Figures of a pipeline schedule: the plan on a unit-time grid, and the plan above a measured run.

    >>> from coursekit.parallel.pipeline.schedules import one_f_one_b, plan
    >>> fig = draw_plan(plan(one_f_one_b(p=4, m=8)))              # one row per rank; empty = bubble
    >>> fig = draw_plan_and_measured(plan(one_f_one_b(4, 8)), spans)  # doctest: +SKIP  (spans: Tracer.gather())

Each box is one compute action of :func:`coursekit.parallel.pipeline.plan`,
drawn where the plan puts it: forwards blue, backwards green, weight
gradients (zero bubble) red; the label is the micro-batch (and the stage when
a rank holds several). Whatever is left white is the bubble, so the
fraction in the title is the white area. The measured chart below comes from
the executor's spans, which carry the same names (``F3@s1``). "peak" is the
most micro-batches a rank holds between F and B (with W: also until W).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ..parallel.pipeline import Plan, bubble_formula, measured_bubble
from .timeline import COLOURS, draw_timeline

OP_COLOURS = {"F": COLOURS["forward"], "B": COLOURS["backward"], "W": "#C44E52"}
OP_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient (W)"}


def draw_plan(plan: Plan, ax=None, title: str | None = None, legend: bool = True):
    """Draw ``plan`` as a Gantt chart, rank 0 on top; returns the figure.

    Every box has ``gid`` set to its action (``"F3@s1"``), so a test (or a
    reader) can find which box is which.
    """
    s = plan.schedule
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(14, 2 + 0.32 * float(plan.makespan)), 0.8 + 0.55 * s.n_ranks))
    else:
        fig = ax.figure
    many = s.stages_per_rank > 1
    for rank, spans in enumerate(plan.spans):
        y = s.n_ranks - 1 - rank
        for action, start, end in spans:
            box = Rectangle((float(start), y + 0.1), float(end - start), 0.8, facecolor=OP_COLOURS[action.op],
                            edgecolor="white", linewidth=0.8, gid=str(action),
                            alpha=1.0 if action.stage < s.n_ranks or not many else 0.65)
            ax.add_patch(box)
            label = f"{action.micro_batch}" + (f"\n s{action.stage}" if many else "")
            ax.text(float(start + end) / 2, y + 0.5, label, ha="center", va="center", fontsize=6, color="white")
        held, in_flight = plan.peak_activations[rank], plan.peak_in_flight[rank]
        ax.text(float(plan.makespan) * 1.01, y + 0.5, f"peak {held}" + (f"\n({in_flight} until W)" if in_flight != held
                                                                         else ""), va="center", fontsize=7)
    ax.set_xlim(0, float(plan.makespan) * 1.09 or 1)
    ax.set_ylim(0, s.n_ranks)
    ax.set_yticks([s.n_ranks - 1 - r + 0.5 for r in range(s.n_ranks)], [f"rank {r}" for r in range(s.n_ranks)])
    ax.set_xlabel("time (units: F = 1" + (", B = 1, W = 1)" if s.split_backward else ", B = 2)"))
    formula = bubble_formula(s.name, s.n_ranks, s.n_micro_batches, s.stages_per_rank) if s.name in (
        "gpipe", "1f1b", "interleaved", "zb_h1") else None
    text = title or (f"{s.name}: p = {s.n_ranks}, m = {s.n_micro_batches}" + (f", v = {s.stages_per_rank}" if many
                                                                              else ""))
    text += f"  —  bubble {float(plan.bubble_fraction):.1%}"
    if formula is not None:
        text += f" (formula {float(formula):.1%})"
    ax.set_title(text, fontsize=10)
    if legend:
        ops = [op for op in "FBW" if any(a.op == op for spans in plan.spans for a, _, _ in spans)]
        names = {**OP_NAMES, "B": "input gradient (B)"} if s.split_backward else OP_NAMES
        ax.legend(handles=[Patch(color=OP_COLOURS[op], label=names[op]) for op in ops]
                  + [Patch(facecolor="white", edgecolor="0.6", label="empty = bubble")],
                  ncol=4, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3 - 0.05 * (s.n_ranks < 3)),
                  frameon=False)
    fig.tight_layout()
    return fig


def draw_plan_and_measured(plan: Plan, spans: list, title: str | None = None):
    """The planned schedule (unit time) above the measured Gantt chart of the same run (seconds, as ms).

    ``spans`` are :class:`coursekit.trace.Span` from the executor, one step. Each axis has its own clock:
    the plan in units, the run in ms; where the measured boxes keep the plan's shape, the executor follows
    its schedule. The measured title gives the bubble over the plan's window (first compute action to last,
    :func:`coursekit.parallel.pipeline.measured_bubble`) and, apart, the step's tail after it -- the
    dashed line marks where the schedule's actions end and the tail begins.
    """
    n = plan.schedule.n_ranks
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 2.0 + 1.3 * n))
    draw_plan(plan, ax=top, legend=False)
    measured = measured_bubble(spans)
    text = (f"{title or 'measured'}  —  bubble {measured.bubble:.1%} (the schedule's actions); "
            f"tail {measured.tail_share:.1%} of the step (optimizer, end-of-step sync)")
    draw_timeline(spans, ax=bottom, title=text, hidden_share=False)
    if measured.window > 0:  # the timeline's clock: ms since its first span
        bottom.axvline((measured.end - min(s.start for s in spans)) * 1e3, color="0.3", linestyle="--",
                       linewidth=0.8)
    fig.tight_layout()
    return fig
