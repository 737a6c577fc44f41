"""Checks of exercise 04 (``exercises/04_pipeline_schedule.ipynb``): write the 1F1B schedule as data.

    from coursekit.grading import check_pipeline_schedule
    check_pipeline_schedule(one_f_one_b)

The learner writes ``one_f_one_b(p, m) -> Schedule`` from a contract (the notebook states the inputs, the output,
the primitives and the properties, not the recipe): per rank, the ordered actions, F, B and the sends and
receives, all placed by hand. Four checks, each over p = 1..4 ranks and m = 1..8 micro-batches (m < p and m not
divisible by p included):

* ``valid_schedule``: :func:`~coursekit.parallel.pipeline.validate` accepts it --
  the feedback is the validator's: the rank, the first wrong action, why;
* ``bubble_equals_formula``: its unit-time plan idles (p−1)/(m+p−1) of the time,
  no more (Narayanan et al. 2021);
* ``peak_activations``: rank r never holds more than min(p−r, m) micro-batches
  between F and B -- the reason 1F1B exists (GPipe's order holds m);
* ``equals_one_process``: run by the course's executor on real ranks, the
  trained MLP equals one process (loss, every gradient, every weight).

**Only 1F1B's shape counts.** Any valid flushed schedule -- GPipe's order, the
notebook's own example -- is valid, idles (p−1)/(m+p−1) and trains right, so
``valid_schedule``, ``bubble_equals_formula`` and ``equals_one_process`` count a
case only when its schedule is 1F1B's shape: no rank holds more than
min(p−r, m) + 1 micro-batches (:data:`SLACK`). A warm-up miscounted by one is
still 1F1B's shape -- too short (none at all, or p−2−r) it keeps the bound and
loses the bubble; one too long (p−r) it keeps the bubble and holds one more,
losing ``peak_activations`` only -- while GPipe's order holds all m on every rank
and earns nothing beyond m ≤ 2, where it is the one-too-long warm-up. The
feedback says which it is ("that is GPipe's order", "one warm-up forward too many").

With one rank every order is a valid pipeline with no bubble, and with one
micro-batch every order is 1F1B's (F then B on each rank in turn: it holds one and
idles (p−1)/p, the formula's value): those cases are preconditions (they earn
nothing; wrong, they cost as much as any case).

**Only what the learner wrote.** The library's own schedules (``one_f_one_b``,
``gpipe``, ``make_schedule``, the builder they share, and ``add_communication``, which
places the messages; :mod:`coursekit.answers`) are held back while the
learner's function runs: a submission that calls one gets no schedule judged,
and each check says so once. ``Action`` and ``Schedule``, the tools the exercise
gives, stay the learner's.
The grader's own references (1F1B's plan, for the feedback) run outside that block.

**The optional stretch**, interleaved 1F1B (``interleaved_one_f_one_b(p, m, v=2)``), is graded as a bonus by
three more checks (:mod:`.pipeline_stretch`, registered last): ``interleaved_schedule``, ``interleaved_bubble`` and
``interleaved_peak``.
Their points add to the score, never to the maximum; not written, they are "not attempted" and cost nothing.
"""

from __future__ import annotations

from fractions import Fraction

from ..answers import AnswerHeldBack, held_back
from ..parallel.pipeline import Schedule, ScheduleError, one_f_one_b, plan, validate
from .pipeline_stretch import STRETCH_ANSWER, first_wait, interleaved_bubble, interleaved_peak, interleaved_schedule
from .registry import check
from .scoring import CheckFailed, NotDone, partial_credit, tails_said_once

EXERCISE = "04_pipeline_schedule"
# The checks that judge the answer; the others judge its properties and earn nothing while it is wrong.
ANSWER = ("valid_schedule", "equals_one_process")
CASES = [(p, m) for p in (2, 3, 4, 1) for m in range(1, 9)]  # the feedback starts with two ranks
SHOWN = 3  # problems spelled out per check; the rest are counted
SLACK = 1  # micro-batches over 1F1B's bound a schedule may hold and still count as 1F1B's shape
GPIPE = ("that is GPipe's order (every forward before any backward): 1F1B starts the backward of micro-batch 0 "
         "after min(p−1−r, m) warm-up forwards on rank r (none on the last rank), then alternates one forward "
         "and one backward")
ONE_TOO_MANY = ("one warm-up forward too many: rank r runs min(p−1−r, m) forwards before its first backward "
                "(the last rank none), not min(p−r, m)")
EARLIER = ("start each backward as soon as its gradient can arrive: min(p−1−r, m) warm-up forwards on rank r, "
           "then one forward and one backward")
ONE_F_ONE_B_BUSY = "1F1B keeps it busy there (p−1−r warm-up forwards, then one forward and one backward)"
INSTEAD = ("Action and Schedule are yours to use: list each rank's actions, its F and B and the SEND and RECV "
           "around them, and return them as a Schedule named \"1f1b\" with one stage per rank.")


class _LibrarysAnswer(CheckFailed):
    """The learner's function called one of the library's schedules: there is nothing of theirs to judge."""


def _build(submission, p: int, m: int) -> Schedule | str:
    """The learner's schedule for (p, m), or a sentence saying why there is none."""
    try:
        with held_back(EXERCISE):  # the learner's call only: the grader's references below run as usual
            schedule = submission.one_f_one_b(p, m)
    except NotImplementedError:
        raise NotDone("not implemented yet (NotImplementedError)") from None
    except AnswerHeldBack as refused:  # the whole submission is the library's: one sentence, no case judged
        raise _LibrarysAnswer(f"{refused} {INSTEAD}") from None
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


def _schedules(submission, ctx) -> dict[tuple[int, int], Schedule | str]:
    """Every case's schedule (or why there is none), built once per grading: every check judges the same ones."""
    return ctx.memo((EXERCISE, "schedules"), lambda: {(p, m): _build(submission, p, m) for p, m in CASES})


def _over(schedule: Schedule, p: int, m: int, slack: int) -> tuple[list[int], int] | None:
    """(each rank's peak, the first rank holding more than min(p−r, m) + slack), or None if no rank does."""
    held = plan(schedule).peak_activations
    over = [r for r in range(p) if held[r] > min(p - r, m) + slack]
    return (held, over[0]) if over else None


def _diagnosis(off: list[tuple[int, int, list[int]]]) -> str:
    """The mistake shared by the cases over 1F1B's bound, each (p, m, each rank's peak): GPipe's order, or a
    warm-up one forward too long (at m = 2 the two are the same schedule: the other cases decide)."""
    if all(held == [m] * p for p, m, held in off):
        return GPIPE
    if all(held == [min(p - r + 1, m) for r in range(p)] for p, m, held in off):
        return ONE_TOO_MANY
    return EARLIER


def _score(outcomes: list[tuple[bool, str | None]], lead: str | None = None) -> float:
    """``partial_credit`` over (is it a precondition, outcome), the feedback kept short, ``lead`` said first."""
    try:
        return partial_credit([o for pre, o in outcomes if not pre], [o for pre, o in outcomes if pre])
    except CheckFailed as failed:
        lines = str(failed).splitlines()
        more = f"\n(and {len(lines) - SHOWN} more case{'s' if len(lines) - SHOWN > 1 else ''})" \
            if len(lines) > SHOWN else ""
        shown = tails_said_once(lines[:SHOWN])  # a long explanation the cases share, said once
        raise CheckFailed("\n".join(([lead] if lead else []) + shown) + more, fraction=failed.fraction) from None


def _judged(submission, ctx, cases, precondition, judge=None, slack: int = SLACK,
            invalid: str = "not a valid schedule (see valid_schedule)") -> float:
    """Score the ``cases`` that are valid and 1F1B's shape (peak <= min(p−r, m) + ``slack``) with ``judge``.

    ``judge(schedule, p, m)``: None or what is wrong; without one, validity is what is judged and an invalid
    case says the validator's reason (with one, ``invalid``). A case over the bound is wrong, and the
    feedback starts with what such an order is (:func:`_diagnosis`).
    """
    try:
        schedules, outcomes, off = _schedules(submission, ctx), [], []
    except _LibrarysAnswer:  # said in full once, by valid_schedule
        if judge is None:
            raise
        raise CheckFailed("not judged: one_f_one_b calls coursekit's own answer to this exercise "
                          "(see valid_schedule)") from None
    for p, m in cases:
        schedule = schedules[(p, m)]
        if isinstance(schedule, str):
            wrong = schedule if judge is None else f"p={p}, m={m}: {invalid}"
        elif found := _over(schedule, p, m, slack):
            held, r = found
            off.append((p, m, held))
            wrong = (f"p={p}, m={m}: rank {r} holds {held[r]} micro-batches at its peak; 1F1B holds at most "
                     f"min(p−r, m) = {min(p - r, m)}" + (": not 1F1B's order, so it earns nothing here "
                                                          "(see peak_activations)" if slack else ""))
        else:
            wrong = judge(schedule, p, m) if judge else None
        outcomes.append((precondition(p, m), wrong))
    return _score(outcomes, _diagnosis(off) if off else None)


@check(EXERCISE, points=3)
def valid_schedule(submission, ctx):
    """validate() accepts it, p = 1..4, m = 1..8 (actions exist, in order, sends matched, no deadlock), 1F1B-shaped."""
    return _judged(submission, ctx, CASES, lambda p, m: p == 1 or m == 1)


@check(EXERCISE, points=2, requires=ANSWER)
def bubble_equals_formula(submission, ctx):
    """Its unit-time plan (F = 1, B = 2) idles exactly (p−1)/(m+p−1) of the time."""
    def judge(schedule, p, m):
        mine = plan(schedule)
        got, want = mine.bubble_fraction, Fraction(p - 1, m + p - 1)
        if got == want:
            return None
        return (f"p={p}, m={m}: the ranks idle {float(got):.1%} of the time; 1F1B idles (p−1)/(m+p−1) = "
                f"{float(want):.1%}: {first_wait(mine, plan(one_f_one_b(p, m)), ONE_F_ONE_B_BUSY)}")
    # m = 1: F then B on each rank in turn, whatever the order: every valid schedule idles (p−1)/p
    return _judged(submission, ctx, CASES, lambda p, m: p == 1 or m == 1, judge)


@check(EXERCISE, points=3, requires=ANSWER)
def peak_activations(submission, ctx):
    """Rank r holds at most min(p−r, m) micro-batches' activations (forward done, backward not yet)."""
    return _judged(submission, ctx, CASES, lambda p, m: m == 1, lambda schedule, p, m: None, slack=0)


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
    from ..measure.verify import compare

    def judge(schedule, p, m):
        try:  # the ranks run only the course's executor (which broadcasts the loss): no guard needed
            results = launch(_train_rank, p, schedule, timeout=ctx.timeout, output="ordered")
        except (LaunchTimeout, RankError) as error:
            return f"p={p}, m={m}: the executor failed on this schedule: {str(error).splitlines()[0]}"
        reference = train(0, 1, "single", model="mlp", steps=2, global_batch=12, micro_batches=m, optimizer="sgd")
        report = compare(reference["records"], results)
        return None if report.ok else f"p={p}, m={m}: {report.first}"
    return _judged(submission, ctx, ((2, 4), (3, 5)), lambda p, m: False, judge,
                   invalid="not run, not a valid schedule (see valid_schedule)")


# The optional stretch, interleaved 1F1B (pipeline_stretch): a bonus, after the exercise's own checks.
check(EXERCISE, points=2, bonus=True, timeout=90)(interleaved_schedule)
check(EXERCISE, points=1, bonus=True, requires=STRETCH_ANSWER)(interleaved_bubble)
check(EXERCISE, points=1, bonus=True, requires=STRETCH_ANSWER)(interleaved_peak)
