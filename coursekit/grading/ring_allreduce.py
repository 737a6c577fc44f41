"""Checks of exercise 01 (``exercises/01_ring_allreduce.ipynb``): the ring's reduce-scatter and all-gather.

    from coursekit import grading
    grading.check_ring_all_reduce(my_reduce_scatter, my_all_gather)     # (from coursekit.grading's entry points)

The learner writes ``reduce_scatter(tensor, group=None) -> owned segment`` and
``all_gather(segment, out, group=None)`` with ``coursekit.comm``, following the
schedule of :mod:`coursekit.collectives` (rank r ends owning segment (r+1) % G).
Each case runs in the strict simulator first and, if its results are right
there, on real ranks (:meth:`coursekit.grading.context.Context.run`): answers are
compared with exact sums and every transfer is counted. Every point is for the
ring: a right answer earns credit only if the ring computed it (each message to
the right neighbour, one segment at most); a parameter server is chapter 01's
single master, not this exercise, and scores 0. So the two checks a server would
pass too -- ``all_reduce_bit_identical`` (one rank sums, all copy: the same bits)
and ``only_point_to_point`` (built from ``coursekit.comm``) -- count only once
the run they judge has the ring's shape (:func:`.ring_judge.shape_problems`), as
``ring_traffic_pattern`` counts only for a correct result. Cases any attempt gets
right are *preconditions* (they cost when they fail, never earn): one rank (the
input is the sum) and length 0 (every segment empty: doing nothing is right).

When something is wrong the feedback first names the step where the attempt
leaves the ring's schedule, in the seed's labels (:mod:`.ring_schedule`), then
the world size, length, rank and segment of each case that failed; a message
that many cases share (a forbidden call, the library's own ring) is said once,
with the cases it holds for.
"""

from __future__ import annotations

import torch

from .. import comm
from ..collectives import owned_segment, ring_traffic, segment_bounds
from .registry import check
from .ring_judge import all_gather_start, judge_all_gather, judge_reduce_scatter, ring_input, ring_sum, shape_problems
from .ring_schedule import AG, RS, diagnose
from .ring_subgroup import subgroup_case
from .scoring import CheckFailed, Deadlocked, NotDone, partial_credit

EXERCISE = "01_ring_allreduce"  # registered in registry.EXERCISES, the one place exercises are named
# The checks that judge the answer; the others judge its properties and earn nothing while it is wrong.
ANSWER = ("reduce_scatter_correct", "all_gather_correct")
F32 = torch.float32
# (world size, length) of the all-gather cases whose segment is passed as a copy, not as the view of out that
# reduce_scatter returns: the notebook asks all_gather to put it in place unless it already is that view.
AS_COPY = {(3, 10)}
BOTH = "reduce_scatter then all_gather"  # how the cases that run both phases are named
LENGTH_HINT = "which segment does each step send, and which does it receive?"  # said when gloo aborts a rank


# ----------------------------------------------------------------------------- what runs on each rank
def _segment_index(segment, tensor: torch.Tensor, world_size: int) -> int | None:
    """Which segment of ``tensor`` the returned view ``segment`` is, or None if it is not one of them."""
    if not isinstance(segment, torch.Tensor) or segment.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr():
        return None
    start = (segment.data_ptr() - tensor.data_ptr()) // tensor.element_size()
    bounds = segment_bounds(tensor.numel(), world_size)
    return next((k for k, (a, b) in enumerate(bounds) if a == start and b - a == segment.numel() and b > a), None)


def _rs_rank(rank, world_size, reduce_scatter, cases):
    out = []
    for numel, dtype in cases:
        x = ring_input(rank, numel, dtype)
        with comm.record() as traffic:
            segment = reduce_scatter(x)
        got = segment.detach().clone() if isinstance(segment, torch.Tensor) else repr(type(segment))
        out.append((got, traffic, _segment_index(segment, x, world_size)))
    return out


def _ag_rank(rank, world_size, all_gather, cases):
    """Start each rank from its owned segment, already summed, and its own input elsewhere (not zeros, which an
    all_gather that adds would get right); all_gather fills the rest. In the AS_COPY cases the summed segment is
    passed as a copy and out holds the rank's input there too."""
    out = []
    for numel, dtype in cases:
        as_copy = (world_size, numel) in AS_COPY
        target = all_gather_start(rank, world_size, numel, dtype, as_copy)
        start, stop = segment_bounds(numel, world_size)[owned_segment(rank, world_size)]
        segment = ring_sum(world_size, numel, dtype)[start:stop].to(dtype) if as_copy else target[start:stop]
        with comm.record() as traffic:
            all_gather(segment, target)
        out.append((target, traffic, as_copy))
    return out


def _both_rank(rank, world_size, reduce_scatter, all_gather, numel, dtype):
    x = ring_input(rank, numel, dtype)
    with comm.record() as traffic:
        mine = reduce_scatter(x)
        all_gather(mine, x)
    return x, traffic


def _random_all_reduce(rank, world_size, reduce_scatter, all_gather, numel):
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    all_gather(reduce_scatter(x), x)
    return x


# ----------------------------------------------------------------------------- scoring many cases
def _label(name: str, world_size: int, cases) -> str:
    """The case a deadlock is said in: ``reduce_scatter, world size 4, lengths 16 and 10``."""
    lengths = [str(n) for n, _ in cases]
    said = f"length {lengths[0]}" if len(lengths) == 1 else f"lengths {', '.join(lengths[:-1])} and {lengths[-1]}"
    return f"{name}, world size {world_size}, {said}"


def _per_case(ctx, rank_fn, world_size, learner_fn, cases, judge, name):
    """All cases in one run; if that crashes, one run per case, so a crash costs only its case.

    Yields ``(numel, outcome)``: None when right, else what went wrong. ``name``: the learner's function run.
    """
    def judged(chosen, results):
        return [judge(world_size, n, d, [r[i] for r in results]) for i, (n, d) in enumerate(chosen)]

    def accept(chosen):
        return lambda results: not any(judged(chosen, results))

    results = ctx.run_case(rank_fn, world_size, learner_fn, cases, accept=accept(cases),
                           case=_label(name, world_size, cases))
    if not isinstance(results, CheckFailed):
        yield from zip((n for n, _ in cases), judged(cases, results))
        return
    for numel, dtype in cases:
        results = ctx.run_case(rank_fn, world_size, learner_fn, [(numel, dtype)], accept=accept([(numel, dtype)]),
                               case=_label(name, world_size, [(numel, dtype)]))
        if isinstance(results, CheckFailed):
            yield numel, f"world size {world_size}, length {numel}: {results}"
        else:
            yield numel, judged([(numel, dtype)], results)[0]


_PHASES = {RS: (_rs_rank, judge_reduce_scatter, "reduce_scatter"), AG: (_ag_rank, judge_all_gather, "all_gather")}


def _outcomes(submission, ctx, phase: str, plan) -> list:
    """Every case of ``plan`` (``[(world size, [(length, dtype), ...]), ...]``) of one phase, judged:
    ``[(world size, length, outcome), ...]``."""
    rank_fn, judge, name = _PHASES[phase]
    return [(world_size, numel, outcome) for world_size, cases in plan
            for numel, outcome in _per_case(ctx, rank_fn, world_size, getattr(submission, name), cases, judge, name)]


def _is_precondition(world_size: int, numel: int) -> bool:
    """A case every attempt gets right, ring or not: one rank (the input is the sum, nothing is sent) or
    length 0 (every segment is empty: doing nothing is right). It earns nothing, and costs when it fails."""
    return world_size == 1 or numel == 0


def _said_once(problems: list[str], cases: int) -> list[tuple[str, int]]:
    """``problems`` (``"<where>: <what>"``, one per failed case of ``cases``) as lines, each with how many cases
    it speaks for: a ``<what>`` that several cases share is said once, after the cases it holds for
    ("every case" when it holds for all of them)."""
    groups: dict[str, list[str]] = {}
    for problem in problems:
        where, _, what = problem.partition(": ")
        groups.setdefault(what, []).append(where)
    lines = []
    for what, wheres in groups.items():
        if not what:  # no "<where>: " to share
            lines += [(where, 1) for where in wheres]
        elif len(wheres) == cases > 1:
            lines.append((f"every case ({cases} of them): {what}", cases))
        else:
            more = f" and {len(wheres) - 3} more" if len(wheres) > 3 else ""
            lines.append((f"{'; '.join(wheres[:3])}{more}: {what}", len(wheres)))
    return lines


def _score(submission, ctx, plans: dict) -> float:
    """Credit per right case over all ``plans`` (phase -> plan); the feedback starts with the first step, in
    the seed's labels, where the attempt leaves the ring's schedule (for each phase that fails).

    Preconditions (:func:`_is_precondition`) earn nothing: one rank, and length 0.
    """
    outcomes, found = [], []
    for phase, plan in plans.items():
        mine = _outcomes(submission, ctx, phase, plan)
        outcomes += mine
        if any(outcome for _, _, outcome in mine):
            diagnosis = diagnose(phase, getattr(submission, _PHASES[phase][2]), ctx.simulate)
            found += [f"{phase}: {diagnosis}"] if diagnosis else []
    scored = [o for g, n, o in outcomes if not _is_precondition(g, n)]
    preconditions = [o for g, n, o in outcomes if _is_precondition(g, n)]
    try:
        return partial_credit(scored, preconditions)
    except CheckFailed as failed:
        lines = _said_once([o for o in preconditions + scored if o], len(outcomes))
        left = sum(n for _, n in lines[3:])
        shown = [line for line, _ in lines[:3]] + ([f"(and {left} more case{'s' * (left > 1)})"] if left else [])
        raise CheckFailed("\n".join(found + shown), failed.fraction) from None


# ----------------------------------------------------------------------------- the checks
@check(EXERCISE, points=3)
def reduce_scatter_correct(submission, ctx):
    """reduce_scatter returns each rank's fully reduced segment, along the ring: G = 2, 3, 4; lengths divisible or not."""
    return _score(submission, ctx, {RS: [(2, [(8, F32), (9, F32)]), (3, [(12, F32), (10, F32)]),
                                         (4, [(16, F32), (10, F32)])]})


@check(EXERCISE, points=2)
def all_gather_correct(submission, ctx):
    """all_gather gives every rank every segment, along the ring: G = 2, 3, 4."""
    return _score(submission, ctx, {AG: [(2, [(8, F32), (9, F32)]), (3, [(10, F32)]), (4, [(10, F32)])]})


def _all_reduce_right(world_size: int, numel: int):
    full = ring_sum(world_size, numel, F32)
    return lambda results: all(torch.equal(x.double(), full) for x, _ in results)


def _not_ring_shaped(world_size: int, numel: int, results: list, what: str) -> None:
    """Raise if the traffic of ``results`` (per rank: (tensor, traffic)) is not shaped as a ring's: ``what``
    (a check's finding that a parameter server shares) counts only for the ring."""
    problems = shape_problems(world_size, numel, comm.Traffic.merge([t for _, t in results]))
    if problems:
        raise CheckFailed(f"world size {world_size}, length {numel}: {what}, but not along a ring: {problems[0]}. "
                          f"This check counts only for the ring's traffic")


@check(EXERCISE, points=1, requires=ANSWER)
def all_reduce_bit_identical(submission, ctx):
    """reduce_scatter then all_gather = all-reduce, with the same bits on every rank (G = 4, length 1001).

    Counted only for a ring: one rank that sums and sends the sum to all has the same bits everywhere too.
    """
    world_size, numel = 4, 1001
    right = _all_reduce_right(world_size, numel)
    results = ctx.run(_both_rank, world_size, submission.reduce_scatter, submission.all_gather, numel, F32,
                      accept=right, case=_label(BOTH, world_size, [(numel, F32)]))
    full = ring_sum(world_size, numel, F32)
    for rank, (x, _) in enumerate(results):
        if not torch.equal(x.double(), full):
            raise CheckFailed(f"world size {world_size}, length {numel}: rank {rank} does not hold the sum after "
                              f"reduce_scatter + all_gather")
    _not_ring_shaped(world_size, numel, results, "every rank holds the sum")
    same = lambda results: all(torch.equal(r, results[0]) for r in results)  # noqa: E731
    random = ctx.run(_random_all_reduce, world_size, submission.reduce_scatter, submission.all_gather, numel,
                     accept=same, case=_label(BOTH, world_size, [(numel, F32)]) + ", random inputs")
    if not same(random):
        differ = [r for r in range(1, world_size) if not torch.equal(random[r], random[0])]
        bits = int((random[differ[0]] != random[0]).sum())
        raise CheckFailed(f"ranks disagree in the last bits: rank {differ[0]} differs from rank 0 at {bits} of "
                          f"{numel} elements (random inputs). Each segment must be summed in one order, along the "
                          f"ring, then copied bit for bit; data-parallel replicas would drift apart")


def _traffic_problems(world_size: int, numel: int, traffic: comm.Traffic) -> list[str]:
    """What in one all-reduce's recorded traffic is not a ring: its shape, the total, the load on each rank."""
    where = f"world size {world_size}, length {numel}"
    if traffic.total == 0:
        return [f"{where}: no transfer went through coursekit.comm: send with comm.isend/comm.send "
                f"and receive with comm.irecv/comm.recv so the ring can be counted"]
    problems = [f"{where}: {problem}" for problem in shape_problems(world_size, numel, traffic)]
    expected = 2 * (world_size - 1) * numel
    if traffic.total != expected:
        problems.append(f"{where}: {traffic.total / expected:.3g}× the expected traffic ({traffic.total} elements "
                        f"moved; a ring moves 2·(G−1)·N = {expected})")
    if traffic.sent != ring_traffic(numel, world_size):
        problems.append(f"{where}: per-rank load (elements sent) {traffic.sent}, the ring's "
                        f"{ring_traffic(numel, world_size)}: a ring spreads the load, so no rank is a bottleneck")
    return problems


@check(EXERCISE, points=2, requires=ANSWER)
def ring_traffic_pattern(submission, ctx):
    """Only neighbours talk, one segment per message, 2·(G−1)·N elements spread evenly (G = 3 and 4).

    Scored only for a correct all-reduce: the traffic of a wrong answer earns nothing.
    """
    problems, correct_results = [], True
    for world_size, numel in ((4, 10), (3, 7)):
        right = _all_reduce_right(world_size, numel)
        results = ctx.run(_both_rank, world_size, submission.reduce_scatter, submission.all_gather, numel, F32,
                          accept=right, case=_label(BOTH, world_size, [(numel, F32)]))
        correct_results &= right(results)
        problems += _traffic_problems(world_size, numel, comm.Traffic.merge([t for _, t in results]))
    if not correct_results:
        problems.append("the results are wrong (see the checks above): traffic is scored only for a correct "
                        "all-reduce")
    if problems:
        raise CheckFailed("\n".join(problems))


@check(EXERCISE, points=1, requires=ANSWER)
def only_point_to_point(submission, ctx):
    """Built from coursekit.comm point-to-point only: no torch.distributed collectives (G = 4).

    Counted only for a ring: a parameter server built from coursekit.comm is point-to-point too.
    """
    world_size, numel = 4, 12
    results = ctx.run(_both_rank, world_size, submission.reduce_scatter, submission.all_gather, numel, F32,
                      case=_label(BOTH, world_size, [(numel, F32)]))
    if comm.Traffic.merge([t for _, t in results]).total == 0:
        raise CheckFailed(f"world size {world_size}, length {numel}: nothing was sent through coursekit.comm: "
                          f"each ring step sends one segment to the right neighbour with comm.isend and receives "
                          f"one from the left with comm.irecv (or send/recv)")
    _not_ring_shaped(world_size, numel, results, "point-to-point through coursekit.comm")


@check(EXERCISE, points=1, hidden=True, requires=ANSWER)
def edge_cases(submission, ctx):
    """Lengths shorter than the world size, zero, and a world of one rank."""
    return _score(submission, ctx, {RS: [(4, [(2, F32), (0, F32)]), (1, [(5, F32)])],
                                    AG: [(4, [(3, F32), (0, F32)]), (1, [(5, F32)])]})


@check(EXERCISE, points=2, hidden=True, requires=ANSWER)
def hidden_variants(submission, ctx):
    """World sizes and lengths the notebook does not show, float64 and float16 too, and a ring over each tp group
    of a 2 × 2 mesh (``group=``: the neighbours' global ranks are not their ranks within the group)."""
    plan = [(5, [(1001, torch.float64), (5, F32)]), (6, [(50, F32)]), (3, [(7, torch.float16)])]
    try:  # half the points: the sizes and dtypes, case by case
        _score(submission, ctx, {RS: plan, AG: plan})
    except (NotDone, Deadlocked):
        raise
    except CheckFailed as failed:
        raise CheckFailed(f"{failed}\n(the other half, a ring over a tp sub-group, is judged once these cases are "
                          f"right)", failed.fraction / 2) from None
    problem = subgroup_case(ctx, submission)  # the other half: real ranks, the group's own numbering
    if problem:
        raise CheckFailed(problem, fraction=0.5)
