"""What one dispatched operation costs on this machine, whatever its size: a probe, and a counter of ops.

A step of small layers is made of operations that each pay a fixed cost -- Python, the module call, the
autograd graph, the dispatcher -- however few FLOPs and bytes they carry, as a 4-byte all-reduce pays the
network's latency α. :func:`op_overhead` measures it once, on a stack so narrow that nothing else is left;
:class:`CountOps` counts the ATen ops a block dispatches, by name (the cost model counts them from a model's
shape instead, :mod:`coursekit.costmodel.overhead`, and tests/test_costmodel_overhead.py holds the two equal).

    >>> seconds, ops = op_overhead(repeats=3)
    >>> ops > 700 and 0 < seconds < 1e-3
    True
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CountOps", "op_overhead", "PROBE_WIDTH"]

PROBE_WIDTH = 8       # the op probe's layers: so narrow that nothing but the ops' fixed cost is left


class CountOps(TorchDispatchMode):
    """Count every ATen op dispatched inside the block (forward, backward, optimizer), by name."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def op_overhead(repeats: int = 50) -> tuple[float, int]:
    """Seconds per dispatched op, and the ops counted: a training step of a stack that does nothing else.

    Eight pre-norm blocks ``x + W₂ gelu(W₁ ln(x))`` of width :data:`PROBE_WIDTH` on one row, forward, backward and
    an Adam step: the op families of a transformer step (linear, layer norm, GELU, add, the optimizer's per-tensor
    passes) with no FLOPs or bytes to speak of -- the ops' fixed cost, as a 4-byte all-reduce is α. The ops
    are counted once under :class:`CountOps`, the step timed ``repeats`` times (median).
    """
    w = PROBE_WIDTH
    blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(w), nn.Linear(w, 4 * w), nn.GELU(), nn.Linear(4 * w, w))
                           for _ in range(8))
    optimizer = torch.optim.Adam(blocks.parameters())
    x = torch.randn(1, 1, w)

    def step():
        y = x
        for block in blocks:
            y = y + block(y)
        y.square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(3):
        step()
    with CountOps() as counted:
        step()
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        step()
        times.append(time.perf_counter() - begin)
    return statistics.median(times) / counted.total, counted.total
