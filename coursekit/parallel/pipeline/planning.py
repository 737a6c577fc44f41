"""Planning pipeline schedules: a schedule timed on a unit-time clock, next to the papers' formulas.

:func:`plan` validates a schedule (:mod:`coursekit.parallel.pipeline.validator`)
and replays it with F, B and W taking given times: the bubble, the makespan and
the activations each rank holds (:class:`Plan`). :func:`bubble_formula` and
:func:`peak_activations_formula` are the same quantities from the papers, so
the two can be checked against each other -- and the executor's measured run
(:mod:`coursekit.parallel.pipeline.executor`) against both.

    >>> from coursekit.parallel.pipeline.schedules import one_f_one_b
    >>> plan(one_f_one_b(p=2, m=3)).bubble_fraction == bubble_formula("1f1b", p=2, m=3)
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Sequence

from .schedules import SCHEDULES, Action, Schedule
from .validator import run_on_clock, validate

__all__ = ["Plan", "plan", "bubble_formula", "peak_activations_formula"]


@dataclass
class Plan:
    """A schedule executed on a unit-time clock: per rank, (action, start, end) of each compute action.

    ``peak_activations[r]``: the most (stage, micro-batch) pairs rank r holds
    whose F has run and whose B has not -- the full activations of Qi et al.'s
    Table 1 (M_B). ``peak_in_flight[r]``: the same until the *last* backward
    piece (W when the backward is split): B frees most activations but W still
    needs the layer inputs (M_W). With 1F1B's F/B order ZB-H1 keeps rank r's
    peak activations at min(p−r, m); its deferred W's make every rank hold p
    micro-batches in flight ("all workers maintain the same number of in-flight
    micro-batches", Qi et al. 2023, section 3.1) -- the first rank's 1F1B peak.
    """

    schedule: Schedule
    spans: list[list[tuple[Action, Fraction, Fraction]]]
    peak_activations: list[int] = field(default_factory=list)
    peak_in_flight: list[int] = field(default_factory=list)

    @property
    def makespan(self) -> Fraction:
        return max((end for spans in self.spans for _, _, end in spans), default=Fraction(0))

    def busy(self, rank: int) -> Fraction:
        return sum((end - start for _, start, end in self.spans[rank]), Fraction(0))

    @property
    def bubble_fraction(self) -> Fraction:
        """Idle compute time over p × makespan."""
        p, total = self.schedule.n_ranks, self.makespan
        return 1 - sum(self.busy(r) for r in range(p)) / (p * total) if total else Fraction(0)


def plan(schedule: Schedule, times: dict[str, float] | None = None,
         stage_costs: Sequence[float] | None = None) -> Plan:
    """Validate, then run ``schedule`` with F, B, W taking ``times`` (default 1 each; an unsplit B costs B + W).

    ``stage_costs``: one relative cost per stage (global index), multiplying every action's time on it --
    unequal stages, e.g. ``[1.5, 1]`` for a first stage 1.5x heavier than the second. The slowest stage
    then sets the pace and the others wait for it: a bubble the formulas (equal stages) do not have.

        >>> from coursekit.parallel.pipeline.schedules import one_f_one_b
        >>> float(plan(one_f_one_b(2, 4), stage_costs=[1.5, 1]).makespan)   # 4·(1.5 + 3) + (1 + 2) − 1.5
        19.5
    """
    validate(schedule)
    t = {"F": 1, "B": 1, "W": 1, **(times or {})}
    t = {op: Fraction(value) for op, value in t.items()}
    if not schedule.split_backward:
        t["B"] += t["W"]
    costs = None
    if stage_costs is not None:
        costs = [Fraction(c) for c in stage_costs]
        if len(costs) != schedule.n_stages or min(costs) <= 0:
            raise ValueError(f"stage_costs needs one positive cost per stage ({schedule.n_stages}), got "
                             f"{list(stage_costs)}")
    spans = run_on_clock(schedule, t, costs)
    last = "W" if schedule.split_backward else "B"
    return Plan(schedule, spans, [_peak(acts, "B") for acts in schedule.actions],
                [_peak(acts, last) for acts in schedule.actions])


def _peak(actions: list[Action], frees: str) -> int:
    held = peak = 0
    for a in actions:
        held += (a.op == "F") - (a.op == frees)
        peak = max(peak, held)
    return peak


# ----------------------------------------------------------------------------- the papers' formulas
def bubble_formula(name: str, p: int, m: int, v: int = 1, times: dict[str, float] | None = None) -> Fraction:
    """Idle fraction of p × makespan, from the papers (not from :func:`plan`).

    GPipe and 1F1B: (p−1)/(m+p−1) (Narayanan et al. 2021, eq. 1 over total time).
    Interleaved: (p−1)/(v·m+p−1) (the same paper: the bubble shrinks v times).
    ZB-H1 (Qi et al. 2023): bubble (p−1)(T_F+T_B−T_W) next to m(T_F+T_B+T_W) of
    work -- the paper's setting is T_F = T_B = T_W; :func:`zb_h1` meets it
    exactly whenever T_W <= min(T_F, T_B) (a deferred W fits where the rank waits).
    """
    t = {op: Fraction(x) for op, x in {"F": 1, "B": 1, "W": 1, **(times or {})}.items()}
    if name in ("gpipe", "1f1b"):
        return Fraction(p - 1, m + p - 1)
    if name == "interleaved":
        return Fraction(p - 1, v * m + p - 1)
    if name == "zb_h1":
        bubble = (p - 1) * (t["F"] + t["B"] - t["W"])
        return bubble / (bubble + m * (t["F"] + t["B"] + t["W"]))
    raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {name!r}")


def peak_activations_formula(name: str, p: int, m: int, rank: int, v: int = 1) -> int:
    """Most micro-batches (for interleaved: stage-micro-batch pairs) rank ``rank`` holds between F and B.

    GPipe: m. 1F1B and ZB-H1: min(p−rank, m). Interleaved (Megatron-LM's
    warm-up, Narayanan et al. 2021): (v−1)·p + 2(p−1−rank) forwards before the
    first backward, plus the steady state's one -- capped at v·m; in units of
    one chunk (1/v of a rank's layers), so rank 0 holds about (1 + (p−1)/(v·p))
    times 1F1B's p micro-batches' worth: the memory price of interleaving.
    """
    if name == "gpipe":
        return m
    if name in ("1f1b", "zb_h1"):
        return min(p - rank, m)
    if name == "interleaved":
        per_round = m // max(1, m // p)
        return min((v - 1) * per_round + 2 * (p - 1 - rank) + 1, v * m)
    raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
