"""Checks of exercise 05 (``exercises/05_tensor_parallel.ipynb``): column- and row-parallel linear layers.

    from coursekit.grading import check_tensor_parallel
    from coursekit.grading.tensor_tools import all_gather, all_reduce, shard_range
    check_tensor_parallel(ColumnParallelLinear, RowParallelLinear)

The learner writes two ``nn.Module`` classes, each built from a dense ``nn.Linear`` that every rank
passes identically, ``Layer(dense, group=None)``, keeping its shard as ``self.weight`` (and ``self.bias``):

* ``ColumnParallelLinear``: rank r keeps the rows ``shard_range(out_features)`` of ``dense.weight`` (and
  of its bias); ``forward(x)`` takes the whole input and returns this rank's slice of the output
  features, with **f** on the input (identity forward, all-reduce of the gradient backward);
* ``RowParallelLinear``: rank r keeps the columns ``shard_range(in_features)`` of ``dense.weight`` and the
  whole bias; ``forward(x_r)`` takes this rank's slice of the input features and returns the whole output
  on every rank: **g** (all-reduce forward, identity backward), the bias added once, after the sum.

Collectives go through :func:`all_reduce` and :func:`all_gather` of this module, which count every call,
in forward and in backward (``torch.distributed``'s own are switched off while grading). The checks run
the layers on real ranks against the dense layer: outputs, the input gradient, the weight and bias
gradients of every shard, and the collectives issued (column: none forward, one all-reduce of the input
backward; row: one all-reduce of the output forward, none backward; the MLP built from the two: exactly
one each way). Sizes are uneven where the degree does not divide them (7 features on 2 and 4 ranks).

What a typical mistake is told (each seen in ``tests/submissions/tensor_parallel/``):

* the weights all-gathered instead (each rank rebuilds the dense matrix and multiplies all of it): partial
  credit, and why that is not tensor parallelism;
* the row-parallel bias added on every rank (before the sum, or without one): the output is off by
  (t − 1) × the bias; added before the sum on one rank only, the output is right but no gradient reaches
  the other ranks' copies (a parameter left without a gradient is named as such, not as a difference);
* **f** without its backward all-reduce: each rank's input gradient is only its shard's part.
"""

from __future__ import annotations

from .guard import forbid_torch_collectives
from .registry import check
from .scoring import CheckFailed, NotDone, partial_credit
from .tensor_parallel_cases import all_parts
from .tensor_tools import all_gather, all_reduce, shard_range

__all__ = ["all_reduce", "all_gather", "shard_range", "EXERCISE"]  # the learner's tools, also from here

EXERCISE = "05_tensor_parallel"  # registered in registry.EXERCISES
INSTEAD = ("use the counted collectives of this exercise (from coursekit.grading.tensor_tools import all_reduce, "
           "all_gather), so that the grader sees every one")


def _results(submission, ctx, world_size: int) -> list[dict] | CheckFailed:
    """Every part's results on each rank of ``world_size`` (one rank: in this process, no launch).

    The three checks of one grading share one launch per world size (``ctx.memo``).
    """
    classes = (submission.ColumnParallelLinear, submission.RowParallelLinear)
    if world_size == 1:
        def compute():
            with forbid_torch_collectives(INSTEAD):
                return [all_parts(0, 1, *classes)]
    else:
        def compute():
            return ctx.launch_case(all_parts, world_size, *classes)
    return ctx.memo(("tensor_parallel", world_size), compute)


# ----------------------------------------------------------------------------- judging
TOL = 1e-4
WORLD_SIZES = (2, 4)  # 7 features: 4 + 3 and 2 + 2 + 2 + 1 (uneven); the MLP's 10 hidden: 5 + 5 and 3, 3, 2, 2


def _counts(calls, op: str, phase: str) -> list[int]:
    return [n for o, p, _, n in calls if o == op and p == phase]


def _gathered_weights(calls, weight_numels) -> bool:
    """An all-gather in forward of a tensor the size of this rank's weight shard: the weights, not activations."""
    return any(o == "all_gather" and p == "forward" and n in weight_numels for o, p, _, n in calls)


GATHERED = ("you all-gather the weight shards in forward: every rank then holds the whole matrix and does all of "
            "the multiplication itself, so neither the memory nor the arithmetic is split — that is one GPU's "
            "work repeated t times, not tensor parallelism (partial credit). Keep each rank's shard and communicate "
            "activations instead: f (all-reduce of the input gradient) before a column-parallel layer, g "
            "(all-reduce of the partial outputs) after a row-parallel one.")
F_NO_BACKWARD = ("the input gradient on each rank is only its own shard's part (grad_Y_r · W_r): f, before the "
                 "column-parallel layer, must all-reduce the input's gradient in backward (identity forward, "
                 "all-reduce backward) — every rank read the whole input, so every rank's part must be summed")
BIAS_EVERY_RANK = ("the output is off by (t − 1) × the bias: every rank added the bias (before the sum, or without "
                   "one), so the sum holds it t times. Add it after g's all-reduce, on every rank: the output then "
                   "holds it once, and every rank's copy of the bias gets its gradient")


def _error(r: dict, where: str) -> str:
    return f"{where}: {r['error']}" + (f" ({r['where']})" if r["where"] else "")


def _judge_layer(kind: str, per_rank: list[dict], world_size: int) -> tuple[str | None, bool]:
    """(what is wrong with this world size's case, or None; whether the weights were gathered)."""
    gathered = False
    for rank, r in enumerate(per_rank):
        where = f"world size {world_size}, rank {rank}"
        if "error" in r:
            return _error(r, where), False
        piece = "rows" if kind == "column" else "columns"
        if r["weight shape"] != r["expected weight"]:
            return (f"{where}: self.weight has shape {r['weight shape']}; a {kind}-parallel rank keeps only "
                    f"{piece} [{r[piece][0]}, {r[piece][1]}) of the dense weight: shape {r['expected weight']}"), False
        gathered |= _gathered_weights(r["calls"], {r["weight numel"]})
        if kind == "column" and r["output shape"] != (3, 4, r["rows"][1] - r["rows"][0]):
            return (f"{where}: the output has shape {r['output shape']}; a column-parallel layer returns this "
                    f"rank's slice of the output features, (3, 4, {r['rows'][1] - r['rows'][0]})"), gathered
        if not r["output"] < TOL:
            if kind == "row" and world_size > 1 and r["bias t times"] < TOL:
                return f"{where}: {BIAS_EVERY_RANK}", gathered
            return f"{where}: the output differs from the dense layer's by {r['output']:.3g}", gathered
        if not r["input grad"] < TOL:
            if kind == "column" and world_size > 1 and r["input grad is the shard's part"] < TOL:
                return f"{where}: {F_NO_BACKWARD}", gathered
            return f"{where}: the input's gradient differs from the dense layer's by {r['input grad']:.3g}", gathered
        for name in ("weight", "bias"):
            if name in r["no grad"]:  # not "differs by inf": say what is missing (a bias added on one rank only)
                return f"{where}: no gradient reached self.{name} (is it used in forward?)", gathered
            if not r[f"{name} grad"] < TOL:
                return f"{where}: the {name}'s gradient differs by {r[f'{name} grad']:.3g}", gathered
        if world_size > 1 and not gathered:
            want = ({"forward": 0, "backward": 1} if kind == "column" else {"forward": 1, "backward": 0})
            got = {phase: len(_counts(r["calls"], "all_reduce", phase)) for phase in want}
            if got != want:
                return (f"{where}: {got['forward']} all-reduce(s) in forward and {got['backward']} in backward; a "
                        f"{kind}-parallel layer issues {want['forward']} and {want['backward']} "
                        + ("(f: identity forward, all-reduce of the input's gradient backward)" if kind == "column"
                           else "(g: all-reduce of the partial outputs forward, identity backward)")), gathered
    return None, gathered


def _score_layer(submission, ctx, kind: str) -> float:
    outcomes, preconditions, gathered = [], [], False
    for world_size in (1, *WORLD_SIZES):
        results = _results(submission, ctx, world_size)
        if isinstance(results, CheckFailed):
            outcome = str(results)
        else:
            per_rank = [r[kind] for r in results]
            _refuse(per_rank)
            outcome, case_gathered = _judge_layer(kind, per_rank, world_size)
            gathered |= case_gathered
        (preconditions if world_size == 1 else outcomes).append(outcome)
    return _with_gathered(outcomes, preconditions, gathered)


def _refuse(per_rank: list[dict]) -> None:
    """An unfinished part (NotImplementedError) or a call to torch.distributed ends its check at once."""
    if all(r.get("not done") for r in per_rank):
        raise NotDone("not implemented yet (your class raises NotImplementedError)")
    forbidden = next((r["error"] for r in per_rank if r.get("error", "").startswith("ForbiddenCall")), None)
    if forbidden:
        raise CheckFailed(forbidden.split(": ", 1)[1])


def _with_gathered(outcomes, preconditions, gathered: bool) -> float:
    """partial_credit, halved (with the reason) when the weights were gathered instead of split."""
    try:
        fraction = partial_credit(outcomes, preconditions)
    except CheckFailed as failed:
        if not gathered:
            raise
        raise CheckFailed(f"{GATHERED}\n{failed}", fraction=failed.fraction / 2) from None
    if gathered:
        raise CheckFailed(GATHERED, fraction=fraction / 2)
    return fraction


@check(EXERCISE, points=3, timeout=60)
def column_parallel_linear(submission, ctx):
    """Column-parallel Linear(5, 7) on 2 and 4 ranks (one rank must work too): this rank's output slice, the whole
    input's gradient (f's all-reduce), its rows' gradients; 0 all-reduces forward, 1 backward."""
    return _score_layer(submission, ctx, "column")


@check(EXERCISE, points=3, timeout=60)
def row_parallel_linear(submission, ctx):
    """Row-parallel Linear(7, 4) on 2 and 4 ranks (one rank must work too): the whole output on every rank (g's
    all-reduce, the bias once), its input columns' and weight columns' gradients; 1 all-reduce forward, 0 backward."""
    return _score_layer(submission, ctx, "row")


@check(EXERCISE, points=4, timeout=60)
def mlp_one_all_reduce_each_way(submission, ctx):
    """The MLP out(gelu(fc(x))), fc column- and out row-parallel, on 2 and 4 ranks (10 hidden features: 3, 3, 2, 2;
    one rank must work too):
    the dense MLP's output and every gradient, with exactly one all-reduce forward and one backward, no all-gather."""
    outcomes, preconditions, gathered = [], [], False
    for world_size in (1, *WORLD_SIZES):
        results = _results(submission, ctx, world_size)
        if isinstance(results, CheckFailed):
            (preconditions if world_size == 1 else outcomes).append(str(results))
            continue
        per_rank = [r["mlp"] for r in results]
        _refuse(per_rank)
        outcomes.append(None)
        for rank, r in enumerate(per_rank):
            where = f"world size {world_size}, rank {rank}"
            if "error" in r:
                outcomes[-1] = _error(r, where)
                break
            gathered |= _gathered_weights(r["calls"], r["weight numels"])
            bad = {name: d for name, d in r["grads"].items() if not d < TOL}
            calls = {(o, p): len(_counts(r["calls"], o, p)) for o in ("all_reduce", "all_gather")
                     for p in ("forward", "backward")}
            want = {("all_reduce", "forward"): 1, ("all_reduce", "backward"): 1, ("all_gather", "forward"): 0,
                    ("all_gather", "backward"): 0}
            if not r["output"] < TOL:
                outcomes[-1] = f"{where}: the MLP's output differs from the dense one's by {r['output']:.3g}"
            elif not r["input grad"] < TOL:
                outcomes[-1] = f"{where}: the input's gradient differs from the dense MLP's by {r['input grad']:.3g}"
            elif r["no grad"]:
                outcomes[-1] = f"{where}: no gradient reached {', '.join(r['no grad'])} (is it used in forward?)"
            elif bad:
                outcomes[-1] = f"{where}: gradients differ: " + ", ".join(f"{n} by {d:.3g}" for n, d in bad.items())
            elif calls != want and not gathered:
                outcomes[-1] = (f"{where}: collectives issued " + ", ".join(f"{o} {p}: {n}" for (o, p), n in
                                                                           calls.items() if n)
                                + "; column then row needs exactly 1 all-reduce forward (g) and 1 backward (f)")
            if outcomes[-1]:
                break
        if world_size == 1:
            preconditions.append(outcomes.pop())
    return _with_gathered(outcomes, preconditions, gathered)
