"""Checks of exercise 02 (``exercises/02_data_parallel.ipynb``): bucketed, overlapped hooks; ZeRO-2's reduce-scatter.

    from coursekit.grading import check_data_parallel
    check_data_parallel(attach_gradient_averaging, reduce_scatter_gradients)

The learner writes two functions, from their contracts:

* ``attach_gradient_averaging(model, bucket_elements, group=None) -> finish``: the trainable parameters grouped
  into buckets in backward order (the reverse of ``model.parameters()``), a new bucket when the next parameter
  would take it past ``bucket_elements`` (a parameter never split); each bucket's ``comm.all_reduce(...,
  async_op=True)`` started from a gradient hook as soon as its last gradient is ready; ``finish()``, called after
  each ``loss.backward()``, waits for them and leaves every trainable ``p.grad`` the mean over ``group``'s ranks
  (gradient accumulation included).
* ``reduce_scatter_gradients(model, group=None) -> Tensor``: after backward, ZeRO-2's step: the gradients of the
  trainable parameters, flattened in ``model.parameters()`` order, reduce-scattered with chapter 01's ring; this
  rank's segment (``owned_segment(r, G)``) of the *averaged* gradient, as a tensor of its own (not a view into the
  flat buffer, which would keep every gradient alive), the full gradients freed (``p.grad = None``).

Each check trains on real ranks, compares with one process on the same global batch through
:mod:`coursekit.measure.verify`, and measures a property: the all-reduces each backward started (their sizes
against the buckets of the rule, when they started and were waited for: :mod:`.data_parallel_watch`), or the
reduce-scatter's traffic against its formula. What runs on each rank, and the one process it is compared with,
is :mod:`.data_parallel_runs`, the hints at a mistake :mod:`.data_parallel_hints`; judging and scoring are here.
"""

from __future__ import annotations

from .. import comm
from ..collectives import owned_segment, segment_bounds
from ..models import tiny_mlp
from ..measure.verify import compare
from .data_parallel_buckets import bucket_problem, overlap_problem, unwaited
from .data_parallel_hints import accumulation_hint, gradient_hint, moved_weights
from .data_parallel_runs import SHIFT, accumulation_rank, hooks_rank, reference, zero2_rank
from .registry import check
from .scoring import CheckFailed, partial_credit

EXERCISE = "02_data_parallel"  # registered in registry.EXERCISES, the one place exercises are named
# The checks that judge each part's answer; the others judge its properties and earn nothing while it is wrong.
HOOKS, ZERO2 = ("hooks_average_gradients",), ("zero2_segment",)
# Said when torch.distributed's collectives are called (they are switched off while grading, but for part 1's
# all_reduce, which comm.all_reduce calls):
INSTEAD = ("use coursekit.comm.all_reduce(..., async_op=True) in part 1 and chapter 01's ring_reduce_scatter "
           "(coursekit.collectives) in part 2, so that every transfer is counted")
ALL_REDUCE = ("all_reduce",)  # part 1's checks let comm.all_reduce reach torch's (watched: data_parallel_watch)
BUCKET = 2000  # elements: the MLP's gradients in three buckets, 324, 4096 and 1088 elements, in backward order


FROZEN = "layers.1.bias"  # the MLP parameter the visible ZeRO-2 check freezes


# ----------------------------------------------------------------------------- scoring (both parts)
def _global_losses(per_rank):
    """Each rank recorded its share of the loss; the global batch's loss is their sum (done here, not by ranks)."""
    for step in range(len(per_rank[0])):
        total = sum(records[step]["loss"] for records in per_rank)
        for records in per_rank:
            records[step]["loss"] = total
    return per_rank


def _groups(case) -> list[tuple[list[int], int]]:
    """The groups that average apart, ``(their global ranks, their batch shift)``: the world, or MESH's dp groups."""
    world_size = case[2]
    if len(case) > 6 and case[6]:
        return [([0, 2], 0), ([1, 3], SHIFT)]  # Mesh({"dp": 2, "tp": 2}): rank = 2·dp + tp
    return [(list(range(world_size)), 0)]


def _judge_training(case, results, guess_unaveraged: bool) -> str | None:
    """None if a case's training equals one process on the same global batches, else what differs first."""
    name, freeze, world_size, steps, global_batch = case[:5]
    for ranks, shift in _groups(case):
        report = compare(reference(name, freeze, steps, global_batch, shift),
                         _global_losses([results[r][0] for r in ranks]))
        if not report.ok:
            hint = (moved_weights(results) or unwaited(results)
                    or gradient_hint(report.first, len(ranks), guess_unaveraged))
            where = f" (the dp group of ranks {ranks})" if len(_groups(case)) > 1 else ""
            return f"{_case_name(case)}{where}: {report.first}{hint}"
    return None


def _case_name(case) -> str:
    """``mlp with layers.1.bias frozen, world size 3`` (and the buckets' size, or the mesh, where there is one)."""
    name, freeze, world_size = case[:3]
    said = f"{name}{' with ' + ', '.join(freeze) + ' frozen' if freeze else ''}, world size {world_size}"
    if len(case) > 6 and case[6]:
        said += " as Mesh({'dp': 2, 'tp': 2}), averaging over each dp group (group=mesh['dp'])"
    return said + (f", buckets of {case[5]} elements" if len(case) > 5 else "")


def _score_training(ctx, rank_fn, learner_fn, cases, guess_unaveraged: bool = True) -> float:
    """Train each case on real ranks and compare with one process on the same global batches.

    A case is ``(model name, frozen parameters, world size, steps, global batch)``;
    credit per case that matches. ``rank_fn(rank, world_size, learner_fn, *case)``
    returns ``(records, ...)``; a crash in one case costs only that case. Cases
    with one rank are preconditions: there a sum and a mean agree, so they earn nothing.
    """
    outcomes = []
    for case in cases:
        name, freeze, world_size, steps, global_batch = case[:5]
        results = ctx.launch_case(rank_fn, world_size, learner_fn, name, freeze, steps, global_batch, *case[5:])
        if isinstance(results, CheckFailed):
            outcomes.append((world_size, f"{_case_name(case)}: {results}"))
        else:
            outcomes.append((world_size, _judge_training(case, results, guess_unaveraged)))
    return partial_credit([o for g, o in outcomes if g > 1], [o for g, o in outcomes if g == 1])


# Elements a ring collective moves per step, all ranks together, for Ψ gradient elements on G ranks.
_RING_TRAFFIC = {"reduce-scatter": (1, "(G−1)·Ψ")}


def _counted_traffic(ctx, rank_fn, learner_fn, world_size: int, steps: int, collective: str,
                     silent: str) -> tuple[comm.Traffic, int]:
    """Train the MLP on real ranks; fail unless the learner's code sent what one ring ``collective`` per step moves.

    Traffic is scored only when the training is right: the same number of
    elements moved for a wrong answer earns nothing. ``silent`` is the feedback
    when nothing went through ``coursekit.comm``. Returns the traffic and Ψ.
    """
    case = ("mlp", (), world_size, steps, 12)
    results = ctx.launch(rank_fn, world_size, learner_fn, *case[:2], *case[3:])
    traffic = comm.Traffic.merge([r[1] for r in results])
    if traffic.total == 0:
        raise CheckFailed(silent)
    wrong = _judge_training(case, results, guess_unaveraged=False)
    if wrong:
        raise CheckFailed(f"{wrong}\nthe result is wrong (see the check above): traffic is scored only "
                          f"for a right one")
    psi = sum(p.numel() for p in tiny_mlp().parameters())
    factor, formula = _RING_TRAFFIC[collective]
    per_step = factor * (world_size - 1) * psi
    if traffic.total != steps * per_step:
        doubled = collective == "reduce-scatter" and traffic.total == 2 * steps * per_step
        raise CheckFailed(
            f"{traffic.total / (steps * per_step):.3g}× the traffic of a ring {collective} ({traffic.total} elements "
            f"in {steps} step{'s' if steps > 1 else ''}; {formula} = {per_step} per step)"
            + (" — an all-reduce then a slice moves 2×: use the reduce-scatter alone" if doubled else ""))
    return traffic, psi


# ----------------------------------------------------------------------------- part 1


def _mlp_sizes() -> list[int]:
    return [p.numel() for p in tiny_mlp().parameters()]


def _right_hooks(ctx, submission, world_size: int, bucket: int) -> list:
    """The MLP on ``world_size`` ranks, buckets of ``bucket`` elements, 2 steps; its results if the training is
    right, else CheckFailed (a property is scored only for a right answer)."""
    case = ("mlp", (), world_size, 2, 12, bucket)
    results = ctx.memo(("hooks", world_size, bucket), lambda: ctx.launch(
        hooks_rank, world_size, submission.attach_gradient_averaging, "mlp", (), 2, 12, bucket))
    wrong = _judge_training(case, results, guess_unaveraged=True)
    if wrong:
        raise CheckFailed(f"{wrong}\nthe result is wrong (see the check above): this is scored only for a right one")
    return results


@check(EXERCISE, points=3, timeout=60, allows=ALL_REDUCE)
def hooks_average_gradients(submission, ctx):
    """After backward and finish() every gradient is the average over ranks: equal to one process (G = 2, 3; G = 1
    must work too)."""
    return _score_training(ctx, hooks_rank, submission.attach_gradient_averaging,
                           [("mlp", (), g, 3, 12, BUCKET) for g in (1, 2, 3)])


@check(EXERCISE, points=2, timeout=60, requires=HOOKS, allows=ALL_REDUCE)
def hooks_buckets(submission, ctx):
    """Each backward all-reduces every trainable gradient once, in the buckets of the rule: backward order, up to
    bucket_elements, a parameter never split (G = 3, buckets of 5000 elements: two of them)."""
    problem = bucket_problem(_right_hooks(ctx, submission, 3, 5000), _mlp_sizes(), 5000)
    if problem:
        raise CheckFailed(f"mlp, world size 3, buckets of 5000 elements: {problem}")


@check(EXERCISE, points=2, timeout=60, requires=HOOKS, allows=ALL_REDUCE)
def hooks_overlap(submission, ctx):
    """Every bucket's all-reduce starts during backward, from a hook, asynchronously, and is waited for after
    backward, in finish() (G = 3, three buckets)."""
    problem = overlap_problem(_right_hooks(ctx, submission, 3, BUCKET))
    if problem:
        raise CheckFailed(f"mlp, world size 3, buckets of {BUCKET} elements: {problem}")


@check(EXERCISE, points=2, timeout=60, requires=HOOKS, allows=ALL_REDUCE)
def hooks_gradient_accumulation(submission, ctx):
    """Gradient accumulation: two micro-batches per rank, two ``loss.backward()`` (each followed by finish())
    before each step, equal to one process on the whole batch (G = 2, 3)."""
    outcomes = []
    for case in [("mlp", (), 2, 2, 12, BUCKET), ("mlp", (), 3, 2, 12, BUCKET)]:
        name, freeze, world_size, steps, global_batch = case[:5]
        results = ctx.launch_case(accumulation_rank, world_size, submission.attach_gradient_averaging,
                                  name, freeze, steps, global_batch, BUCKET)
        if isinstance(results, CheckFailed):
            outcomes.append(f"{_case_name(case)}, two backward calls per step: {results}")
            continue
        report = compare(reference(name, freeze, steps, global_batch), _global_losses([r[0] for r in results]))
        if report.ok:
            outcomes.append(None)
            continue
        hint = moved_weights(results) or accumulation_hint(case[:5], results) or gradient_hint(
            report.first, world_size, guess_unaveraged=True)
        outcomes.append(f"{_case_name(case)}, two backward calls per step: {report.first}{hint}")
    return partial_credit(outcomes)


@check(EXERCISE, points=1, hidden=True, timeout=60, requires=HOOKS, allows=ALL_REDUCE)
def hooks_tied_frozen_uneven(submission, ctx):
    """Transformer with a tied head and a frozen parameter, a global batch of 7 on 3 and 4 ranks (buckets of 20000
    elements); and the MLP on a 2 × 2 mesh, each dp group averaging apart (group=mesh["dp"])."""
    return _score_training(ctx, hooks_rank, submission.attach_gradient_averaging,
                           [("transformer", ("pos_emb.weight",), 3, 2, 7, 20000),
                            ("transformer", ("pos_emb.weight",), 4, 2, 7, 20000),
                            ("mlp", (), 4, 2, 12, BUCKET, True)])


# ----------------------------------------------------------------------------- part 2


@check(EXERCISE, points=3, timeout=60)
def zero2_segment(submission, ctx):
    """Each rank gets the averaged gradient of its own segment; ZeRO-2 training equals one process (G = 2–4, and
    G = 3 with a frozen parameter; G = 1 must work too)."""
    return _score_training(ctx, zero2_rank, submission.reduce_scatter_gradients,
                           [("mlp", (), 1, 2, 12), ("mlp", (), 2, 2, 12), ("mlp", (), 3, 2, 12), ("mlp", (), 4, 2, 12),
                            ("mlp", (FROZEN,), 3, 2, 12)], guess_unaveraged=False)


@check(EXERCISE, points=2, timeout=60, requires=ZERO2)
def zero2_traffic(submission, ctx):
    """A reduce-scatter, not an all-reduce: exactly (G−1)·Ψ elements per step, each rank N − its segment (G = 4)."""
    world_size = 4
    traffic, psi = _counted_traffic(ctx, zero2_rank, submission.reduce_scatter_gradients, world_size, 1,
                                    "reduce-scatter", "nothing went through coursekit.comm: use chapter 01's "
                                    "ring_reduce_scatter (coursekit.collectives) on the flattened gradients")
    bounds = segment_bounds(psi, world_size)
    want = {r: psi - (lambda b: b[1] - b[0])(bounds[owned_segment(r, world_size)]) for r in range(world_size)}
    if traffic.sent != want:
        raise CheckFailed(f"per-rank sends {traffic.sent}, expected {want}: one ring reduce-scatter over "
                          f"all the gradients flattened together")


@check(EXERCISE, points=1, timeout=60, requires=ZERO2)
def zero2_frees_gradients(submission, ctx):
    """After the reduce-scatter a rank keeps only its segment: every ``p.grad`` is freed, and the segment returned
    is a tensor of its own, not a view into the flattened gradients (G = 2)."""
    results = ctx.launch(zero2_rank, 2, submission.reduce_scatter_gradients, "mlp", (), 1, 12)
    memory = [r[3][0] for r in results]
    problems = []
    held = max(m["grads"] for m in memory)
    if held:
        problems.append(f"{held} gradient elements are still held in p.grad after the reduce-scatter: "
                        f"set p.grad = None (that is the memory ZeRO-2 saves)")
    views = [(rank, m) for rank, m in enumerate(memory) if m["storage"] > m["returned"]]
    if views:
        rank, m = views[0]
        psi = sum(p.numel() for p in tiny_mlp().parameters())
        buffer = f"the flat buffer of all {psi} flattened gradients" if m["storage"] == psi else \
            f"a buffer of {m['storage']} elements"
        problems.append(f"rank {rank} returned its segment ({m['returned']} elements) as a view into {buffer}: "
                        f"as long as the segment lives, so does the whole buffer, and ZeRO-2 saves nothing. Return "
                        f"a tensor of its own: mine / world_size (or .clone()), not mine.div_(world_size)")
    if problems:
        raise CheckFailed("\n".join(problems))


@check(EXERCISE, points=1, hidden=True, timeout=90, requires=ZERO2)
def zero2_hidden_variants(submission, ctx):
    """Transformer (tied head, frozen parameter), Ψ not divisible by G, a global batch of 7 on 5 ranks."""
    return _score_training(ctx, zero2_rank, submission.reduce_scatter_gradients,
                           [("transformer", ("pos_emb.weight",), 5, 2, 7), ("transformer", (), 3, 2, 7)],
                           guess_unaveraged=False)
