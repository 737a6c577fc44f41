"""What runs on each rank in exercise 05: the learner's layers against the dense layer they split.

Three parts (:func:`all_parts`): a column-parallel ``Linear(5, 7)``, a row-parallel
``Linear(7, 4)`` and the MLP ``out(gelu(fc(x)))`` built from both. Each returns
numbers, not verdicts: how far the output, the input's gradient and every shard's
gradients are from the dense layer's, the shapes, and every collective called
(:mod:`.tensor_tools`), for :mod:`.tensor_parallel` to judge. A part that raises
costs only itself: its error is returned, with the learner's line.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .feedback import learner_line_of
from .tensor_tools import phase, recording, shard_range

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


def _column_case(Column, rank, world_size) -> dict:
    """Linear(5, 7) column-parallel: this rank's output slice, the whole input's gradient, its rows' gradients."""
    dense, x, grad_out = _dense(5, 7, seed=1), _randn(3, 4, 5, seed=2), _randn(3, 4, 7, seed=3)
    start, stop = shard_range(7)
    layer = Column(dense, None)
    inputs = x.clone().requires_grad_(True)
    with phase("forward"):
        y = layer(inputs)
    with phase("backward"):
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
    with phase("forward"):
        y = layer(inputs)
    with phase("backward"):
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
    with phase("forward"):
        y = second(F.gelu(first(inputs)))
    with phase("backward"):
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
    with recording() as calls:
        try:
            result = part(*args)
        except Exception as error:  # the learner's code may fail in any way
            result = {"error": f"{type(error).__name__}: {error}".strip(),
                      "not done": isinstance(error, NotImplementedError), "where": learner_line_of(error)}
    result["calls"] = calls
    return result



def all_parts(rank, world_size, Column, Row):
    """Every part of exercise 05 on this rank: the column- and row-parallel layers alone, then the MLP of both."""
    return {"column": _run_part(_column_case, Column, rank, world_size),
            "row": _run_part(_row_case, Row, rank, world_size),
            "mlp": _run_part(_mlp_case, Column, Row, rank, world_size)}
