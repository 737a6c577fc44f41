"""Checks of exercise 03 (``exercises/03_model_parallel.ipynb``): a two-stage model-parallel step with its backward.

    from coursekit.grading import check_model_parallel
    check_model_parallel(two_stage_step)

The seed's example (claim P3): a two-layer network, the hidden layer on rank 0 ("GPU 1"), the output layer on
rank 1 ("GPU 2"). The learner writes one training step, called on both ranks of the pipeline:
``two_stage_step(stage, inputs, targets, loss_fn, width, micro_batches, group=None) -> loss | None``. The batch is
cut into ``micro_batches`` pieces (``tensor_split``: uneven sizes included); per piece the first stage sends its
activations forward and the last stage sends their gradient back; each stage runs its own backward. After the call
every parameter's ``.grad`` is the gradient of the whole batch's loss (the mean over its rows), which the last stage
returns.

Each check runs the learner's step in the strict simulator first (a deadlock is named at once), then on two real
ranks (``torch.distributed``'s collectives and raw send/recv switched off: everything goes through
``coursekit.comm`` and is counted), and compares with one process training the whole network on the same batches
(:mod:`coursekit.measure.verify`: the loss, every gradient, every weight after each step). What a rank does is
watched through a thin layer over ``coursekit.comm``'s transport (:mod:`.watch`, run by :mod:`.model_parallel_ranks`):
where each message goes, and whether the activations sent still required grad. The check of the forward alone stops
rank 0 right after its send, so that a right loss earns its points whatever the backward does.
"""

from __future__ import annotations

import functools
import math

import torch

from ..launch import launch
from ..models import TeacherData, loss_fn
from ..measure.verify import compare, reference_run
from .model_parallel_ranks import ROLE, WHAT, WORLD, boundary_width, make_model, make_optimizer, two_stage_rank
from .registry import check
from .scoring import CheckFailed, Deadlocked, NotDone, partial_credit

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
    d_hidden, n_layers, sizes, steps, batch, micro = case[:6]
    layers = "two-layer network" if n_layers == 2 else f"{n_layers}-layer network split {list(sizes)}"
    return (f"{layers} (hidden {d_hidden}), batch {batch}"
            + (f" in {micro} micro-batches" if micro > 1 else "") + f", {steps} step{'s' if steps > 1 else ''}"
            + (", on Mesh({'dp': 2, 'pp': 2}), each pipeline its pp group (group=mesh['pp'])" if _mesh(case) else ""))


_NEVER_CALLED = ("the last stage never called loss_fn, the loss function it is given: compute each micro-batch's "
                 "loss with it (a loss of your own is not the one judged)")


def _never_called(result) -> bool:
    return any(calls == 0 for *_, calls in result.get("answers", []))


def _loss_returned(result) -> str | None:
    """None if the last stage returned the batch's loss (its micro-batches' losses, each weighted by its share of
    the batch), every step; else what it returned."""
    for step, returned, computed, unscaled, calls in result.get("answers", []):
        if not isinstance(returned, float):
            return (f"the last stage must return the batch's loss: it returned {returned} at step {step} "
                    f"(return it as a number or a 0-d tensor)")
        if computed is not None and not math.isclose(returned, computed, rel_tol=1e-5, abs_tol=1e-6):
            said = (f"the last stage must return the batch's loss: at step {step} it returned {returned:.6g}, but "
                    f"its micro-batches' losses give {computed:.6g}")
            return said + (_scaling_hint(returned, unscaled, calls) or "")
    return None


def _scaling_hint(returned: float, unscaled: float | None, calls: int) -> str | None:
    """Why a loss (or the gradients) can be off with several micro-batches: the micro-batches' means not weighted."""
    if calls < 2 or unscaled is None:
        return None
    if math.isclose(returned, unscaled, rel_tol=1e-5):
        return (f" — that is the sum of the {calls} micro-batches' means: weight each by its share of the batch "
                f"(its rows / the batch's rows), so that the gradients are those of the batch's mean")
    if math.isclose(returned, unscaled / calls, rel_tol=1e-5):
        return (f" — that is the plain mean of the {calls} micro-batches' means: with uneven micro-batches weight each "
                f"by its share of the batch (its rows / the batch's rows)")
    return None


# ----------------------------------------------------------------------------- judging
def _run(ctx, submission, case, forward_only=False):
    """:func:`_run_once`, remembered for the rest of this grading (``ctx.memo``): several checks judge the same case."""
    return ctx.memo(("model_parallel", case, forward_only), lambda: _run_once(ctx, submission, case, forward_only))


def _mesh(case) -> bool:
    return len(case) > 6 and bool(case[6])


def _run_once(ctx, submission, case, forward_only=False):
    """The simulator first (a deadlock is named at once), then real ranks; the results of the real ones.

    The simulator runs in a rank of its own (a one-rank launch), not in this process: its two ranks are threads,
    and after torch has multiplied matrices in threads of this process, ranks forked from it later hung in their
    first matrix multiply (seen: 2 runs of the solution's grading in 6 stuck in ``Linear.forward``). The mesh case
    runs on real ranks only: the simulator runs one world of ranks, without groups.
    """
    args = (submission.two_stage_step, case[:6], forward_only, _mesh(case))
    # The reference first, here: the first optimiser built imports torch._dynamo (~5 s); once in this process,
    # not again in every rank forked below (measured: the first check took 9.6 s instead of 0.4 s).
    _reference(*case[:2], case[3], case[4])
    if _mesh(case):
        return ctx.launch(two_stage_rank, 4, *args, case=_case_name(case))
    failed = launch(_simulated, 1, ctx, args, timeout=ctx.timeout + 10)[0]
    if failed is not None:
        raise failed
    return ctx.launch(two_stage_rank, WORLD, *args)


def _simulated(rank, world_size, ctx, args):
    """Inside a one-rank launch: the learner's step in the strict simulator; what it found wrong, or None."""
    try:
        ctx.simulate(two_stage_rank, WORLD, *args)
    except CheckFailed as failed:
        return failed
    return None


def _pipelines(case, results) -> list[tuple[str, list]]:
    """Each pipeline's two results, first stage first, with the words that name it (the mesh has two)."""
    if not _mesh(case):
        return [("", results)]
    return [(f" (the pipeline of ranks {pair})", [results[r] for r in pair]) for pair in ([0, 1], [2, 3])]


def _per_rank_records(pair):
    """Both stages report the batch's loss: the last stage's outputs give it (the harness shares it, not the ranks)."""
    per_rank = [r["records"] for r in pair]
    for step, record in enumerate(per_rank[1]):
        per_rank[0][step]["loss"] = record["loss"]
    return per_rank


def _stage_of(name: str, case) -> int:
    sizes = case[2]
    layer = int(name.split(".")[1])
    return 0 if layer < sizes[0] else 1


def _judge(case, results, kinds=("loss", "grad", "param", "output", "missing")) -> dict[int, str | None]:
    """Per stage: None if its part equals one process, else the first divergence (and what probably caused it)."""
    for where, pair in _pipelines(case, results):
        verdict = _judge_pipeline(case, pair, kinds, where)
        if any(verdict.values()):
            return verdict
    return {0: None, 1: None}


def _judge_pipeline(case, pair, kinds, where: str) -> dict[int, str | None]:
    d_hidden, n_layers, sizes, steps, batch, micro = case[:6]
    report = compare(_reference(d_hidden, n_layers, steps, batch), _per_rank_records(pair))
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
        verdict[s] = f"{_case_name(case)}{where}: {divergence}"
    if 0 in first and _all_zero(pair[0]):
        verdict[0] += (" — every gradient of the first stage is zero: it ran its backward from a zero gradient "
                       "(the gradient the last stage sends back is what its backward starts from)")
    hint = next((h for _, returned, _, unscaled, calls in pair[1]["answers"]
                 if isinstance(returned, float) for h in [_scaling_hint(returned, unscaled, calls)] if h), None)
    if hint:
        verdict = {s: v and f"{v}{hint}" for s, v in verdict.items()}
    if _never_called(pair[1]):  # what differs follows from it: say so wherever something differs
        verdict = {s: v and f"{v} — {_NEVER_CALLED}" for s, v in verdict.items()}
    return verdict


def _all_zero(result) -> bool:
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
    """The seed's two-layer network: the activations the first stage sends reach the last, whose loss (computed
    with the loss_fn given, and returned) equals one process."""
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
        problems.append(f"{_case_name(case)}: the last stage's loss is {got:.6g}, one process's {expected:.6g}: "
                        f"it did not compute the output layer on the activations the first stage computed")
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
    """Each step, each stage sent exactly one message per micro-batch, of its rows × the width, to the other stage."""
    width = boundary_width(case[0], case[1], case[2])
    rows = sorted(t.shape[0] for t in torch.empty(case[4]).tensor_split(case[5]))  # the micro-batches' rows
    problems = []
    for where, pair in _pipelines(case, results):
        ranks = [0, 1] if not where else ([0, 1] if "[0, 1]" in where else [2, 3])
        for stage in (0, 1):
            for step, sent in pair[stage]["sends"]:
                got = sorted((s["numel"], s["dst"]) for s in sent)
                want = sorted((n * width, ranks[1 - stage]) for n in rows)
                if got != want:
                    said = ", ".join(f"{n} element{'s' * (n != 1)} to rank {d}" for n, d in got) or "nothing"
                    problems.append(
                        f"step {step}{where}: {ROLE[stage]} sent {said}; expected one message per micro-batch of "
                        f"its rows × {width} ({', '.join(str(n * width) for n in rows)} elements) to rank "
                        f"{ranks[1 - stage]}: {WHAT[stage]}, nothing else")
    return problems


@check(EXERCISE, points=2, timeout=30, requires=ANSWER)
def traffic_pattern(submission, ctx):
    """Per micro-batch exactly one message of b×h elements forward (first stage → last) and one back, counted by
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
    attached = [s for _, sent in results[0]["sends"] for s in sent if s["requires_grad"]]
    if attached:
        raise CheckFailed(
            "the first stage sent activations that still require grad (not detached). It works — a send moves only "
            "the numbers — but autograd cannot follow a tensor into another process: the last stage starts a graph "
            "of its own from a new leaf, and the gradient comes back only because you send it back by hand. Send "
            "them detached to say so (torch.distributed.pipelining detaches what it sends too), and keep the "
            "activations themselves for their backward")


@check(EXERCISE, points=1, hidden=True, timeout=30, requires=ANSWER)
def other_splits_and_sizes(submission, ctx):
    """A three-layer network split [2, 1] and [1, 2], hidden 24, a batch of 7 in 3 micro-batches, 2 steps; and the
    two-layer network on a 2 × 2 mesh, each pipeline its pp group ([0, 1] and [2, 3], group=mesh["pp"])."""
    cases = [(24, 3, (2, 1), 2, 7, 3), (24, 3, (1, 2), 2, 7, 3), (64, 2, (1, 1), 2, 10, 3, True)]
    return partial_credit([_case_outcome(ctx, submission, case) for case in cases])


def _case_outcome(ctx, submission, case) -> str | None:
    """None if ``case`` trains as one process, else what went wrong; a crash costs only this case."""
    try:
        return _right(ctx, submission, case)[1]
    except (NotDone, Deadlocked):
        raise
    except CheckFailed as failed:
        return f"{_case_name(case)}: {failed}"
