"""P10, measured where it is true: tensor against model parallelism on the same wide model, 2 ranks.

Seed claim P10: for a model too large for one GPU, "tensor parallelism is more efficient [than model
parallelism] because GPUs work simultaneously". On the course transformer (64 wide) it is not: every
layer boundary waits for an all-reduce while each rank's matmuls take microseconds. Here the layers are
wide enough that compute dominates: :func:`wide_mlp`, residual MLP blocks ``x + W₂ gelu(W₁ x)``
(1024 → 4096 → 1024 by default, Megatron's MLP), one step of forward + backward on ``tokens`` rows.

* one process: the whole model on one rank (the other waits at a barrier: it does no work);
* tensor parallelism: every block a :class:`~coursekit.parallel.tensor.ParallelMLP` (``W₁`` by columns,
  ``W₂`` by rows, one all-reduce forward and one backward per block): both ranks compute every block;
* model parallelism: the first half of the blocks on rank 0, the rest on rank 1; the activation crosses
  once forward and its gradient once backward, and each rank idles while the other computes.

:func:`step_times` runs the three back to back in each iteration, so each iteration's ratios are paired
(whatever else slows the machine at that moment slows all three).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .. import comm
from ..parallel.tensor.core import ParallelMLP

__all__ = ["ResidualMLP", "wide_mlp", "tensor_parallel_blocks", "step_times", "VARIANTS"]

VARIANTS = ("one process", "tensor parallel", "model parallel")


class ResidualMLP(nn.Module):
    """``x + out(gelu(fc(x)))``: one transformer MLP block with its residual."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc, self.out = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(F.gelu(self.fc(x)))


def wide_mlp(blocks: int = 4, width: int = 1024, hidden: int = 4096, seed: int = 0) -> nn.ModuleList:
    """``blocks`` residual MLP blocks, weights drawn from ``seed`` (the same on every rank)."""
    generator = torch.Generator().manual_seed(seed)
    model = nn.ModuleList(ResidualMLP(width, hidden) for _ in range(blocks))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
    return model


class _Residual(nn.Module):
    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.mlp = mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


def tensor_parallel_blocks(model: nn.ModuleList, group=None) -> nn.ModuleList:
    """Each block's MLP as a :class:`ParallelMLP` over ``group`` (this rank's shards of the same weights)."""
    return nn.ModuleList(_Residual(ParallelMLP.from_dense(b.fc, b.out, group)) for b in model)


def _run(blocks, x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x


def _loss(y: torch.Tensor) -> torch.Tensor:
    loss = y.square().mean()
    loss.backward()
    return loss.detach()


def _one_process(model, x, rank: int):
    return _loss(_run(model, x)) if rank == 0 else None


def _model_parallel(model, x, rank: int):
    half = len(model) // 2
    if rank == 0:
        y = _run(model[:half], x)
        comm.send(y.detach(), 1)
        grad = torch.empty_like(y)
        comm.recv(grad, 1)
        y.backward(grad)
        return None
    h = torch.empty_like(x)
    comm.recv(h, 0)
    h.requires_grad_(True)
    loss = _loss(_run(model[half:], h))
    comm.send(h.grad, 0)
    return loss


def step_times(rank: int, world_size: int, iterations: int = 5, tokens: int = 256, blocks: int = 4,
               width: int = 1024, hidden: int = 4096) -> dict[str, list[float]]:
    """Seconds of one forward + backward step per iteration for each of :data:`VARIANTS` (this rank's clock).

    Run on 2 ranks (``coursekit.launch(step_times, 2)``); each variant starts after a barrier, so the
    slowest rank's time of an iteration is its step time. One warm-up iteration is not returned. Also
    ``"losses"``: each variant's loss on the rank that computes it (None on a rank that does not), equal
    for all three: the same model, the same work.
    """
    if world_size != 2:
        raise ValueError(f"this comparison runs on 2 ranks, one core each (got world_size={world_size}).")
    model = wide_mlp(blocks, width, hidden)
    sharded = tensor_parallel_blocks(model)
    x = torch.randn(tokens, width, generator=torch.Generator().manual_seed(1))
    steps = {"one process": lambda: _one_process(model, x, rank),
             "tensor parallel": lambda: _loss(_run(sharded, x)),
             "model parallel": lambda: _model_parallel(model, x, rank)}
    times: dict = {name: [] for name in VARIANTS}
    times["losses"] = {}
    for i in range(iterations + 1):
        for name in VARIANTS:
            dist.barrier()
            begin = time.perf_counter()
            loss = steps[name]()
            if i:
                times[name].append(time.perf_counter() - begin)
            times["losses"][name] = None if loss is None else loss.item()
        for p in list(model.parameters()) + list(sharded.parameters()):
            p.grad = None
    return times
