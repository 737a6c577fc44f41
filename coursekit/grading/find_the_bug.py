"""Checks of exercise 09 (``exercises/09_find_the_bug.ipynb``): three broken programs, each named and fixed.

    from coursekit.grading import check_find_the_bug
    check_find_the_bug(diagnosis, train_step, ring_sum, make_replica)

The notebook runs three broken programs and shows what coursekit reports: program A dies with a length error
(a conditional collective: the loss all-reduce inside ``if rank == 0:``), program B hangs on three ranks and
not on two (a ring that sends to the wrong neighbour), program C runs and is silently wrong (a forgotten
broadcast of the initial weights). For each, the learner

* names the bug: ``diagnosis = {"program_a": "B", ...}``, one of four readings of each report
  (:mod:`.find_the_bug_options`; three points when all three are right, none otherwise, and a wrong set told
  where to look in every report, whichever letters are wrong), and
* fixes the one function of it the harness calls (:mod:`.find_the_bug_programs`): three points each, one case
  per world size, graded by running the fix against a one-process reference. Program C's reference starts from
  rank 0's replica as its seed draws it (:func:`~.find_the_bug_programs.drawn_replica`), not as the fix left
  it: replicas that agree on weights no rank drew (averaged over the ranks) are told so.

Programs B and C run first on the strict simulator, inside a one-rank launch (a deadlock, or a message that
leaves the ring, is found at once, in the same words every time), then on real ranks (:func:`coursekit.launch`),
whose results are judged. Program A goes to real ranks only: its steps multiply matrices, and the simulator's
ranks are threads of one process forked from this one, where that crashed (``replica_start_rank``); its typical
mistake is a length error, which real ranks report at once too. As in every exercise, ``torch.distributed``'s
collectives and raw send/recv are switched off while the fix runs: every message goes through
``coursekit.comm`` and is counted. The feedback names the mistake ("the loss all-reduce still runs on rank 0
only", "rank r still sends to r-1"), not only the symptom.

No credit for the library's fix: ``coursekit.parallel.data.broadcast_parameters`` is ``torch.distributed``'s
broadcast (switched off), and a ``ring_sum`` whose messages carry the labels of coursekit's own collectives
(``reduce-scatter``, ``check lengths``, ...) wrote no ring.
"""

from __future__ import annotations

import functools
import math
import re

import torch

from ..launch import launch
from ..comm.simulator import Deadlock, SimulatorError, describe_waits, simulate
from ..measure.verify import compare
from ..models import tiny_mlp
from .feedback import NOT_IMPLEMENTED, explain, is_stub
from .find_the_bug_options import judge_diagnosis
from .find_the_bug_programs import (GLOBAL_BATCH, REPLICA_SEED, STEPS, data_parallel_rank, data_parallel_reference,
                                    drawn_replica, replica_rank, replica_reference, replica_start_rank,
                                    replicas_compared, ring_rank, start_difference)
from .context import NOT_SIMULABLE
from .guard import guarded
from .registry import check
from .ring_judge import ring_input
from .ring_judge import ring_sum as one_process_sum
from .scoring import CheckFailed, Deadlocked, NotDone, partial_credit

__all__ = ["EXERCISE", "INSTEAD", "WORLD_SIZES", "RING_LENGTH"]

EXERCISE = "09_find_the_bug"  # registered in registry.EXERCISES, the one place exercises are named
# Said when torch.distributed's collectives are called (they are switched off while grading):
INSTEAD = ("send with coursekit.comm.send/recv (or isend/irecv) and sum with coursekit.collectives.ring_all_reduce, "
           "as the broken programs do, so that every message is counted")
WORLD_SIZES = {"train_step": (2, 3), "ring_sum": (3, 4), "make_replica": (2, 3)}
RING_LENGTH = {3: 5, 4: 7}   # elements per rank: not a multiple of the world size


# ----------------------------------------------------------------------------- running a fix
def _simulated(rank, world_size, fn, size, args, instead, timeout, allow=()):
    """Inside a one-rank launch: ``fn`` on ``size`` simulated ranks. None, or what stopped it (picklable)."""
    try:
        simulate(guarded(fn, instead, exercise=EXERCISE, allow=allow), size, *args, timeout=timeout)
    except Deadlock as error:
        return "deadlock", error.waiting, error.finished
    except SimulatorError as error:
        return "error", error.rank, error.remote_traceback
    except TimeoutError:
        return "endless", None, None
    return None


def _said(found, size: int, timeout: float) -> str:
    """What stopped the simulated ranks, in one line that never depends on thread timing."""
    kind, first, second = found
    if kind == "endless":
        return f"world size {size}: still running after {timeout:g} s, stopped (an endless loop?)"
    if kind == "deadlock":
        returned = f" (rank{'s' * (len(second) > 1)} {', '.join(map(str, second))} had returned)" if second else ""
        return f"world size {size}: deadlock: {describe_waits(first)}{returned}"
    last = second.strip().splitlines()[-1]
    if "RingMistake: " in last:
        return last.split("RingMistake: ", 1)[1]
    explained = explain(first, second)
    if isinstance(explained, NotDone):  # a NotImplementedError the stub's shape did not give away
        raise explained
    return f"world size {size}: {explained}"


def _run(ctx, simulated, harness, size: int, fix, *args, said=None):
    """``simulated(rank, size, fix, *args)`` on the simulator (None: skip it: program A's steps multiply matrices,
    which the simulator's threads must not, see ``replica_start_rank``), then ``harness(rank, size, fix, *args)`` on
    real ranks: the real ranks' results, or a sentence saying what went wrong.

    ``said(text, size)`` may say better what the simulator or the real ranks reported (None: it cannot). A stub
    is "not done" at once; a real-rank timeout ends the check (``Deadlocked``: the grader skips the rest).
    """
    if is_stub(fix):
        raise NotDone(NOT_IMPLEMENTED)
    better = said or (lambda text, size: None)
    if simulated is not None:
        found = launch(_simulated, 1, simulated, size, (fix, *args), ctx.instead, ctx.timeout, ctx.allow,
                       timeout=ctx.timeout + 10)[0]
        if found is not None and found[0] == "error" and any(limit in found[2] for limit in NOT_SIMULABLE):
            found = None  # code the simulator cannot run (dist.broadcast, allowed in program C): real ranks judge it
        if found is not None:
            text = _said(found, size, ctx.timeout)
            return better(text, size) or text
    try:
        return ctx.launch(harness, size, fix, *args)
    except NotDone:
        raise
    except Deadlocked as stuck:
        raise Deadlocked(better(str(stuck), size) or str(stuck), waited=True) from None
    except CheckFailed as failed:
        return better(str(failed), size) or f"world size {size}: {failed}"


def _cases(name: str, judge) -> float:
    """``judge(size)`` for each world size of ``name``'s fix (None or what is wrong), scored case by case; a
    sentence two cases share is said once."""
    try:
        return partial_credit([judge(size) for size in WORLD_SIZES[name]])
    except (NotDone, Deadlocked):
        raise
    except CheckFailed as failed:
        lines = list(dict.fromkeys(str(failed).splitlines()))
        raise CheckFailed("\n".join(lines), fraction=failed.fraction) from None


# ----------------------------------------------------------------------------- the diagnosis
@check(EXERCISE, points=3)
def names_each_bug(submission, ctx):
    """diagnosis names each program's bug: the reading of its report that explains it (all three right: 3 points;
    otherwise none, and the same words whichever letters are wrong)."""
    answers = submission.diagnosis
    if not isinstance(answers, dict):
        raise NotDone("not answered yet: diagnosis = {\"program_a\": \"?\", ...}, one letter per program")
    problems, nothing = judge_diagnosis(answers)
    if nothing:
        raise NotDone("not answered yet: replace each \"?\" in diagnosis by the letter of the reading you choose")
    if problems:
        raise CheckFailed("\n".join(problems))
    return 1.0


# ----------------------------------------------------------------------------- program A
@functools.lru_cache(maxsize=1)
def _reference_a():
    return data_parallel_reference()


_LENGTHS = re.compile(r"rank (\d+) has (\d+) elements of \S+ but rank (\d+) has (\d+) elements")
_STUCK = re.compile(r"rank (\d+) (?:waits in|is busy)")


def _said_a(text: str, size: int) -> str | None:
    """Program A's mistake, from what the ranks reported: a length error between the loss's all-reduce (1 element)
    and a gradient's, or ranks stuck in a collective the others never called."""
    lengths = _LENGTHS.search(text)
    if lengths:  # the library's own hint (a gradient built differently?) is the reading this exercise warns about
        held = {int(lengths[1]): int(lengths[2]), int(lengths[3]): int(lengths[4])}  # rank -> elements
        same = ("Every rank must call every collective, in the same order: all-reduce the loss outside "
                "`if rank == 0:` and keep only the print inside")
        if min(held.values()) == 1:
            return (f"world size {size}: the loss all-reduce still runs on rank 0 only: rank 0's all-reduce of the "
                    f"loss (1 element) met the others' all-reduce of a gradient ({max(held.values())} elements), "
                    f"and the length check stopped them. {same}")
        other = next((r for r in held if r != 0), None)
        if 0 in held and other is not None and held[other] in _gradient_sizes():
            return (f"world size {size}: a collective runs on rank 0 only: rank 0 called an all-reduce of "
                    f"{held[0]} elements where another rank called one of {held[other]}, a gradient's, and the "
                    f"length check stopped them. Padding the loss to another length does not help: the ranks still "
                    f"call different collectives (the loss all-reduce inside `if rank == 0:`), and at a gradient's "
                    f"length one would be summed into the other. {same}")
        a, b = sorted(held.values())
        return (f"world size {size}: the ranks called different collectives at the same moment: an all-reduce of "
                f"{a} elements met one of {b}. A collective called on some ranks only (the loss all-reduce inside "
                f"`if rank == 0:`?) shifts every call after it. {same}")
    stuck = sorted({int(r) for r in _STUCK.findall(text)})
    if "still running after" in text and stuck and len(stuck) < size:
        ranks = ", ".join(map(str, stuck))
        return (f"{text}\nThe other ranks had returned: a collective still runs on rank {ranks} only (the loss "
                f"all-reduce?). Every rank must call every collective; keep only the print inside `if rank == 0:`")
    return None


@functools.lru_cache(maxsize=1)
def _gradient_sizes() -> frozenset[int]:
    """The element counts of program A's gradients (its model's parameters): any other length is the loss's."""
    return frozenset(p.numel() for p in tiny_mlp(seed=0).parameters())


def _loss_problem(size, results, step) -> str | None:
    """What ``train_step`` returned at ``step``, against one process's loss of the whole batch (the first rank off)."""
    expected = _reference_a()[step]["loss"]
    for rank, result in enumerate(results):
        got = result["returned"][step]
        if not isinstance(got, float):
            return (f"world size {size}: train_step returned {got} on rank {rank}: return the global batch's mean "
                    f"loss as a float (mean_loss.item())")
        if math.isclose(got, expected, rel_tol=1e-4, abs_tol=1e-6):
            continue
        where = f"world size {size}, step {step}: rank {rank} returned {got:.6g}"
        if math.isclose(got, size * expected, rel_tol=1e-4):
            return (f"{where}, the sum of the ranks' losses, not their mean ({expected:.6g}): divide by world_size "
                    f"after the all-reduce, on every rank")
        if math.isclose(got, result["own"][step], rel_tol=1e-6):
            return (f"{where}, its own loss, not the global batch's mean ({expected:.6g}): every rank must "
                    f"all-reduce the loss (and only rank 0 print it)")
        return f"{where}; one process's loss of the whole batch is {expected:.6g}"
    return None


def _judge_a(ctx, submission, size) -> str | None:
    _reference_a()  # here first: the first optimiser imports torch._dynamo (seconds), once, not in every rank
    results = _run(ctx, None, data_parallel_rank, size, submission.train_step, STEPS, GLOBAL_BATCH, True,
                   said=_said_a)
    if isinstance(results, str):
        return results
    first_loss = _loss_problem(size, results, 0)
    if first_loss:
        return first_loss
    report = compare(_reference_a(), [r["records"] for r in results], check_output=False)
    wrong = [d for d in report.divergences if d.kind != "loss"]
    if wrong:
        return (f"world size {size}: {wrong[0]}: the gradients must still be averaged on every rank before "
                f"optimizer.step(), as the broken program did")
    return _loss_problem(size, results, len(results[0]["returned"]) - 1)


@check(EXERCISE, points=3, timeout=20)
def program_a_fixed(submission, ctx):
    """train_step on 2 and 3 ranks: no rank hangs or dies, every rank returns the global batch's mean loss, and
    2 steps of training equal one process on the whole batch."""
    return _cases("train_step", lambda size: _judge_a(ctx, submission, size))


# ----------------------------------------------------------------------------- program B
def _ring_problem(size, rank, got) -> str | None:
    numel = RING_LENGTH[size]
    expected = one_process_sum(size, numel, torch.float32)
    if not isinstance(got, torch.Tensor):
        return f"world size {size}: ring_sum returned {got} on rank {rank}: return the sum, a tensor"
    if got.shape != expected.shape:
        return (f"world size {size}: ring_sum returned a tensor of shape {tuple(got.shape)} on rank {rank}, not "
                f"{tuple(expected.shape)}: the sum has the shape of each rank's tensor")
    got = got.double()
    if torch.equal(got, expected):
        return None
    mine, left = (ring_input(r % size, numel, torch.float32).double() for r in (rank, rank - 1))
    where = f"world size {size}: rank {rank}'s sum"
    if torch.equal(got, mine + (size - 1) * left):
        return (f"{where} holds its left neighbour's tensor {size - 1} times: each step must pass on what "
                f"arrived (passing = arriving), not the same tensor again")
    for missing in range(size):
        if torch.equal(got, expected - ring_input(missing, numel, torch.float32).double()):
            return (f"{where} lacks rank {missing}'s tensor: the ring takes world_size - 1 steps, one per other "
                    f"rank")
    if torch.equal(got, expected + mine):
        return f"{where} counts its own tensor twice (total starts as it, and it comes back round the ring)"
    return f"{where} is {got.tolist()}, one process's sum {expected.tolist()}"


def _judge_b(ctx, submission, size) -> str | None:
    results = _run(ctx, ring_rank, ring_rank, size, submission.ring_sum, RING_LENGTH[size])
    if isinstance(results, str):
        return results
    for result in results:
        if result["phases"]:
            return (f"ring_sum calls one of coursekit's own collectives (its messages are labelled "
                    f"{', '.join(repr(p) for p in result['phases'])}): it earns nothing here. Fix the ring loop "
                    f"of broken_ring_sum itself")
    return next((p for rank, r in enumerate(results) if (p := _ring_problem(size, rank, r["total"]))), None)


@check(EXERCISE, points=3, timeout=20)
def program_b_fixed(submission, ctx):
    """ring_sum on 3 and 4 ranks (where the wrong neighbour hangs; 2 ranks hide it): every rank ends with the
    sum of all ranks' tensors, passed round the ring."""
    return _cases("ring_sum", lambda size: _judge_b(ctx, submission, size))


# ----------------------------------------------------------------------------- program C
_SENDING = re.compile(r"rank 0 waits in send to rank (\d+)")


def _said_c(text: str, size: int) -> str | None:
    """Rank 0 stuck sending its weights: the rank it sends to never receives them."""
    waiting = _SENDING.search(text)
    if "deadlock" in text and waiting:
        return (f"{text}: rank {waiting[1]} never receives what rank 0 sends it. Every rank but rank 0 must "
                f"receive each parameter (comm.recv(p, src=0)), in the order rank 0 sends them")
    return None


def _judge_c(ctx, submission, size) -> str | None:
    results = _run(ctx, replica_start_rank, replica_rank, size, submission.make_replica, said=_said_c)
    if isinstance(results, str):
        return results
    drawn = [tuple(r["drawn"][0]) for r in results]
    alike = [rank for rank in range(1, size) if drawn[rank] == drawn[0]]
    if alike:
        return (f"world size {size}: rank {alike[0]} drew the same samples as rank 0: make_replica gave every rank "
                f"the same random stream (one seed for all), so the ranks train on copies of one batch. Each rank's "
                f"samples come from its own seed, 1000 + rank: seed it after the weights are drawn, or keep it and "
                f"send (or broadcast) rank 0's weights to the others")
    start = replicas_compared(results)
    if not start.ok:
        d = start.first
        return (f"world size {size}: rank {d.rank} starts from weights of its own: its {d.name!r} differs from "
                f"rank 0's before the first step (expected {d.expected:.6g}, got {d.got:.6g}). Rank 0 must send "
                f"every parameter to every other rank, 1 to world_size - 1, before training")
    moved = start_difference(drawn_replica(0), results[0]["initial"])
    if moved is not None:
        name, expected, got = moved
        return (f"world size {size}: the replicas start equal, but rank 0's weights are not the ones its seed "
                f"({REPLICA_SEED}) draws: its {name!r} is {got:.6g} where that seed draws {expected:.6g}. They were "
                f"averaged over the ranks, drawn from another seed, or changed some other way. Start every replica "
                f"from rank 0's own: send them, broadcast them, or draw them on every rank from rank 0's seed "
                f"({REPLICA_SEED}), then seed each rank's own stream for its samples")
    report = compare(replica_reference(results[0]["initial"], [r["drawn"] for r in results]),
                     [r["records"] for r in results], check_output=False)
    return None if report.ok else f"world size {size}: {report.first}"


@check(EXERCISE, points=3, timeout=20, allows=("broadcast",))
def program_c_fixed(submission, ctx):
    """make_replica on 2 and 3 ranks: every replica starts from rank 0's weights (the ones its seed draws: sent,
    broadcast as chapter 09 does, or drawn alike on every rank), each rank still draws its own samples, and 2 steps
    of training equal one process."""
    return _cases("make_replica", lambda size: _judge_c(ctx, submission, size))
