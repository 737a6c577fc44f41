"""Checks of exercise 03 (``exercises/03_model_parallel.ipynb``): the two halves of a model-parallel step.

    from coursekit.grading import check_model_parallel
    check_model_parallel(first_stage, second_stage)

The seed's example (claim P3): a two-layer network, the hidden layer on rank 0 ("GPU 1"), the output layer on
rank 1 ("GPU 2"). The learner writes both halves of one micro-batch's forward and backward:

* ``first_stage(stage, inputs)`` on rank 0: forward through ``stage``, send the activations to rank 1 (detached:
  only numbers cross between processes), receive the gradient of the loss with respect to them, and continue
  the backward pass from it (``activations.backward(grad)``).
* ``second_stage(stage, targets, loss_fn, shape) -> loss`` on rank 1: receive the activations (``shape``) as a
  leaf that requires grad, forward through ``stage``, ``loss = loss_fn(output, targets)``, ``loss.backward()``,
  and send ``inputs.grad`` back to rank 0. The loss must come from the ``loss_fn`` given (the harness's,
  scaled for micro-batches) and be returned: the check of the loss checks both.

Each check runs the learner's halves in the strict simulator first (a deadlock is named at once), then on two
real ranks (``torch.distributed``'s collectives and raw send/recv switched off: everything goes through
``coursekit.comm`` and is counted), and compares with one process training the whole network on the same
batches (:mod:`coursekit.measure.verify`: the loss, every gradient, every weight after each step).

What a rank does is watched through a thin layer over ``coursekit.comm``'s transport (:mod:`.watch`, run by
:mod:`.model_parallel_ranks`): where each message goes, and whether the activations sent still required grad.
When the second stage cannot send a gradient, the harness sends rank 0 a zero gradient in its place, so that
the run finishes and the feedback can say what that costs: the first stage's gradients are zero. When the first
stage kept only detached activations (its ``activations.backward(grad)`` has no graph to follow), the harness
notes it and goes on: the second stage's half is judged, the first stage's gradients are missing. The check of
the forward alone stops rank 0 right after its send, so that a right loss earns its points whatever rank 0's
backward does.
"""

from __future__ import annotations

import functools
import math

from ..launch import launch
from ..models import TeacherData, loss_fn
from ..measure.verify import compare, reference_run
from .model_parallel_ranks import WHAT, WORLD, boundary_width, make_model, make_optimizer, two_stage_rank
from .registry import check
from .scoring import CheckFailed, partial_credit

EXERCISE = "03_model_parallel"  # registered in registry.EXERCISES, the one place exercises are named
# The checks that judge the answer; the others judge its properties and earn nothing while it is wrong.
ANSWER = ("activations_reach_the_loss", "gradients_of_both_stages", "training_equals_one_process")
# Said when torch.distributed's collectives are called (they are switched off while grading):
INSTEAD = "send the activations and the gradient with coursekit.comm.send/recv (or isend/irecv)"

# ----------------------------------------------------------------------------- the cases
# (d_hidden, n_layers, layers_per_stage, steps, global_batch, micro_batches)
SEED_EXAMPLE = (64, 2, (1, 1), 1, 12, 1)


@functools.lru_cache(maxsize=16)
def _reference(d_hidden, n_layers, steps, global_batch):
    """One process, the whole network, the whole batch (cached: nobody mutates it)."""
    model, data = make_model(d_hidden, n_layers), TeacherData()
    return reference_run(model, make_optimizer(model.parameters()),
                         [data.batch(s, global_batch) for s in range(steps)], loss_fn)


def _case_name(case) -> str:
    d_hidden, n_layers, sizes, steps, batch, micro = case
    layers = "two-layer network" if n_layers == 2 else f"{n_layers}-layer network split {list(sizes)}"
    return (f"{layers} (hidden {d_hidden}), batch {batch}"
            + (f" in {micro} micro-batches" if micro > 1 else "") + f", {steps} step{'s' if steps > 1 else ''}")


_NEVER_CALLED = ("second_stage never called loss_fn, the loss function it is given: compute "
                 "loss = loss_fn(stage(inputs), targets) with it (it is scaled for micro-batches; a loss of your own "
                 "is not)")


def _never_called(result) -> bool:
    return any(computed is None for *_, computed in result.get("answers", []))


def _loss_returned(result) -> str | None:
    """None if second_stage returned the loss loss_fn computed, on every micro-batch; else what it returned."""
    for step, micro, returned, computed in result.get("answers", []):
        if not isinstance(returned, float):
            return f"second_stage must return the loss: it returned {returned} (end it with `return loss`)"
        if computed is not None and not math.isclose(returned, computed, rel_tol=1e-6, abs_tol=1e-7):
            return (f"second_stage must return the loss: at step {step}, micro-batch {micro} it returned "
                    f"{returned:.6g}, but loss_fn gave {computed:.6g}")
    return None


# ----------------------------------------------------------------------------- judging
def _run(ctx, submission, case, forward_only=False):
    """:func:`_run_once`, remembered for the rest of this grading (``ctx.memo``): several checks judge the same case."""
    return ctx.memo(("model_parallel", case, forward_only), lambda: _run_once(ctx, submission, case, forward_only))


def _run_once(ctx, submission, case, forward_only=False):
    """The simulator first (a deadlock is named at once), then two real ranks; the results of the real ones.

    The simulator runs in a rank of its own (a one-rank launch), not in this process: its two ranks are threads,
    and after torch has multiplied matrices in threads of this process, ranks forked from it later hung in their
    first matrix multiply (seen: 2 runs of the solution's grading in 6 stuck in ``Linear.forward``).
    """
    args = (submission.first_stage, submission.second_stage, case, forward_only)
    # The reference first, here: the first optimiser built imports torch._dynamo (~5 s); once in this process,
    # not again in every rank forked below (measured: the first check took 9.6 s instead of 0.4 s).
    _reference(*case[:2], case[3], case[4])
    failed = launch(_simulated, 1, ctx, args, timeout=ctx.timeout + 10)[0]
    if failed is not None:
        raise failed
    return ctx.launch(two_stage_rank, WORLD, *args)


def _simulated(rank, world_size, ctx, args):
    """Inside a one-rank launch: the learner's halves in the strict simulator; what it found wrong, or None."""
    try:
        ctx.simulate(two_stage_rank, WORLD, *args)
    except CheckFailed as failed:
        return failed
    return None


def _per_rank_records(results):
    """Every rank reports the batch's loss: the second stage computed it (the harness shares it, not the ranks)."""
    per_rank = [r["records"] for r in results]
    for step, record in enumerate(per_rank[1]):
        for records in per_rank:
            records[step]["loss"] = record["loss"]
    return per_rank


def _rescue_note(results) -> str:
    rescued = results[1]["rescued"]
    if not rescued:
        return ""
    return (f"rank 1 could not send the gradient back: {rescued[0][2]}. The grader sent rank 0 zeros instead, so "
            f"the first stage's gradients are zero")


def _stage_of(name: str, case) -> int:
    sizes = case[2]
    layer = int(name.split(".")[1])
    return 0 if layer < sizes[0] else 1


def _judge(case, results, kinds=("loss", "grad", "param", "output", "missing")) -> dict[int, str | None]:
    """Per stage: None if its part equals one process, else the first divergence (and what probably caused it)."""
    d_hidden, n_layers, sizes, steps, batch, micro = case
    report = compare(_reference(d_hidden, n_layers, steps, batch), _per_rank_records(results))
    verdict: dict[int, str | None] = {0: None, 1: None}
    first: dict[int, object] = {}
    for divergence in report.divergences:
        if divergence.kind not in kinds:
            continue
        stages = [0, 1] if divergence.kind == "loss" else [1] if divergence.kind == "output" else \
            [_stage_of(divergence.name, case)] if divergence.name else [0, 1]
        for s in stages:
            first.setdefault(s, divergence)
    for s, divergence in first.items():
        verdict[s] = f"{_case_name(case)}: {divergence}"
    note = _rescue_note(results)
    if results[0]["rescued"] and 0 in first:  # rank 0 could not continue backward: its gradients are missing
        verdict[0] = f"{_case_name(case)}: {results[0]['rescued'][0][2]}"
    elif note and 0 in first:
        d = first[0]
        verdict[0] = (f"{_case_name(case)}: {note} (step {d.step}, {d.kind} {d.name!r}: expected {d.expected:.4g}, "
                      f"got {d.got:.4g})")
    elif 0 in first and _all_zero(results[0], case):
        verdict[0] += (" — every gradient of the first stage is zero: it continued backward from a zero gradient "
                       "(receive the gradient rank 1 sends, then activations.backward(grad))")
    if _never_called(results[1]):  # what differs follows from it: say so wherever something differs
        verdict = {s: v and f"{v} — {_NEVER_CALLED}" for s, v in verdict.items()}
    return verdict


def _all_zero(result, case) -> bool:
    grads = result["records"][0]["grads"].tensors
    return bool(grads) and all(not t.any() for t in grads.values())


def _right(ctx, submission, case) -> tuple[list, str | None]:
    """Run ``case``; the results and None if the whole training equals one process, else what differs first."""
    results = _run(ctx, submission, case)
    verdict = _judge(case, results)
    wrong = [v for v in verdict.values() if v]
    return results, (wrong[0] if wrong else None)


@check(EXERCISE, points=2, timeout=30)
def activations_reach_the_loss(submission, ctx):
    """The seed's two-layer network: the activations rank 0 sends reach rank 1, whose loss (computed with the
    loss_fn given, and returned) equals one process."""
    case = SEED_EXAMPLE
    try:  # the whole step: a wrong backward does not make the loss wrong
        result = _run(ctx, submission, case)[1]
        got = result["records"][0]["loss"]
    except CheckFailed:  # the backward went wrong in a way that stopped the run: the forward alone
        result = _run(ctx, submission, case, forward_only=True)[1]
        got = result["loss"]
    if _never_called(result):  # the loss seen is only what it returned: no word on the activations
        raise CheckFailed(f"{_case_name(case)}: {_NEVER_CALLED}")
    problems = []
    expected = _reference(*case[:2], case[3], case[4])[0]["loss"]
    if not math.isclose(got, expected, rel_tol=1e-4, abs_tol=1e-5):
        problems.append(f"{_case_name(case)}: rank 1's loss is {got:.6g}, one process's {expected:.6g}: "
                        f"rank 1 did not compute the output layer on the activations rank 0 computed")
    returned = _loss_returned(result)  # the caller gets the loss only from the return value
    if returned:
        problems.append(f"{_case_name(case)}: {returned}")
    if problems:
        raise CheckFailed("\n".join(problems))


@check(EXERCISE, points=3, timeout=30)
def gradients_of_both_stages(submission, ctx):
    """After one backward every gradient of both stages equals one process (the seed's two-layer network)."""
    results = _run(ctx, submission, SEED_EXAMPLE)
    verdict = _judge(SEED_EXAMPLE, results, kinds=("loss", "grad", "missing"))
    return partial_credit([verdict[1], verdict[0]])


TRAINING_CASES = [(64, 2, (1, 1), 3, 12, 1), (64, 2, (1, 1), 2, 10, 3)]


@check(EXERCISE, points=3, timeout=30)
def training_equals_one_process(submission, ctx):
    """Loss, every gradient and every weight after each of 3 steps equal one process; and with 3 uneven
    micro-batches per step (gradients accumulate over them)."""
    return partial_credit([_right(ctx, submission, case)[1] for case in TRAINING_CASES])


def _traffic_problems(case, results) -> list[str]:
    width = boundary_width(case[0], case[1], case[2])
    problems = []
    for rank, other in ((0, 1), (1, 0)):
        for step, micro, samples, sent in results[rank]["sends"]:
            want = [{"dst": other, "numel": samples * width}]
            got = [{"dst": s["dst"], "numel": s["numel"]} for s in sent]
            if got != want:
                said = ", ".join(f"{s['numel']} element{'s' * (s['numel'] != 1)} to rank {s['dst']}" for s in got) or "nothing"
                problems.append(
                    f"step {step}, micro-batch {micro}: rank {rank} sent {said}; expected exactly one message of "
                    f"{samples}×{width} = {samples * width} elements (micro-batch × hidden) to rank {other}: "
                    f"{WHAT[rank]}, nothing else")
    return problems


@check(EXERCISE, points=2, timeout=30, requires=ANSWER)
def traffic_pattern(submission, ctx):
    """Per micro-batch exactly one message of b×h elements forward (rank 0 → 1) and one back (1 → 0), counted by
    coursekit.comm (3 uneven micro-batches)."""
    case = TRAINING_CASES[1]
    results, wrong = _right(ctx, submission, case)
    if wrong:
        raise CheckFailed(f"{wrong}\nthe result is wrong (see the checks above): traffic is scored only "
                          f"for a right one")
    problems = _traffic_problems(case, results)
    if problems:
        raise CheckFailed("\n".join(problems[:3]) + (f"\n… {len(problems) - 3} more" if len(problems) > 3 else ""))


@check(EXERCISE, points=1, timeout=30, requires=ANSWER)
def activations_sent_detached(submission, ctx):
    """What goes forward is data only: the activations are sent detached from rank 0's autograd graph."""
    case = SEED_EXAMPLE
    results, wrong = _right(ctx, submission, case)
    if wrong:
        raise CheckFailed(f"{wrong}\nthe result is wrong (see the checks above): this is scored only for "
                          f"a right one")
    attached = [s for *_, sent in results[0]["sends"] for s in sent if s["requires_grad"]]
    if attached:
        raise CheckFailed(
            "rank 0 sent activations that still require grad (not detached). It works — a send moves only the "
            "numbers — but autograd cannot follow a tensor into another process: rank 1 starts a graph of its own "
            "from a new leaf, and the gradient comes back only because you send it back by hand. Send "
            "activations.detach() to say so (torch.distributed.pipelining detaches what it sends too), and keep "
            "`activations` itself for activations.backward(grad)")


@check(EXERCISE, points=1, hidden=True, timeout=30, requires=ANSWER)
def other_splits_and_sizes(submission, ctx):
    """A three-layer network split [2, 1] and [1, 2], hidden 24, a batch of 7 in 3 micro-batches, 2 steps."""
    cases = [(24, 3, (2, 1), 2, 7, 3), (24, 3, (1, 2), 2, 7, 3)]
    return partial_credit([_right(ctx, submission, case)[1] for case in cases])
