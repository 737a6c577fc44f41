"""Exercise 04's optional stretch, graded as a bonus: interleaved 1F1B (Narayanan et al. 2021, section 2.2.2).

    check_pipeline_schedule(one_f_one_b, interleaved_one_f_one_b)

The learner writes ``interleaved_one_f_one_b(p, m, v=2) -> Schedule`` from the notebook's contract: rank r holds
the v stages r, r+p, …, r+(v−1)p, every micro-batch passes every rank v times, and the schedule is the plan that
:func:`~coursekit.parallel.pipeline.interleaved_1f1b` builds, for m = p and m = 2p (the sizes that plan takes).
Three bonus checks (registered by :mod:`.pipeline_schedule`, after the exercise's own), each over p = 1..4 and
m = p, 2p with v = 2:

* ``interleaved_schedule`` (the stretch's answer): a ``Schedule`` of p ranks, m micro-batches and v stages per
  rank that :func:`~coursekit.parallel.pipeline.validate` accepts, and run by the course's executor (p = 2,
  m = 4: four stages of a four-layer MLP) one step trains exactly as one process does;
* ``interleaved_bubble`` and ``interleaved_peak`` (its properties, scored only while the answer is right): on the
  unit-time clock (F = 1, B = 2) the ranks idle exactly (p−1)/(v·m+p−1) of the step, the plan's bubble; and rank
  r never holds more than min((v−1)·p + 2(p−1−r) + 1, v·m) (stage, micro-batch) pairs between F and B, Megatron-LM's
  warm-up plus one. As in the exercise the bubble alone cannot tell interleaved 1F1B from interleaved GPipe (every
  forward first idles as little): the memory bound does.

While the function is not written (NotImplementedError, or not passed) they are "not attempted": a bonus never
lowers the score. The library's schedules are held back while the learner's function runs, as in the exercise.
With one rank every valid order idles nothing: p = 1 cases are preconditions.
"""

from __future__ import annotations

from ..answers import AnswerHeldBack, held_back
from ..parallel.pipeline import (Schedule, ScheduleError, bubble_formula, interleaved_1f1b, peak_activations_formula,
                                 plan, validate)
from .scoring import CheckFailed, NotDone, partial_credit, tails_said_once

__all__ = ["LibrarysStretch", "STRETCH", "STRETCH_ANSWER", "V", "CASES", "interleaved_schedule", "interleaved_bubble", "interleaved_peak",
           "first_wait"]

EXERCISE = "04_pipeline_schedule"
STRETCH = "interleaved_one_f_one_b"  # the learner's function, an optional part of the exercise
STRETCH_ANSWER = ("interleaved_schedule",)
V = 2
CASES = [(p, m) for p in (2, 3, 4, 1) for m in (p, 2 * p)]
V_IGNORED = (f"v is ignored: with v = {V} rank r holds the {V} stages r and r+p (n_stages = {V}·p), every "
             "micro-batch passes every rank twice; a Schedule with one stage per rank is 1F1B, not interleaved")
SHOWN = 3  # lines of feedback spelled out per check; the rest are counted
NOT_JUDGED = "not judged: it is not a valid schedule (see interleaved_schedule)"
GPIPE_ORDER = ("that is GPipe's order over the stages (every forward before any backward): start the backwards once "
               "the pipe is full, then alternate one forward and one backward")
FILL_FIRST = ("too many forwards before the first backward: a rank sends p micro-batches through one of its "
              "stages, then p through the next, and starts backwards once the pipe is full")
HOW = ("interleaved 1F1B keeps it busy there, with (v−1)·p + 2(p−1−r) warm-up forwards on rank r, p micro-batches "
       "through one of its stages and then p through the next, then one forward and one backward")


class LibrarysStretch(CheckFailed):
    """The learner's stretch called one of the library's schedules: there is nothing of theirs to judge."""


def _build(submission, p: int, m: int) -> Schedule | str:
    """The learner's interleaved schedule for (p, m, V), or a sentence saying why there is none."""
    fn = getattr(submission, STRETCH, None)
    if fn is None:
        raise NotDone(f"{STRETCH} not passed")
    try:
        with held_back(EXERCISE):
            schedule = fn(p, m, V)
    except AnswerHeldBack as refused:
        raise LibrarysStretch(str(refused)) from None
    except NotImplementedError:
        raise  # not written yet: the grader says "not attempted"
    except Exception as error:  # the learner's code may fail in any way: one case lost
        return f"p={p}, m={m}: {STRETCH} raised {type(error).__name__}: {error}"
    if not isinstance(schedule, Schedule):
        return f"p={p}, m={m}: {STRETCH} returned {type(schedule).__name__}, not a Schedule"
    got = (schedule.n_ranks, schedule.n_micro_batches, schedule.stages_per_rank)
    if got != (p, m, V):
        return (f"p={p}, m={m}, v={V}: the Schedule says n_ranks={got[0]}, n_micro_batches={got[1]}, "
                f"stages_per_rank={got[2]}; it should be {p}, {m}, {V}")
    try:
        validate(schedule)
    except ScheduleError as error:
        return f"p={p}, m={m}, v={V}: {error}"
    return schedule


def _schedules(submission, ctx) -> dict:
    return ctx.memo((EXERCISE, "interleaved"), lambda: {(p, m): _build(submission, p, m) for p, m in CASES})


def _said_once(outcomes: list[tuple[bool, str | None]], lead: str | None = None) -> float:
    """Partial credit over (is it a precondition, outcome): ``lead`` first, a shared explanation said once, at most
    :data:`SHOWN` cases spelled out and the rest counted."""
    try:
        return partial_credit([o for pre, o in outcomes if not pre], [o for pre, o in outcomes if pre])
    except CheckFailed as failed:
        lines = tails_said_once(str(failed).splitlines())  # a long explanation the cases share, said once
        more = len(lines) - SHOWN
        lines = lines[:SHOWN] + ([f"(and {more} more line{'s' if more > 1 else ''})"] if more > 0 else [])
        raise CheckFailed("\n".join(([lead] if lead else []) + lines), failed.fraction) from None


def _lead(schedules: dict) -> str | None:
    """The mistake to name first: every wrong case a one-stage-per-rank schedule is v ignored."""
    wrong = [s for s in schedules.values() if isinstance(s, str)]
    if wrong and all("stages_per_rank=1;" in s for s in wrong):
        return V_IGNORED
    return None


def _four_layers():
    from ..models import tiny_mlp
    return tiny_mlp(seed=0, n_layers=4)


def _train_rank(rank, world_size, schedule):
    import torch

    from ..models import TeacherData
    from ..train import train
    torch.set_num_threads(1)
    return train(rank, world_size, "pipeline", model=_four_layers, data=TeacherData(seed=0), steps=2,
                 global_batch=12, micro_batches=schedule.n_micro_batches, optimizer="sgd",
                 schedule=schedule)["records"]


def _trains_right(schedule: Schedule, p: int, m: int, timeout: float) -> str | None:
    from ..launch import LaunchTimeout, RankError, launch
    from ..measure.verify import compare
    from ..models import TeacherData
    from ..train import train

    try:  # the ranks run only the course's executor: no guard needed
        results = launch(_train_rank, p, schedule, timeout=timeout, output="ordered")
    except (LaunchTimeout, RankError) as error:
        return f"p={p}, m={m}: the executor failed on this schedule: {str(error).splitlines()[0]}"
    reference = train(0, 1, "single", model=_four_layers, data=TeacherData(seed=0), steps=2, global_batch=12,
                      micro_batches=m, optimizer="sgd")
    report = compare(reference["records"], results)
    return None if report.ok else f"p={p}, m={m}: one step on the executor differs from one process: {report.first}"


def interleaved_schedule(submission, ctx):
    """Bonus: interleaved 1F1B (v = 2) is a valid schedule, p = 1..4, m = p and 2p; on the executor (p = 2, m = 4)
    it trains as one process does."""
    schedules = _schedules(submission, ctx)
    outcomes = [(p == 1, schedules[(p, m)] if isinstance(schedules[(p, m)], str) else None) for p, m in CASES]
    run = schedules[(2, 4)]
    outcomes.append((False, "p=2, m=4: not run on the executor, not a valid schedule" if isinstance(run, str)
                     else _trains_right(run, 2, 4, ctx.timeout)))
    return _said_once(outcomes, _lead(schedules))


def _judged(submission, ctx, judge, lead=lambda: None) -> float:
    """Score each valid case with ``judge(schedule, p, m)`` (None or what is wrong); an invalid case is wrong.
    ``lead()``, called after the cases are judged: the mistake they share, said first (or None)."""
    try:
        schedules = _schedules(submission, ctx)
    except LibrarysStretch:  # said in full once, by interleaved_schedule
        raise CheckFailed(f"not judged: {STRETCH} calls coursekit's own schedules (see interleaved_schedule)") from None
    outcomes = [(p == 1, f"p={p}, m={m}: {NOT_JUDGED}" if isinstance(schedules[(p, m)], str)
                 else judge(schedules[(p, m)], p, m)) for p, m in CASES]
    return _said_once(outcomes, lead())


def interleaved_bubble(submission, ctx):
    """Bonus: its unit-time plan (F = 1, B = 2) idles exactly (p−1)/(v·m+p−1) of the time, p = 2..4, m = p and 2p."""
    def judge(schedule, p, m):
        mine, want = plan(schedule), bubble_formula("interleaved", p, m, V)
        return None if mine.bubble_fraction == want else (
            f"p={p}, m={m}: the ranks idle {float(mine.bubble_fraction):.1%} of the time; interleaved 1F1B idles "
            f"(p−1)/(v·m+p−1) = {float(want):.1%}: {first_wait(mine, plan(interleaved_1f1b(p, m, V)), HOW)}")
    return _judged(submission, ctx, judge)


def interleaved_peak(submission, ctx):
    """Bonus: rank r holds at most min((v−1)·p + 2(p−1−r) + 1, v·m) (stage, micro-batch) pairs between F and B."""
    every_forward_first = []  # per case over the bound: does every rank hold all v·m at once (GPipe's order)?

    def judge(schedule, p, m):
        held = plan(schedule).peak_activations
        bound = [peak_activations_formula("interleaved", p, m, r, V) for r in range(p)]
        over = [r for r in range(p) if held[r] > bound[r]]
        if not over:
            return None
        every_forward_first.append(held == [V * m] * p)
        return (f"p={p}, m={m}: rank {over[0]} holds {held[over[0]]} (stage, micro-batch) pairs at its peak; "
                f"interleaved 1F1B holds at most {bound[over[0]]}")

    def lead():
        return None if not every_forward_first else GPIPE_ORDER if all(every_forward_first) else FILL_FIRST
    return _judged(submission, ctx, judge, lead)


def first_wait(mine, best, how: str) -> str:
    """The earliest moment a rank of plan ``mine`` is idle while the same rank of plan ``best`` works, and ``how``
    ``best`` keeps it busy."""
    waits = []
    for rank, spans in enumerate(mine.spans):
        busy = [(start, end) for _, start, end in best.spans[rank]]
        idle_from = 0
        for action, start, end in spans:
            if start > idle_from and any(a < start and idle_from < b for a, b in busy):
                waits.append((idle_from, rank, start, action))
                break
            idle_from = end
    if not waits:
        return "a rank waits where it could already work"
    at, rank, until, action = min(waits)
    return f"rank {rank} waits from t={at} to t={until} (F = 1, B = 2) before {action}, while {how}"
