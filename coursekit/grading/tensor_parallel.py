"""Checks of exercise 05 (``exercises/05_tensor_parallel.ipynb``): f, g and the column- and row-parallel layers.

    from coursekit.grading import check_tensor_parallel
    from coursekit.grading.tensor_tools import all_gather, all_reduce, shard_range
    check_tensor_parallel(ColumnParallelLinear, RowParallelLinear, CopyToParallelRegion, ReduceFromParallelRegion)

The learner writes, from a contract (the notebook states the inputs, the outputs, the primitives and the
properties, no line of code), Megatron-LM's two operators as ``torch.autograd.Function`` classes called
``Operator.apply(tensor, group)`` -- **f** (``CopyToParallelRegion``: identity forward, all-reduce of the
gradient backward) and **g** (``ReduceFromParallelRegion``: all-reduce forward, identity backward) -- and two
``nn.Module`` classes, each built from a dense ``nn.Linear`` that every rank passes identically,
``Layer(dense, group=None)``, keeping its shard as ``self.weight`` (and ``self.bias``):

* ``ColumnParallelLinear``: rank r keeps the rows ``shard_range(out_features)`` of ``dense.weight`` (and
  of its bias); ``forward(x)`` takes the whole input and returns this rank's slice of the output
  features, with **f** on the input (identity forward, all-reduce of the gradient backward);
* ``RowParallelLinear``: rank r keeps the columns ``shard_range(in_features)`` of ``dense.weight`` and the
  whole bias; ``forward(x_r)`` takes this rank's slice of the input features and returns the whole output
  on every rank: **g** (all-reduce forward, identity backward), the bias added once, after the sum.

Collectives go through :func:`all_reduce` and :func:`all_gather` of this module, which count every call,
in forward and in backward (``torch.distributed``'s own are switched off while grading). The checks run
f and g alone and the layers on real ranks against one process: outputs, the input gradient, the weight and
bias gradients of every shard, each over the layer's group (the answer: ``f_and_g``,
``column_parallel_linear``, ``row_parallel_linear``). Its properties score only while it is right: the MLP built
from the two layers (the dense MLP's numbers with exactly one all-reduce each way) and ``traffic``, the
elements each part all-reduces per pass, counted by amount (column: the input's gradient backward, none
forward; row: the output forward, none backward; f and g likewise; the MLP: one of each). Sizes are uneven
where the degree does not divide them (7 features on 2, 3 and 4 ranks). Each check has four cases that earn
points: the whole world of 2, 3 and 4 ranks as the group, and 4 ranks as two tensor-parallel groups {0, 1}
and {2, 3} of a ``Mesh({"dp": 2, "tp": 2})`` with different inputs in each (one rank is a precondition).

What a typical mistake is told (each seen in ``tests/submissions/tensor_parallel/``; the detection lives in
:mod:`.tensor_parallel_mistakes`):

* ``group=`` ignored (the world's all-reduce, or the world's shards): which ranks the collective ran over,
  not the layer's group, and to pass ``group=`` to every collective and to ``shard_range``;
* f and g swapped (the all-reduce in the other pass), and g left out (each rank's partial sum returned):
  named as such, with where each operator's all-reduce belongs; f or g alone with its all-reduce in the wrong
  pass, or missing, named from what came out (:func:`.tensor_parallel_mistakes.operator_mistake`);

* the weights all-gathered instead (each rank rebuilds the dense matrix and multiplies all of it): partial
  credit, and why that is not tensor parallelism;
* the row-parallel bias added on every rank (before the sum, or without one): the output is off by
  (t − 1) × the bias; added before the sum on one rank only, the output is right but no gradient reaches
  the other ranks' copies (a parameter left without a gradient is named as such, not as a difference);
* **f** without its backward all-reduce: each rank's input gradient is only its shard's part.

The MLP names the same mistakes (which of its two layers all-reduced in forward tells f from g).
"""

from __future__ import annotations

import torch

from ..answers import held_back
from ..comm.mesh import groups_along
from .feedback import is_stub
from .guard import forbid_torch_collectives
from .registry import check
from .scoring import CheckFailed, NotDone, partial_credit
from .tensor_parallel_cases import all_parts
from .tensor_parallel_mistakes import (TOL, as_set, column_mistake, count, mlp_mistake, operator_mistake,
                                       row_mistake, world_shard, wrong_group)
from .tensor_tools import all_gather, all_reduce, shard_range

__all__ = ["all_reduce", "all_gather", "shard_range", "EXERCISE", "CASES"]  # the learner's tools, also from here

EXERCISE = "05_tensor_parallel"  # registered in registry.EXERCISES
# The checks that judge the answer; the others judge its properties and earn nothing while it is wrong.
ANSWER = ("f_and_g", "column_parallel_linear", "row_parallel_linear")
INSTEAD = ("use the counted collectives of this exercise (from coursekit.grading.tensor_tools import all_reduce, "
           "all_gather), so that the grader sees every one")

# (world size, tensor-parallel degree: None is the whole world as the group). 7 features: 4 + 3, 3 + 2 + 2 and
# 2 + 2 + 2 + 1 (uneven); the MLP's 10 hidden: 5 + 5, 4 + 3 + 3 and 3, 3, 2, 2. The last: Mesh({"dp": 2, "tp": 2}),
# groups {0, 1} and {2, 3}.
CASES = ((1, None), (2, None), (3, None), (4, None), (4, 2))
PARTS = ("ColumnParallelLinear", "RowParallelLinear", "CopyToParallelRegion", "ReduceFromParallelRegion")


def _label(world_size: int, tp: int | None) -> str:
    if tp is None:
        return f"world size {world_size}"
    groups = groups_along(torch.arange(world_size).view(world_size // tp, tp), 1)
    return f"world size {world_size} in tensor-parallel groups {' and '.join(map(as_set, groups))}"


def _results(submission, ctx, world_size: int, tp: int | None) -> list[dict] | CheckFailed:
    """Every part's results on each rank of one case (one rank: in this process, no launch).

    The three checks of one grading share one launch per case (``ctx.memo``). A class not written yet (the
    entry's ``not_done`` stand-in for ``None``) travels as None, and only its parts are "not done": handed to the
    ranks, it would make ``ctx`` refuse the whole launch, the part that is written too (the notebook's Part 1 cell).
    """
    classes = tuple(None if is_stub(c) else c for c in (getattr(submission, part) for part in PARTS))
    if world_size == 1:
        def compute():
            with forbid_torch_collectives(INSTEAD), held_back(EXERCISE):
                return [all_parts(0, 1, *classes)]
    else:
        def compute():
            return ctx.launch_case(all_parts, world_size, *classes, tp)
    return ctx.memo(("tensor_parallel", world_size, tp), compute)


# ----------------------------------------------------------------------------- judging
def _gathered_weights(calls, weight_numels) -> bool:
    """An all-gather in forward of a tensor the size of this rank's weight shard: the weights, not activations."""
    return any(c.op == "all_gather" and c.phase == "forward" and c.numel in weight_numels for c in calls)


GATHERED = ("you all-gather the weight shards in forward: every rank then holds the whole matrix and does all of "
            "the multiplication itself, so neither the memory nor the arithmetic is split — that is one GPU's "
            "work repeated on each of the group's t ranks, not tensor parallelism (partial credit). Keep each rank's shard and communicate "
            "activations instead: f (all-reduce of the input gradient) before a column-parallel layer, g "
            "(all-reduce of the partial outputs) after a row-parallel one.")


def _error(r: dict, where: str) -> str:
    return f"{where}: {r['error']}" + (f" ({r['where']})" if r["where"] else "")


def _shape_problem(kind: str, r: dict, where: str) -> str | None:
    piece = "rows" if kind == "column" else "columns"
    if r["weight shape"] == r["expected weight"]:
        return None
    shard = world_shard(r)  # "self.weight holds rows [0, 2) of a split over the whole world ..."
    if shard:
        return f"{where}: {shard} (and to every collective)"
    return (f"{where}: self.weight has shape {r['weight shape']}; a {kind}-parallel rank keeps only {piece} "
            f"[{r[piece][0]}, {r[piece][1]}) of the dense weight: shape {r['expected weight']}")


def _numbers_problem(kind: str, r: dict, where: str) -> str | None:
    """What is wrong with the output or the gradients, the mistake named where it is recognised."""
    width = r["rows"][1] - r["rows"][0] if kind == "column" else None
    if kind == "column" and r["output shape"] != (3, 4, width):
        return (f"{where}: the output has shape {r['output shape']}; a column-parallel layer returns this "
                f"rank's slice of the output features, (3, 4, {width})")
    if not r["output"] < TOL or not r["input grad"] < TOL:
        named = (column_mistake if kind == "column" else row_mistake)(r)
        if named:
            return f"{where}: {named}"
        if not r["output"] < TOL:
            return f"{where}: the output differs from the dense layer's by {r['output']:.3g}"
        return f"{where}: the input's gradient differs from the dense layer's by {r['input grad']:.3g}"
    for name in ("weight", "bias"):
        if name in r["no grad"]:  # not "differs by inf": say what is missing (a bias added on one rank only)
            return f"{where}: no gradient reached self.{name} (is it used in forward?)"
        if not r[f"{name} grad"] < TOL:
            return f"{where}: the {name}'s gradient differs by {r[f'{name} grad']:.3g}"
    return None


def _judge_layer(kind: str, per_rank: list[dict], label: str) -> tuple[str | None, bool]:
    """(what is wrong with this case, or None; whether the weights were gathered)."""
    gathered = False
    for rank, r in enumerate(per_rank):
        where = f"{label}, rank {rank}"
        ignored = wrong_group(r)
        if ignored:
            return f"{where}: {ignored}", False
        if "error" in r:
            shard = world_shard(r)  # the weights cut over the world: a shape error follows in forward
            return (f"{where}: {shard} (and to every collective)" if shard else _error(r, where)), False
        problem = _shape_problem(kind, r, where)
        if problem:
            return problem, False
        gathered |= _gathered_weights(r["calls"], {r["weight numel"]})
        problem = _numbers_problem(kind, r, where)
        if problem:
            return problem, gathered
    return None, gathered


def _score(submission, ctx, parts: tuple[str, ...], judge) -> float:
    """partial_credit over :data:`CASES` of ``judge(per_rank, label) -> (problem, gathered)`` for ``parts``: each
    rank's results of those parts, ``{part: results}``."""
    outcomes, preconditions, gathered = [], [], False
    for world_size, tp in CASES:
        results = _results(submission, ctx, world_size, tp)
        if isinstance(results, CheckFailed):
            outcome = str(results)
        else:
            per_rank = [{part: r[part] for part in parts} for r in results]
            _refuse({part: [r[part] for r in results] for part in parts})
            outcome, case_gathered = judge(per_rank, _label(world_size, tp))
            gathered |= case_gathered
        (preconditions if world_size == 1 else outcomes).append(outcome)
    return _with_gathered(outcomes, preconditions, gathered)


def _said_once(lines: list[str]) -> str:
    """Each case's line is ``"<case, rank>: <mistake>"``: the cases with the same mistake named together, it once."""
    heads: dict[str, list[str]] = {}
    for line in lines:
        head, _, mistake = line.partition(": ") if line.startswith("world size") else ("", "", line)
        heads.setdefault(mistake, []).append(head)
    return "\n".join(("; ".join(h for h in where if h) + ": " if any(where) else "") + mistake
                     for mistake, where in heads.items())


NAMES = {"f": "CopyToParallelRegion (f)", "g": "ReduceFromParallelRegion (g)", "column": "ColumnParallelLinear",
         "row": "RowParallelLinear", "mlp": "ColumnParallelLinear or RowParallelLinear"}


def _refuse(parts: dict[str, list[dict]]) -> None:
    """A part not written yet (NotImplementedError on every rank: the check names it) or a call to torch.distributed
    ends the check at once. ``parts``: each part's results, per rank."""
    unwritten = [part for part, per_rank in parts.items() if all(r.get("not done") for r in per_rank)]
    if unwritten:
        raise NotDone("not implemented yet: " + " and ".join(map(NAMES.get, unwritten))
                      + " (still None, or raising NotImplementedError)")
    forbidden = next((r["error"] for per_rank in parts.values() for r in per_rank
                      if r.get("error", "").startswith("ForbiddenCall")), None)
    if forbidden:
        raise CheckFailed(forbidden.split(": ", 1)[1])


def _with_gathered(outcomes, preconditions, gathered: bool) -> float:
    """partial_credit (a mistake several cases share said once), halved (with the reason) when the weights were
    gathered instead of split."""
    try:
        fraction = partial_credit(outcomes, preconditions)
    except CheckFailed as failed:
        said = _said_once(str(failed).splitlines())
        raise CheckFailed(f"{GATHERED}\n{said}" if gathered else said,
                          fraction=failed.fraction / 2 if gathered else failed.fraction) from None
    if gathered:
        raise CheckFailed(GATHERED, fraction=fraction / 2)
    return fraction


def _judge_mlp(per_rank: list[dict], label: str) -> tuple[str | None, bool]:
    """The MLP's case: the dense MLP's numbers, 1 all-reduce each way over the group, no all-gather."""
    gathered, per_rank = False, [r["mlp"] for r in per_rank]
    want = {("all_reduce", "forward"): 1, ("all_reduce", "backward"): 1, ("all_gather", "forward"): 0,
            ("all_gather", "backward"): 0}
    for rank, r in enumerate(per_rank):
        where = f"{label}, rank {rank}"
        ignored = wrong_group(r)
        if ignored:
            return f"{where}: {ignored}", gathered
        if "error" in r:
            return _error(r, where), gathered
        gathered |= _gathered_weights(r["calls"], r["weight numels"])
        bad = {name: d for name, d in r["grads"].items() if not d < TOL}
        calls = {(o, p): count(r["calls"], o, p) for o, p in want}
        named = mlp_mistake(r)
        if named:
            return f"{where}: {named}", gathered
        if not r["output"] < TOL:
            return f"{where}: the MLP's output differs from the dense one's by {r['output']:.3g}", gathered
        if not r["input grad"] < TOL:
            return f"{where}: the input's gradient differs from the dense MLP's by {r['input grad']:.3g}", gathered
        if r["no grad"]:
            return f"{where}: no gradient reached {', '.join(r['no grad'])} (is it used in forward?)", gathered
        if bad:
            return f"{where}: gradients differ: " + ", ".join(f"{n} by {d:.3g}" for n, d in bad.items()), gathered
        if calls != want and not gathered:
            return (f"{where}: collectives issued " + ", ".join(f"{o} {p}: {n}" for (o, p), n in calls.items() if n)
                    + "; column then row needs exactly 1 all-reduce forward (g) and 1 backward (f)"), gathered
    return None, gathered


CALLED_AS = ("f and g are called as Operator.apply(tensor, group): forward takes (ctx, tensor, group), and backward "
             "returns one gradient per input of forward, None for the group")


def _operator_error(r: dict, where: str) -> str:
    """An error of f or g alone, its likely cause named where it is the signature (group= left out)."""
    error = r["error"]
    if error.startswith("TypeError") and "positional argument" in error or "incorrect number of gradients" in error:
        return f"{where}: {CALLED_AS} ({error})"
    return _error(r, where)


def _judge_operators(per_rank: list[dict], label: str) -> tuple[str | None, bool]:
    """f and g alone: f's output the input, its input gradient the group's sum; g the other way round."""
    for rank, both in enumerate(per_rank):
        for name, r in both.items():
            where = f"{label}, rank {rank}, {name}"
            problem = wrong_group(r) or (_operator_error(r, where) if "error" in r else None)
            if problem or (problem := operator_mistake(name, r)):
                return (problem if problem.startswith(where) else f"{where}: {problem}"), False
    return None, False


@check(EXERCISE, points=2, timeout=60)
def f_and_g(submission, ctx):
    """f (CopyToParallelRegion) and g (ReduceFromParallelRegion) alone on 2, 3 and 4 ranks and on two groups of 2, each
    rank its own input: f's output is the input and its input's gradient the group's sum; g's output is the group's
    sum and its input's gradient the output's."""
    return _score(submission, ctx, ("f", "g"), _judge_operators)


@check(EXERCISE, points=3, timeout=60)
def column_parallel_linear(submission, ctx):
    """Column-parallel Linear(5, 7) on 2, 3 and 4 ranks and on two groups of 2 (one rank must work too): this rank's
    output slice, the whole input's gradient (f's all-reduce), its rows' gradients, over the layer's group."""
    return _score(submission, ctx, ("column",),
                  lambda per_rank, label: _judge_layer("column", [r["column"] for r in per_rank], label))


@check(EXERCISE, points=3, timeout=60)
def row_parallel_linear(submission, ctx):
    """Row-parallel Linear(7, 4) on 2, 3 and 4 ranks and on two groups of 2 (one rank must work too): the whole output
    on every rank (g's all-reduce, the bias once), its input columns' and weight columns' gradients, over the
    layer's group."""
    return _score(submission, ctx, ("row",),
                  lambda per_rank, label: _judge_layer("row", [r["row"] for r in per_rank], label))


@check(EXERCISE, points=2, timeout=60, requires=ANSWER)
def mlp_one_all_reduce_each_way(submission, ctx):
    """The MLP out(gelu(fc(x))), fc column- and out row-parallel, on 2, 3 and 4 ranks and on two groups of 2 (10 hidden
    features; one rank must work too): the dense MLP's output and every gradient, with exactly one all-reduce
    forward and one backward over the layer's group, no all-gather."""
    return _score(submission, ctx, ("mlp",), _judge_mlp)


WHY = {"f": "f sums only the input's gradient, in backward", "g": "g sums only the partial results, in forward",
       "column": "f's all-reduce of the input's gradient, in backward", "row": "g's all-reduce of the partial "
       "outputs, in forward", "mlp": "g's all-reduce of the output forward, f's of the input's gradient backward"}


def _judge_traffic(per_rank: list[dict], label: str) -> tuple[str | None, bool]:
    """Each part's collectives, by amount: one all-reduce of the tensor that needs summing per pass, nothing else."""
    for rank, parts in enumerate(per_rank):
        for name, r in parts.items():
            if "error" in r:  # judged only after a right answer: an error here is the MLP's, said there
                return _error(r, f"{label}, rank {rank}, {name}"), False
            if len(r["group ranks"]) == 1:
                continue
            for phase, least in r["least"].items():
                calls = [c for c in r["calls"] if c.phase == phase]
                if [(c.op, c.numel) for c in calls] == ([("all_reduce", least)] if least else []):
                    continue
                moved = ", ".join(f"{c.op.replace('_', '-')} of {c.numel}" for c in calls) or "nothing"
                least_said = f"one all-reduce of {least} elements" if least else "no collective"
                return (f"{label}, rank {rank}, {name}: in {phase}, {moved}; the least is {least_said} "
                        f"({WHY[name]})"), False
    return None, False


@check(EXERCISE, points=2, timeout=60, requires=ANSWER)
def traffic(submission, ctx):
    """Counted by amount, on 2, 3 and 4 ranks and on two groups of 2: f, g, each layer and the MLP move only what must
    be summed, one all-reduce of it per pass where one is needed and no collective where none is."""
    return _score(submission, ctx, ("f", "g", "column", "row", "mlp"), _judge_traffic)
