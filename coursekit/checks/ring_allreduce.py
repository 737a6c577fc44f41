"""Checks of exercise 01 (``exercises/01_ring_allreduce.ipynb``): the ring's reduce-scatter and all-gather.

    from coursekit import grading
    grading.check_ring_all_reduce(my_reduce_scatter, my_all_gather)

The learner writes ``reduce_scatter(tensor, group=None) -> owned segment`` and
``all_gather(segment, out, group=None)`` with ``coursekit.comm``, following the
schedule of :mod:`coursekit.collectives` (rank r ends owning segment (r+1) % G).
The checks run them on real ranks, compare with exact sums and count every
transfer; the feedback says which world size, length, rank and segment went wrong.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .. import comm, grading
from ..collectives import owned_segment, ring_traffic, segment_bounds
from ..grading import CheckFailed

EXERCISE = "01_ring_allreduce"  # registered in grading.EXERCISE_MODULES, the one place exercises are named
RING = EXERCISE  # its older name, as grading.RING (not collectives.RING, the ring's Collectives)
F32 = torch.float32


def check_ring_all_reduce(reduce_scatter: Callable, all_gather: Callable, **options: Any) -> grading.Report:
    """Grade chapter 01's exercise: ``grading.check_ring_all_reduce(my_reduce_scatter, my_all_gather)``."""
    return grading.grade(EXERCISE, reduce_scatter=reduce_scatter, all_gather=all_gather, **options)


# ----------------------------------------------------------------------------- inputs and exact answers
def _ring_input(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Small integers: every sum is exact in every dtype, so answers compare exactly."""
    generator = torch.Generator().manual_seed(7919 * rank + numel)
    return torch.randint(-8, 9, (numel,), generator=generator).to(dtype)


def _ring_sum(world_size: int, numel: int, dtype: torch.dtype, ranks=None) -> torch.Tensor:
    """The exact sum of the inputs of ``ranks`` (default: all of them), in float64."""
    total = torch.zeros(numel, dtype=torch.float64)
    for r in (range(world_size) if ranks is None else ranks):
        total += _ring_input(r, numel, dtype).double()
    return total


# ----------------------------------------------------------------------------- what runs on each rank
def _rs_rank(rank, world_size, reduce_scatter, cases):
    out = []
    for numel, dtype in cases:
        with comm.record() as traffic:
            segment = reduce_scatter(_ring_input(rank, numel, dtype))
        out.append((segment.detach().clone() if isinstance(segment, torch.Tensor) else repr(type(segment)), traffic))
    return out


def _ag_rank(rank, world_size, all_gather, cases):
    """Start each rank from its owned segment, already summed, the rest zeros; all_gather fills the rest."""
    out = []
    for numel, dtype in cases:
        full = _ring_sum(world_size, numel, dtype).to(dtype)
        start, stop = segment_bounds(numel, world_size)[owned_segment(rank, world_size)]
        target = torch.zeros(numel, dtype=dtype)
        target[start:stop] = full[start:stop]
        with comm.record() as traffic:
            all_gather(target[start:stop], target)
        out.append((target, traffic))
    return out


def _both_rank(rank, world_size, reduce_scatter, all_gather, numel, dtype):
    x = _ring_input(rank, numel, dtype)
    with comm.record() as traffic:
        mine = reduce_scatter(x)
        all_gather(mine, x)
    return x, traffic


def _random_all_reduce(rank, world_size, reduce_scatter, all_gather, numel):
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    all_gather(reduce_scatter(x), x)
    return x


# ----------------------------------------------------------------------------- judging one case
def _segment_feedback(rank: int, world_size: int, numel: int, dtype, got) -> str | None:
    """None if ``got`` is rank's fully reduced owned segment, else what is wrong with it."""
    where = f"world size {world_size}, length {numel}, {str(dtype).replace('torch.', '')}, rank {rank}"
    own = owned_segment(rank, world_size) if world_size > 1 else 0
    bounds = segment_bounds(numel, world_size) if world_size > 1 else [(0, numel)]
    start, stop = bounds[own]
    full = _ring_sum(world_size, numel, dtype)
    if isinstance(got, str):
        return f"{where}: returned {got}, expected a tensor (the view of segment {own})"
    got = got.reshape(-1).double()
    if got.numel() == stop - start and torch.equal(got, full[start:stop]):
        return None
    expected = f"segment {own} = elements {start}:{stop} ({stop - start} of them), summed over all {world_size} ranks"
    for k, (a, b) in enumerate(bounds):
        if k != own and b - a == got.numel() and b > a and torch.equal(got, full[a:b]):
            return f"{where}: returned the complete segment {k}, but the ring leaves rank r owning segment (r+1) % G; expected {expected}"
    if got.numel() != stop - start:
        hint = " (the whole tensor?)" if got.numel() == numel and world_size > 1 else ""
        return f"{where}: returned {got.numel()} elements{hint}; expected {expected}"
    mine = _ring_input(rank, numel, dtype).double()[start:stop]
    if torch.equal(got, mine):
        return f"{where}: segment {own} is unchanged: nothing was added into it; expected {expected}"
    for count in range(2, world_size):  # a partial sum along the ring: too few steps?
        ranks = [(rank + 1 - i) % world_size for i in range(count)]
        if torch.equal(got, _ring_sum(world_size, numel, dtype, ranks)[start:stop]):
            return (f"{where}: segment {own} holds the sum of only {count} of {world_size} ranks "
                    f"(a ring needs G-1 = {world_size - 1} steps); expected {expected}")
    wrong = int((got != full[start:stop]).sum())
    return f"{where}: segment {own} is wrong at {wrong} of {stop - start} elements; expected {expected}"


def _judge_reduce_scatter(world_size: int, numel: int, dtype, results: list) -> str | None:
    """The first rank whose returned segment is wrong (and how many more are), or None."""
    bad = [f for f in (_segment_feedback(r, world_size, numel, dtype, results[r][0]) for r in range(world_size)) if f]
    if not bad:
        return None
    return bad[0] + (f" (and {len(bad) - 1} more ranks)" if len(bad) > 1 else "")


def _judge_all_gather(world_size: int, numel: int, dtype, results: list) -> str | None:
    """The first rank that does not hold every segment of the sum after all_gather, or None."""
    full = _ring_sum(world_size, numel, dtype)
    bounds = segment_bounds(numel, world_size)
    for rank, (got, _) in enumerate(results):
        got = got.double()
        wrong = [k for k, (a, b) in enumerate(bounds) if not torch.equal(got[a:b], full[a:b])]
        if wrong:
            a, b = bounds[wrong[0]]
            return (f"world size {world_size}, length {numel}: after all_gather rank {rank} has wrong values in "
                    f"segment{'s' if len(wrong) > 1 else ''} {', '.join(map(str, wrong))} "
                    f"(segment k = elements {a}:{b} for k = {wrong[0]})")
    return None


# ----------------------------------------------------------------------------- scoring many cases
def _per_case(ctx, rank_fn, world_size, learner_fn, cases):
    """Run all cases in one launch; if that crashes, one launch per case, so a crash costs only its case.

    Yields ``(numel, dtype, per-rank results or the CheckFailed)``.
    """
    results = ctx.launch_case(rank_fn, world_size, learner_fn, cases)
    if not isinstance(results, CheckFailed):
        for index, (numel, dtype) in enumerate(cases):
            yield numel, dtype, [r[index] for r in results]
        return
    for numel, dtype in cases:
        results = ctx.launch_case(rank_fn, world_size, learner_fn, [(numel, dtype)])
        yield numel, dtype, results if isinstance(results, CheckFailed) else [r[0] for r in results]


def _score(ctx, plan, rank_fn, learner_fn, judge) -> float:
    """Every case of ``plan`` (``[(world size, [(length, dtype), ...]), ...]``), judged; credit per case right."""
    def outcomes():
        for world_size, cases in plan:
            for numel, dtype, results in _per_case(ctx, rank_fn, world_size, learner_fn, cases):
                if isinstance(results, CheckFailed):
                    yield f"world size {world_size}, length {numel}: {results}"
                else:
                    yield judge(world_size, numel, dtype, results)
    return grading.partial_credit(outcomes())


def _score_reduce_scatter(submission, ctx, plan) -> float:
    return _score(ctx, plan, _rs_rank, submission.reduce_scatter, _judge_reduce_scatter)


def _score_all_gather(submission, ctx, plan) -> float:
    return _score(ctx, plan, _ag_rank, submission.all_gather, _judge_all_gather)


# ----------------------------------------------------------------------------- the checks
@grading.check(EXERCISE, points=3)
def reduce_scatter_correct(submission, ctx):
    """reduce_scatter returns each rank's fully reduced segment: G = 2, 3, 4; lengths divisible or not."""
    return _score_reduce_scatter(submission, ctx, [(2, [(8, F32), (9, F32)]), (3, [(12, F32), (10, F32)]),
                                                  (4, [(16, F32), (10, F32)])])


@grading.check(EXERCISE, points=2)
def all_gather_correct(submission, ctx):
    """all_gather gives every rank every segment: G = 2, 3, 4."""
    return _score_all_gather(submission, ctx, [(2, [(8, F32), (9, F32)]), (3, [(10, F32)]), (4, [(10, F32)])])


@grading.check(EXERCISE, points=1)
def all_reduce_bit_identical(submission, ctx):
    """reduce_scatter then all_gather = all-reduce, with the same bits on every rank (G = 4, length 1001)."""
    world_size, numel = 4, 1001
    results = ctx.launch(_both_rank, world_size, submission.reduce_scatter, submission.all_gather, numel, F32)
    full = _ring_sum(world_size, numel, F32)
    for rank, (x, _) in enumerate(results):
        if not torch.equal(x.double(), full):
            raise CheckFailed(f"world size {world_size}, length {numel}: rank {rank} does not hold the sum after "
                              f"reduce_scatter + all_gather")
    random = ctx.launch(_random_all_reduce, world_size, submission.reduce_scatter, submission.all_gather, numel)
    if any(not torch.equal(r, random[0]) for r in random):
        raise CheckFailed("ranks disagree in the last bits: each segment must be summed in one order, along the "
                          "ring, then copied; data-parallel replicas would drift apart")


def _traffic_problems(world_size: int, numel: int, traffic: comm.Traffic, correct: bool) -> list[str]:
    """What in one all-reduce's recorded traffic is not a ring: strangers, big messages, the wrong total."""
    where = f"world size {world_size}, length {numel}"
    if traffic.total == 0:
        return [f"{where}: no transfer went through coursekit.comm: send with comm.isend/comm.send "
                f"and receive with comm.irecv/comm.recv so the ring can be counted"]
    problems = []
    strangers = sorted({(t.src, t.dst) for t in traffic.payload if t.dst != (t.src + 1) % world_size})
    if strangers:
        src, dst = strangers[0]
        problems.append(f"{where}: rank {src} sent to rank {dst}; in a ring each rank sends only to its right "
                        f"neighbour, rank (r+1) % G = {(src + 1) % world_size}")
    biggest, segment = max(traffic.payload, key=lambda t: t.numel), math.ceil(numel / world_size)
    if biggest.numel > segment:
        problems.append(f"{where}: rank {biggest.src} sent {biggest.numel} elements in one message"
                        f"{' (the whole tensor)' if biggest.numel == numel else ''}; a ring step sends one "
                        f"segment, at most ceil(N/G) = {segment} elements")
    expected = 2 * (world_size - 1) * numel
    if traffic.total != expected:
        problems.append(f"{where}: {'correct result but ' if correct else ''}{traffic.total / expected:.3g}× the "
                        f"expected traffic ({traffic.total} elements moved; a ring moves 2·(G−1)·N = {expected})")
    elif traffic.sent != ring_traffic(numel, world_size):
        problems.append(f"{where}: per-rank sends {traffic.sent}, expected {ring_traffic(numel, world_size)}")
    return problems


@grading.check(EXERCISE, points=2)
def ring_traffic_pattern(submission, ctx):
    """Only neighbours talk, one segment per message, exactly 2·(G−1)·N elements in all (G = 3 and 4)."""
    problems, correct_results = [], True
    for world_size, numel in ((4, 10), (3, 7)):
        results = ctx.launch(_both_rank, world_size, submission.reduce_scatter, submission.all_gather, numel, F32)
        full = _ring_sum(world_size, numel, F32)
        correct = all(torch.equal(x.double(), full) for x, _ in results)
        correct_results &= correct
        problems += _traffic_problems(world_size, numel, comm.Traffic.merge([t for _, t in results]), correct)
    if problems:
        raise CheckFailed("\n".join(problems))
    if not correct_results:
        raise CheckFailed("the traffic pattern is a ring, but the results are wrong (see the checks above)",
                          fraction=0.5)


@grading.check(EXERCISE, points=1)
def only_point_to_point(submission, ctx):
    """Built from coursekit.comm point-to-point only: no torch.distributed collectives (G = 4)."""
    results = ctx.launch(_both_rank, 4, submission.reduce_scatter, submission.all_gather, 12, F32)
    if comm.Traffic.merge([t for _, t in results]).total == 0:
        raise CheckFailed("nothing was sent through coursekit.comm: use comm.isend/comm.irecv (or send/recv)")


@grading.check(EXERCISE, points=1, hidden=True)
def edge_cases(submission, ctx):
    """Lengths shorter than the world size, zero, and a world of one rank."""
    _score_reduce_scatter(submission, ctx, [(4, [(2, F32), (0, F32)]), (1, [(5, F32)])])
    _score_all_gather(submission, ctx, [(4, [(3, F32), (0, F32)]), (1, [(5, F32)])])


@grading.check(EXERCISE, points=2, hidden=True)
def hidden_variants(submission, ctx):
    """World sizes and lengths the notebook does not show, float64 and float16 too."""
    plan = [(5, [(1001, torch.float64), (5, F32)]), (6, [(50, F32)]), (3, [(7, torch.float16)])]
    _score_reduce_scatter(submission, ctx, plan)
    _score_all_gather(submission, ctx, plan)
