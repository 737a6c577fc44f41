"""Checks of exercise 04 (``exercises/04_pipeline_schedule.ipynb``): write the 1F1B schedule as data.

    from coursekit.grading import check_pipeline_schedule
    check_pipeline_schedule(one_f_one_b)

The learner writes ``one_f_one_b(p, m) -> Schedule``: per rank, the ordered
actions (F, B, and the sends and receives, by hand or through
:func:`coursekit.parallel.pipeline.add_communication`). Four checks, each over
p = 1..4 ranks and m = 1..8 micro-batches (m < p and m not divisible by p included):

* ``valid_schedule``: :func:`~coursekit.parallel.pipeline.validate` accepts it --
  the feedback is the validator's: the rank, the first wrong action, why;
* ``bubble_equals_formula``: its unit-time plan idles (p−1)/(m+p−1) of the time,
  no more (Narayanan et al. 2021);
* ``peak_activations``: rank r never holds more than min(p−r, m) micro-batches
  between F and B -- the reason 1F1B exists (GPipe's order holds m);
* ``equals_one_process``: run by the course's executor on real ranks, the
  trained MLP equals one process (loss, every gradient, every weight).

With one rank every order is a valid pipeline with no bubble, and with one
micro-batch every order holds one and idles (p−1)/p, the formula's value: those
cases are preconditions (they earn nothing; wrong, they cost as much as any case).
"""

from __future__ import annotations

from fractions import Fraction

from ..parallel.pipeline import Schedule, ScheduleError, one_f_one_b, plan, validate
from .registry import check
from .scoring import CheckFailed, NotDone, partial_credit

EXERCISE = "04_pipeline_schedule"
CASES = [(p, m) for p in (2, 3, 4, 1) for m in range(1, 9)]  # the feedback starts with two ranks
SHOWN = 3  # problems spelled out per check; the rest are counted


def _build(submission, p: int, m: int) -> Schedule | str:
    """The learner's schedule for (p, m), or a sentence saying why there is none."""
    try:
        schedule = submission.one_f_one_b(p, m)
    except NotImplementedError:
        raise NotDone("not implemented yet (NotImplementedError)") from None
    except Exception as error:  # the learner's code may fail in any way: one case lost, not the notebook
        return f"p={p}, m={m}: one_f_one_b raised {type(error).__name__}: {error}"
    if not isinstance(schedule, Schedule):
        return f"p={p}, m={m}: one_f_one_b returned {type(schedule).__name__}, not a Schedule"
    got = (schedule.n_ranks, schedule.n_micro_batches, schedule.stages_per_rank)
    if got != (p, m, 1):
        return (f"p={p}, m={m}: the Schedule says n_ranks={got[0]}, n_micro_batches={got[1]}, "
                f"stages_per_rank={got[2]}; it should be {p}, {m}, 1")
    try:
        validate(schedule)
    except ScheduleError as error:
        return f"p={p}, m={m}: {error}"
    return schedule


def _score(outcomes: list[tuple[bool, str | None]]) -> float:
    """``partial_credit`` over (is it a precondition, outcome), with the feedback kept short."""
    try:
        return partial_credit([o for pre, o in outcomes if not pre], [o for pre, o in outcomes if pre])
    except CheckFailed as failed:
        lines = str(failed).splitlines()
        more = f"\n(and {len(lines) - SHOWN} more case{'s' if len(lines) - SHOWN > 1 else ''})" \
            if len(lines) > SHOWN else ""
        raise CheckFailed("\n".join(lines[:SHOWN]) + more, fraction=failed.fraction) from None


def _per_case(submission, judge, precondition) -> float:
    outcomes = []
    for p, m in CASES:
        schedule = _build(submission, p, m)
        wrong = (f"p={p}, m={m}: not a valid schedule (see valid_schedule)" if isinstance(schedule, str)
                 else judge(schedule, p, m))
        outcomes.append((precondition(p, m), wrong))
    return _score(outcomes)


@check(EXERCISE, points=3)
def valid_schedule(submission, ctx):
    """validate() accepts it for p = 1..4, m = 1..8: every action exists, in order, sends matched, no deadlock."""
    return _score([(p == 1, s if isinstance(s, str) else None)
                   for p, m in CASES for s in [_build(submission, p, m)]])


@check(EXERCISE, points=2)
def bubble_equals_formula(submission, ctx):
    """Its unit-time plan (F = 1, B = 2) idles exactly (p−1)/(m+p−1) of the time."""
    def judge(schedule, p, m):
        mine = plan(schedule)
        got, want = mine.bubble_fraction, Fraction(p - 1, m + p - 1)
        if got == want:
            return None
        return (f"p={p}, m={m}: the ranks idle {float(got):.1%} of the time; 1F1B idles (p−1)/(m+p−1) = "
                f"{float(want):.1%}: {_first_wait(mine, plan(one_f_one_b(p, m)))}")
    # m = 1: F then B on each rank in turn, whatever the order: every valid schedule idles (p−1)/p
    return _per_case(submission, judge, lambda p, m: p == 1 or m == 1)


def _first_wait(mine, best) -> str:
    """The earliest moment a rank of ``mine`` is idle while the same rank of 1F1B's plan ``best`` works."""
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
    return (f"rank {rank} waits from t={at} to t={until} (F = 1, B = 2) before {action}, while 1F1B keeps it "
            "busy there (p−1−r warm-up forwards, then one forward and one backward)")


@check(EXERCISE, points=3)
def peak_activations(submission, ctx):
    """Rank r holds at most min(p−r, m) micro-batches' activations (forward done, backward not yet)."""
    def judge(schedule, p, m):
        held = plan(schedule).peak_activations
        over = [r for r in range(p) if held[r] > min(p - r, m)]
        if not over:
            return None
        r = over[0]
        gpipe = " — that is GPipe's order (every forward before any backward)" if held == [m] * p else ""
        return (f"p={p}, m={m}: rank {r} holds {held[r]} micro-batches at its peak; 1F1B holds at most "
                f"min(p−r, m) = {min(p - r, m)}{gpipe}: start each backward as soon as its gradient can "
                f"arrive, after p−1−r warm-up forwards")
    return _per_case(submission, judge, lambda p, m: m == 1)


def _train_rank(rank, world_size, schedule):
    import torch

    from ..train import train
    torch.set_num_threads(1)
    return train(rank, world_size, "pipeline", model="mlp", steps=2, global_batch=12,
                 micro_batches=schedule.n_micro_batches, optimizer="sgd", schedule=schedule)["records"]


@check(EXERCISE, points=2, timeout=90)
def equals_one_process(submission, ctx):
    """Run by the course's executor (p = 2, m = 4 and p = 3, m = 5), training equals one process."""
    from ..launch import LaunchTimeout, RankError, launch
    from ..train import train
    from ..verify import compare

    outcomes = []
    for p, m in ((2, 4), (3, 5)):
        schedule = _build(submission, p, m)
        if isinstance(schedule, str):
            outcomes.append(f"p={p}, m={m}: not run, not a valid schedule (see valid_schedule)")
            continue
        try:  # the ranks run only the course's executor (which broadcasts the loss): no guard needed
            results = launch(_train_rank, p, schedule, timeout=ctx.timeout, output="ordered")
        except (LaunchTimeout, RankError) as error:
            outcomes.append(f"p={p}, m={m}: the executor failed on this schedule: {str(error).splitlines()[0]}")
            continue
        reference = train(0, 1, "single", model="mlp", steps=2, global_batch=12, micro_batches=m, optimizer="sgd")
        report = compare(reference["records"], results)
        outcomes.append(None if report.ok else f"p={p}, m={m}: {report.first}")
    return partial_credit(outcomes)
