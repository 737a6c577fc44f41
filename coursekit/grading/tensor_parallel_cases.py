"""What runs on each rank in exercise 05: the learner's layers against the dense layer they split.

Five parts (:func:`all_parts`): **f** and **g** alone (each rank its own input and gradient, the
group's sums computed here from the seeds), a column-parallel ``Linear(5, 7)``, a row-parallel
``Linear(7, 4)`` and the MLP ``out(gelu(fc(x)))`` built from both. Each returns
numbers, not verdicts: how far the output, the input's gradient and every shard's
gradients are from the dense layer's (and from what a typical mistake computes: the
bias t times, one rank's partial sum, the input gradient of one shard), the shapes,
and every collective called with the group it ran over (:mod:`.tensor_tools`), for
:mod:`.tensor_parallel` to judge. A part that raises costs only itself: its error is
returned, with the learner's line, and what it had recorded before.

With ``tp`` set the ranks are a :class:`~coursekit.comm.mesh.Mesh` ``{"dp": world / tp, "tp": tp}``: the layers
get this rank's tensor-parallel group (a process group, as a mesh's ``mesh.group("tp")``), and each group
its own inputs, so that a layer summing over the whole world instead mixes two groups' numbers.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..comm.mesh import Mesh, rank_size
from .feedback import learner_line_of
from .tensor_tools import group_ranks, phase, recording, shard_range

__all__ = ["all_parts"]


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


def _shards(seen: dict, piece: str, total: int, group) -> tuple[int, int]:
    """This rank's ``piece`` ("rows", "columns") of ``total`` in ``group``, and in the whole world, noted in ``seen``."""
    seen[piece], seen[f"world {piece}"] = shard_range(total, group), shard_range(total)
    seen["group ranks"], seen["world ranks"] = group_ranks(group), group_ranks()
    return seen[piece]


def _least(forward: int, backward: int) -> dict:
    """The elements a part must all-reduce, per pass: one all-reduce of the tensor that needs summing, no more."""
    return {"least": {"forward": forward, "backward": backward}}


def _operator_case(seen: dict, Operator, group, seed: int, sums_forward: bool) -> dict:
    """f (``sums_forward`` False) or g alone on (3, 4, 5): each rank of the group its own input; f's output
    gradient differs on every rank, g's is the same (its output is whole on every rank)."""
    _shards(seen, "rows", 5, group)  # notes the group's ranks (and the world's)
    rank, t = rank_size(group)
    inputs = [_randn(3, 4, 5, seed=seed + 11 + k) for k in range(t)]
    grads = [_randn(3, 4, 5, seed=seed + (21 + k if not sums_forward else 31)) for k in range(t)]
    x = inputs[rank].clone().requires_grad_(True)
    with phase("forward"):
        y = Operator.apply(x, group)
    with phase("backward"):
        y.backward(grads[rank] if tuple(y.shape) == (3, 4, 5) else torch.ones_like(y))
    whole_input, whole_grad = sum(inputs), sum(grads)
    return {"output": _diff(y, whole_input if sums_forward else x), "output is the sum": _diff(y, whole_input),
            "output is its own": _diff(y, inputs[rank]),
            "input grad": _diff(x.grad, grads[rank] if sums_forward else whole_grad),
            "input grad is its own": _diff(x.grad, grads[rank]), "input grad t times": _diff(x.grad, t * grads[rank]),
            **_least(x.numel() if sums_forward else 0, 0 if sums_forward else x.numel())}


def _f_case(seen: dict, Copy, group, seed: int) -> dict:
    return _operator_case(seen, Copy, group, seed, sums_forward=False)


def _g_case(seen: dict, Reduce, group, seed: int) -> dict:
    return _operator_case(seen, Reduce, group, seed, sums_forward=True)


def _column_case(seen: dict, Column, group, seed: int) -> dict:
    """Linear(5, 7) column-parallel: this rank's output slice, the whole input's gradient, its rows' gradients."""
    dense, x, grad_out = _dense(5, 7, seed=1), _randn(3, 4, 5, seed=seed + 2), _randn(3, 4, 7, seed=seed + 3)
    start, stop = _shards(seen, "rows", 7, group)
    mine = dense.weight.detach()[start:stop]
    seen["expected weight"], seen["weight numel"] = tuple(mine.shape), mine.numel()
    layer = Column(dense, group)
    seen["weight shape"] = _shape(layer, "weight")
    inputs = x.clone().requires_grad_(True)
    with phase("forward"):
        y = layer(inputs)
    with phase("backward"):
        y.backward(grad_out[..., start:stop] if tuple(y.shape) == (3, 4, stop - start) else torch.ones_like(y))
    reference = x.clone().requires_grad_(True)
    dense(reference).backward(grad_out)
    return {"output shape": tuple(y.shape), "output": _diff(y, dense(x)[..., start:stop]),
            "input grad": _diff(inputs.grad, reference.grad),
            "input grad is the shard's part": _diff(inputs.grad, grad_out[..., start:stop] @ mine),
            "weight grad": _diff(_grad(layer, "weight"), dense.weight.grad[start:stop]),
            "bias grad": _diff(_grad(layer, "bias"), dense.bias.grad[start:stop]),
            "no grad": _no_grad({name: (layer, name) for name in ("weight", "bias")}), **_least(0, x.numel())}


def _row_case(seen: dict, Row, group, seed: int) -> dict:
    """Linear(7, 4) row-parallel: this rank's input columns in, the whole output out on every rank."""
    dense, x, grad_out = _dense(7, 4, seed=4), _randn(3, 4, 7, seed=seed + 5), _randn(3, 4, 4, seed=seed + 6)
    start, stop = _shards(seen, "columns", 7, group)
    mine = dense.weight.detach()[:, start:stop]
    seen["expected weight"], seen["weight numel"] = tuple(mine.shape), mine.numel()
    layer = Row(dense, group)
    seen["weight shape"] = _shape(layer, "weight")
    inputs = x[..., start:stop].clone().requires_grad_(True)
    with phase("forward"):
        y = layer(inputs)
    with phase("backward"):
        y.backward(grad_out if tuple(y.shape) == tuple(grad_out.shape) else torch.ones_like(y))
    reference = x.clone().requires_grad_(True)
    expected = dense(reference)
    expected.backward(grad_out)
    t = len(seen["group ranks"])
    return {"output shape": tuple(y.shape), "output": _diff(y, expected),
            "bias t times": _diff(y, expected + (t - 1) * dense.bias),
            "one rank's partial sum": _diff(y, F.linear(x[..., start:stop], mine, dense.bias)),
            "input grad": _diff(inputs.grad, reference.grad[..., start:stop]),
            "weight grad": _diff(_grad(layer, "weight"), dense.weight.grad[:, start:stop]),
            "bias grad": _diff(_grad(layer, "bias"), dense.bias.grad),
            "no grad": _no_grad({name: (layer, name) for name in ("weight", "bias")}), **_least(expected.numel(), 0)}


def _mlp_case(seen: dict, Column, Row, group, seed: int) -> dict:
    """``out(gelu(fc(x)))``, fc (6 -> 10) column-parallel, out (10 -> 6) row-parallel: the dense MLP's numbers.

    The forward of each layer runs in its own ``phase("forward", "fc" | "out")``: which layer all-reduced."""
    fc, out = _dense(6, 10, seed=7), _dense(10, 6, seed=8)
    x, grad_out = _randn(3, 4, 6, seed=seed + 9), _randn(3, 4, 6, seed=seed + 10)
    start, stop = _shards(seen, "rows", 10, group)
    seen["weight numels"] = {(stop - start) * 6}  # fc's rows and out's columns: 6 × this rank's hidden features
    first, second = Column(fc, group), Row(out, group)
    inputs = x.clone().requires_grad_(True)
    with phase("forward", "fc"):
        hidden = first(inputs)
    with phase("forward", "out"):
        y = second(F.gelu(hidden))
    with phase("backward"):
        y.backward(grad_out if tuple(y.shape) == tuple(grad_out.shape) else torch.ones_like(y))
    reference = x.clone().requires_grad_(True)
    dense_hidden = fc(reference)
    dense_hidden.retain_grad()
    expected = out(F.gelu(dense_hidden))
    expected.backward(grad_out)
    shard_part = dense_hidden.grad[..., start:stop] @ fc.weight.detach()[start:stop]  # f's backward left out
    grads = {"fc.weight": _diff(_grad(first, "weight"), fc.weight.grad[start:stop]),
             "fc.bias": _diff(_grad(first, "bias"), fc.bias.grad[start:stop]),
             "out.weight": _diff(_grad(second, "weight"), out.weight.grad[:, start:stop]),
             "out.bias": _diff(_grad(second, "bias"), out.bias.grad)}
    unused = _no_grad({f"{label}.{name}": (layer, name) for label, layer in (("fc", first), ("out", second))
                       for name in ("weight", "bias")})
    t = len(seen["group ranks"])
    return {"output": _diff(y, expected), "bias t times": _diff(y, expected + (t - 1) * out.bias),
            "input grad": _diff(inputs.grad, reference.grad),
            "input grad is the shard's part": _diff(inputs.grad, shard_part), "grads": grads, "no grad": unused,
            **_least(expected.numel(), x.numel())}


def _run_part(part, *args) -> dict:
    """One part on this rank, its collectives recorded; an error is returned, not raised (it costs its part only),
    with what the part noted before it (``seen``: the shards it expects, the learner's weight shape). A class
    passed as None is not written yet: the part is "not done"."""
    if any(arg is None for arg in args[:-2]):  # the classes; the group (last but one) may be None
        return {"error": "NotImplementedError: not written yet", "not done": True, "where": "", "calls": []}
    seen: dict = {}
    with recording() as calls:
        try:
            result = part(seen, *args)
            result = {**seen, **result}
        except Exception as error:  # the learner's code may fail in any way
            result = {**seen, "error": f"{type(error).__name__}: {error}".strip(),
                      "not done": isinstance(error, NotImplementedError), "where": learner_line_of(error)}
    result["calls"] = calls
    return result


def all_parts(rank, world_size, Column, Row, Copy=None, Reduce=None, tp: int | None = None):
    """Every part of exercise 05 on this rank: f and g alone, the column- and row-parallel layers alone, then the
    MLP of both.

    ``tp``: the layers get this rank's group of a mesh ``{"dp": world_size // tp, "tp": tp}``, and each
    tensor-parallel group its own inputs (seeds 100 apart); None: the whole world (``group=None``)."""
    group, seed = None, 0
    if tp is not None:
        mesh = Mesh({"dp": world_size // tp, "tp": tp})
        group, seed = mesh.group("tp"), 100 * mesh["dp"].rank
    return {"f": _run_part(_f_case, Copy, group, seed), "g": _run_part(_g_case, Reduce, group, seed),
            "column": _run_part(_column_case, Column, group, seed),
            "row": _run_part(_row_case, Row, group, seed),
            "mlp": _run_part(_mlp_case, Column, Row, group, seed)}
