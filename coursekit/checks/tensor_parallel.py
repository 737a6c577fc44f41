"""Checks of exercise 05 (``exercises/05_tensor_parallel.ipynb``): column- and row-parallel linear layers.

    from coursekit.checks.tensor_parallel import all_reduce, all_gather, shard_range, check_tensor_parallel
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

import traceback
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .. import grading
from ..parallel.tensor import shard_sizes

__all__ = ["all_reduce", "all_gather", "shard_range", "check_tensor_parallel", "EXERCISE"]

EXERCISE = "05_tensor_parallel"  # registered in grading.EXERCISE_MODULES
INSTEAD = ("use the counted collectives of this exercise (from coursekit.checks.tensor_parallel import all_reduce, "
           "all_gather), so that the grader sees every one")

# The real functions, bound at import: while grading, torch.distributed's names are replaced by ones that refuse.
_ALL_REDUCE, _ALL_GATHER = dist.all_reduce, dist.all_gather
_CALLS: list[tuple[str, str, tuple, int]] = []   # (op, phase, shape of the tensor passed, elements), this rank
_PHASE = ["outside"]


# ----------------------------------------------------------------------------- the learner's tools
def _rank_size(group=None) -> tuple[int, int]:
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def shard_range(total: int, group=None) -> tuple[int, int]:
    """``(start, stop)``: the rows (or columns) of ``total`` this rank keeps, as ``torch.tensor_split`` cuts them.

        >>> shard_range(7)            # one process: everything
        (0, 7)
    """
    rank, size = _rank_size(group)
    sizes = shard_sizes(total, size, "size")
    return sum(sizes[:rank]), sum(sizes[:rank + 1])


def all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``tensor`` over the ranks of ``group``, in place; returns it. Counted (nothing happens on one rank)."""
    _CALLS.append(("all_reduce", _PHASE[0], tuple(tensor.shape), tensor.numel()))
    if _rank_size(group)[1] > 1:
        _ALL_REDUCE(tensor, group=group)
    return tensor


def all_gather(tensor: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along ``dim`` in rank order (sizes along ``dim`` may differ). Counted."""
    _CALLS.append(("all_gather", _PHASE[0], tuple(tensor.shape), tensor.numel()))
    size = _rank_size(group)[1]
    if size == 1:
        return tensor.clone()
    dim = dim % tensor.dim()
    lengths = [torch.zeros(1, dtype=torch.long) for _ in range(size)]
    _ALL_GATHER(lengths, torch.tensor([tensor.shape[dim]]), group=group)
    widest = int(max(lengths))
    padded = F.pad(tensor, [0, 0] * (tensor.dim() - 1 - dim) + [0, widest - tensor.shape[dim]]).contiguous()
    pieces = [torch.empty_like(padded) for _ in range(size)]
    _ALL_GATHER(pieces, padded, group=group)
    return torch.cat([p.narrow(dim, 0, int(n)) for p, n in zip(pieces, lengths)], dim=dim)


def check_tensor_parallel(ColumnParallelLinear=None, RowParallelLinear=None, **options) -> grading.Report:
    """Grade exercise 05: pass the two classes you wrote (``None`` for a part not done yet)."""
    class NotDoneYet(nn.Module):
        def __init__(self, *args, **kwargs):
            raise NotImplementedError
    return grading.grade(EXERCISE, ColumnParallelLinear=ColumnParallelLinear or NotDoneYet,
                         RowParallelLinear=RowParallelLinear or NotDoneYet, **options)


# ----------------------------------------------------------------------------- running the layers on ranks
@contextmanager
def _phase(name: str):
    _PHASE[0] = name
    try:
        yield
    finally:
        _PHASE[0] = "outside"


def _dense(in_features: int, out_features: int, seed: int) -> nn.Linear:
    """A dense layer with every weight and bias random (a zero bias would hide a bias added t times)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        layer = nn.Linear(in_features, out_features)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
    return layer


def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _diff(a, b) -> float:
    if a is None or b is None or tuple(a.shape) != tuple(b.shape):
        return float("inf")
    return (a.detach() - b.detach()).abs().max().item()


def _grad(layer, name):
    param = getattr(layer, name, None)
    return None if not isinstance(param, torch.Tensor) else param.grad


def _no_grad(layers: dict) -> list[str]:
    """The parameters (``{label: (layer, name)}``) that backward left without a gradient: not used in forward."""
    return [label for label, (layer, name) in layers.items()
            if isinstance(getattr(layer, name, None), torch.Tensor) and _grad(layer, name) is None]


def _shape(layer, name):
    param = getattr(layer, name, None)
    return None if not isinstance(param, torch.Tensor) else tuple(param.shape)


def _column_case(Column, rank, world_size) -> dict:
    """Linear(5, 7) column-parallel: this rank's output slice, the whole input's gradient, its rows' gradients."""
    dense, x, grad_out = _dense(5, 7, seed=1), _randn(3, 4, 5, seed=2), _randn(3, 4, 7, seed=3)
    start, stop = shard_range(7)
    layer = Column(dense, None)
    inputs = x.clone().requires_grad_(True)
    with _phase("forward"):
        y = layer(inputs)
    with _phase("backward"):
        y.backward(grad_out[..., start:stop] if tuple(y.shape) == (3, 4, stop - start) else torch.ones_like(y))
    reference = x.clone().requires_grad_(True)
    dense(reference).backward(grad_out)
    mine = dense.weight.detach()[start:stop]
    return {"rows": (start, stop), "weight shape": _shape(layer, "weight"), "expected weight": tuple(mine.shape),
            "output shape": tuple(y.shape), "output": _diff(y, dense(x)[..., start:stop]),
            "input grad": _diff(inputs.grad, reference.grad),
            "input grad is the shard's part": _diff(inputs.grad, grad_out[..., start:stop] @ mine),
            "weight grad": _diff(_grad(layer, "weight"), dense.weight.grad[start:stop]),
            "bias grad": _diff(_grad(layer, "bias"), dense.bias.grad[start:stop]),
            "no grad": _no_grad({name: (layer, name) for name in ("weight", "bias")}),
            "weight numel": mine.numel(), "x numel": x.numel()}


def _row_case(Row, rank, world_size) -> dict:
    """Linear(7, 4) row-parallel: this rank's input columns in, the whole output out on every rank."""
    dense, x, grad_out = _dense(7, 4, seed=4), _randn(3, 4, 7, seed=5), _randn(3, 4, 4, seed=6)
    start, stop = shard_range(7)
    layer = Row(dense, None)
    inputs = x[..., start:stop].clone().requires_grad_(True)
    with _phase("forward"):
        y = layer(inputs)
    with _phase("backward"):
        y.backward(grad_out if tuple(y.shape) == tuple(grad_out.shape) else torch.ones_like(y))
    reference = x.clone().requires_grad_(True)
    expected = dense(reference)
    expected.backward(grad_out)
    mine = dense.weight.detach()[:, start:stop]
    return {"columns": (start, stop), "weight shape": _shape(layer, "weight"), "expected weight": tuple(mine.shape),
            "output shape": tuple(y.shape), "output": _diff(y, expected),
            "bias t times": _diff(y, expected + (world_size - 1) * dense.bias),
            "input grad": _diff(inputs.grad, reference.grad[..., start:stop]),
            "weight grad": _diff(_grad(layer, "weight"), dense.weight.grad[:, start:stop]),
            "bias grad": _diff(_grad(layer, "bias"), dense.bias.grad),
            "no grad": _no_grad({name: (layer, name) for name in ("weight", "bias")}),
            "weight numel": mine.numel(), "y numel": expected.numel()}


def _mlp_case(Column, Row, rank, world_size) -> dict:
    """``out(gelu(fc(x)))``, fc (6 -> 10) column-parallel, out (10 -> 6) row-parallel: the dense MLP's numbers."""
    fc, out = _dense(6, 10, seed=7), _dense(10, 6, seed=8)
    x, grad_out = _randn(3, 4, 6, seed=9), _randn(3, 4, 6, seed=10)
    start, stop = shard_range(10)
    first, second = Column(fc, None), Row(out, None)
    inputs = x.clone().requires_grad_(True)
    with _phase("forward"):
        y = second(F.gelu(first(inputs)))
    with _phase("backward"):
        y.backward(grad_out if tuple(y.shape) == tuple(grad_out.shape) else torch.ones_like(y))
    reference = x.clone().requires_grad_(True)
    expected = out(F.gelu(fc(reference)))
    expected.backward(grad_out)
    grads = {"fc.weight": _diff(_grad(first, "weight"), fc.weight.grad[start:stop]),
             "fc.bias": _diff(_grad(first, "bias"), fc.bias.grad[start:stop]),
             "out.weight": _diff(_grad(second, "weight"), out.weight.grad[:, start:stop]),
             "out.bias": _diff(_grad(second, "bias"), out.bias.grad)}
    unused = _no_grad({f"{label}.{name}": (layer, name) for label, layer in (("fc", first), ("out", second))
                       for name in ("weight", "bias")})
    return {"output": _diff(y, expected), "input grad": _diff(inputs.grad, reference.grad), "grads": grads,
            "no grad": unused,
            "weight numels": {(stop - start) * 6, 6 * (stop - start)}, "x numel": x.numel()}


def _run_part(part, *args) -> dict:
    """One part on this rank, its collectives recorded; an error is returned, not raised (it costs its part only)."""
    _CALLS.clear()
    try:
        result = part(*args)
    except Exception as error:  # the learner's code may fail in any way
        result = {"error": f"{type(error).__name__}: {error}".strip(),
                  "not done": isinstance(error, NotImplementedError), "where": _where(error)}
    result["calls"] = list(_CALLS)
    return result


def _where(error: Exception) -> str:
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "/coursekit/" not in f.filename
              and "/torch/" not in f.filename]
    return f"in {frames[-1].name}, line {frames[-1].lineno}" if frames else ""


def _all_parts(rank, world_size, Column, Row):
    return {"column": _run_part(_column_case, Column, rank, world_size),
            "row": _run_part(_row_case, Row, rank, world_size),
            "mlp": _run_part(_mlp_case, Column, Row, rank, world_size)}


# The three checks of one grade() call share one launch per world size. grade() hands every check the same
# submission object, so results are kept for that object only (a new grade() call runs everything again:
# the learner may have changed a function their classes call).
_CACHE: dict = {"submission": None, "results": {}}


def _results(submission, ctx, world_size: int) -> list[dict] | grading.CheckFailed:
    """Every part's results on each rank of ``world_size`` (one rank: in this process, no launch)."""
    if _CACHE["submission"] is not submission:
        _CACHE.update(submission=submission, results={})
    cached = _CACHE["results"]
    if world_size not in cached:
        classes = (submission.ColumnParallelLinear, submission.RowParallelLinear)
        if world_size == 1:
            with grading.forbid_torch_collectives(INSTEAD):
                cached[world_size] = [_all_parts(0, 1, *classes)]
        else:
            cached[world_size] = ctx.launch_case(_all_parts, world_size, *classes)
    return cached[world_size]


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
        if isinstance(results, grading.CheckFailed):
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
        raise grading.NotDone("not implemented yet (your class raises NotImplementedError)")
    forbidden = next((r["error"] for r in per_rank if r.get("error", "").startswith("ForbiddenCall")), None)
    if forbidden:
        raise grading.CheckFailed(forbidden.split(": ", 1)[1])


def _with_gathered(outcomes, preconditions, gathered: bool) -> float:
    """partial_credit, halved (with the reason) when the weights were gathered instead of split."""
    try:
        fraction = grading.partial_credit(outcomes, preconditions)
    except grading.CheckFailed as failed:
        if not gathered:
            raise
        raise grading.CheckFailed(f"{GATHERED}\n{failed}", fraction=failed.fraction / 2) from None
    if gathered:
        raise grading.CheckFailed(GATHERED, fraction=fraction / 2)
    return fraction


@grading.check(EXERCISE, points=3, timeout=60)
def column_parallel_linear(submission, ctx):
    """Column-parallel Linear(5, 7) on 2 and 4 ranks (one rank must work too): this rank's output slice, the whole
    input's gradient (f's all-reduce), its rows' gradients; 0 all-reduces forward, 1 backward."""
    return _score_layer(submission, ctx, "column")


@grading.check(EXERCISE, points=3, timeout=60)
def row_parallel_linear(submission, ctx):
    """Row-parallel Linear(7, 4) on 2 and 4 ranks (one rank must work too): the whole output on every rank (g's
    all-reduce, the bias once), its input columns' and weight columns' gradients; 1 all-reduce forward, 0 backward."""
    return _score_layer(submission, ctx, "row")


@grading.check(EXERCISE, points=4, timeout=60)
def mlp_one_all_reduce_each_way(submission, ctx):
    """The MLP out(gelu(fc(x))), fc column- and out row-parallel, on 2 and 4 ranks (10 hidden features: 3, 3, 2, 2;
    one rank must work too):
    the dense MLP's output and every gradient, with exactly one all-reduce forward and one backward, no all-gather."""
    outcomes, preconditions, gathered = [], [], False
    for world_size in (1, *WORLD_SIZES):
        results = _results(submission, ctx, world_size)
        if isinstance(results, grading.CheckFailed):
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
