"""P4 measured where it is true: data parallelism on a model wide enough that compute dominates, 2 ranks.

Seed claim P4: data parallelism splits the batch so "the GPUs work at the same time". On the course
transformer (64 wide) a step is mostly fixed costs and a gradient all-reduce, so 2 ranks barely beat one.
Here the model is :func:`~coursekit.experiments.wide_mlp` (residual MLP blocks, 256 -> 1024 -> 256 by
default) on ``tokens`` rows per step, so a rank's compute grows with its share of the batch while its
all-reduce carries the same 4 bytes per parameter whatever the batch: enough rows per rank and compute wins.

One training step (forward, backward, gradient averaging, an SGD step) of each variant:

* ``"one process"``: rank 0 takes the whole batch (rank 1 waits at the barrier: it does no work);
* ``"waiting"``: :class:`~coursekit.parallel.data.DataParallel` with ``overlap=False``: each rank half the
  batch, and the buckets' all-reduces start only when backward has ended;
* ``"overlapped"``: the same buckets, each started from backward's hooks as soon as its gradients are ready.

:func:`step_times` runs the three back to back in each iteration, so each iteration's ratios are paired
(whatever else slows the machine at that moment slows all three).

On this CPU gloo copies the bytes with the same cores that compute, so an all-reduce hidden behind backward
still takes its copying time out of backward. On GPUs the links move the bytes (NVLink, InfiniBand, with DMA
engines), and what overlap hides is saved. ``link`` (bytes per second) adds such a link to both
DataParallel variants: each bucket's all-reduce also waits until its bytes have crossed an emulated link
that transfers one bucket at a time and uses no CPU (:class:`LinkedDataParallel`).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn

from ..parallel.data import DataParallel
from .tensor_versus_model import wide_mlp

__all__ = ["DP_VARIANTS", "LinkedDataParallel", "dp_step_times"]

DP_VARIANTS = ("one process", "waiting", "overlapped")


class _LinkWork:
    """A started all-reduce that is done when gloo is done *and* the emulated link has carried its bytes."""

    def __init__(self, work, done_at: float):
        self.work, self.done_at = work, done_at

    def wait(self):
        if self.work is not None:
            self.work.wait()
        time.sleep(max(0.0, self.done_at - time.perf_counter()))  # the link, not the CPU: sleeping costs no core


class LinkedDataParallel(DataParallel):
    """:class:`DataParallel` behind an emulated link of ``link`` bytes per second, one bucket at a time.

    A ring all-reduce puts ``2 (n - 1) / n`` times a bucket's bytes on each rank's link; a bucket started
    while the link still carries an earlier one queues behind it.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float, overlap: bool, link: float):
        super().__init__(module, bucket_cap_mb, overlap=overlap)
        self.link, self.link_free = link, 0.0

    def launch(self, b: int) -> None:
        super().launch(b)
        bucket = self.buckets[b]
        wire = 2 * (self.world_size - 1) / self.world_size * bucket.buffer.numel() * bucket.buffer.element_size()
        self.link_free = max(time.perf_counter(), self.link_free) + wire / self.link
        bucket.work = _LinkWork(bucket.work, self.link_free)


def _step(model: nn.Module, optimizer, x: torch.Tensor, y: torch.Tensor, rows: int) -> torch.Tensor:
    """Forward, backward (a DataParallel model averages its gradients inside it), SGD step. The loss is the mean
    over this rank's ``rows``: with equal halves, the average of the two ranks' gradients is the whole batch's."""
    loss = (model(x) - y).square().sum() / (rows * y.shape[-1])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)  # keep the gradient buffers: no allocation inside the timed step
    return loss.detach()


def dp_step_times(rank: int, world_size: int, iterations: int = 5, tokens: int = 4096, blocks: int = 4,
                  width: int = 256, hidden: int = 1024, bucket_cap_mb: float = 1.0, link: float | None = None) -> dict:
    """Seconds of one training step per iteration for each of :data:`DP_VARIANTS` (this rank's clock).

    Run on 2 ranks (``coursekit.launch(dp_step_times, 2)``), one core each. Each variant starts after a
    barrier and ends at one, so an iteration's time is the slower rank's. One warm-up iteration is not
    returned. ``link``: bytes per second of an emulated link under both DataParallel variants (None: gloo
    alone). Also ``"losses"``: each variant's loss of the last iteration, the whole batch's (averaged over
    the ranks), equal for the three up to rounding: the same model, the same batch, the same steps.
    """
    if world_size != 2:
        raise ValueError(f"this comparison runs on 2 ranks, one core each (got world_size={world_size}).")
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(tokens, width, generator=generator), torch.randn(tokens, width, generator=generator)
    mine = slice(rank * tokens // 2, (rank + 1) * tokens // 2)
    models = {"one process": wide_mlp(blocks, width, hidden)}
    for name, overlap in (("waiting", False), ("overlapped", True)):
        module = nn.Sequential(*wide_mlp(blocks, width, hidden))
        models[name] = (DataParallel(module, bucket_cap_mb, overlap=overlap) if link is None
                        else LinkedDataParallel(module, bucket_cap_mb, overlap, link))
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in models.items()}
    one = nn.Sequential(*models["one process"])
    steps = {"one process": lambda: _step(one, optimizers["one process"], x, y, tokens) if rank == 0 else None,
             "waiting": lambda: _step(models["waiting"], optimizers["waiting"], x[mine], y[mine], tokens // 2),
             "overlapped": lambda: _step(models["overlapped"], optimizers["overlapped"], x[mine], y[mine], tokens // 2)}
    times: dict = {name: [] for name in DP_VARIANTS}
    losses: dict = {}
    for i in range(iterations + 1):
        for name in DP_VARIANTS:
            dist.barrier()
            begin = time.perf_counter()
            loss = steps[name]()
            dist.barrier()
            if i:
                times[name].append(time.perf_counter() - begin)
            losses[name] = loss
    whole = {name: torch.zeros(()) if loss is None else loss.clone() for name, loss in losses.items()}
    for name in ("waiting", "overlapped"):  # each rank holds its half's mean: average them
        dist.all_reduce(whole[name])
        whole[name] /= world_size
    dist.broadcast(whole["one process"], 0)
    times["losses"] = {name: loss.item() for name, loss in whole.items()}
    return times
