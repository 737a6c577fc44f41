"""Plain data parallelism in the training loop: ``"naive"`` and ``"bucketed"`` for :func:`coursekit.train.train`.

:mod:`~coursekit.parallel.data.core` is the algorithm (every rank a replica, gradients averaged); this is the
adapter the one training loop calls, with what both share: mixed precision as DDP is used with it (the forward
under ``torch.autocast``, fp32 weights and gradients) and, for fp16, a loss scale. :class:`MeasuredDataParallel`
is the core's :class:`DataParallel` with its all-reduces drawn on the timeline.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn as nn

from ... import collectives as _collectives
from ...strategy import Setup, Strategy, register
from ...measure.trace import Tracer, span
from .core import DataParallel, average_gradients, broadcast_parameters
from .buckets import megabytes
from .precision import autocast, loss_scaler_for, scaler_counters

__all__ = ["MeasuredDataParallel", "Replicated", "Naive", "Bucketed"]


class MeasuredDataParallel(DataParallel):
    """:class:`DataParallel`, drawn from outside: each bucket's all-reduce a ``comm`` span from issue to
    completion (as gloo's threads report it), the wait at the end of backward an ``idle`` one
    (``tracer``: a :class:`~coursekit.measure.trace.Tracer`)."""

    def __init__(self, module: nn.Module, *args, tracer: Tracer | None = None, **kwargs):
        super().__init__(module, *args, **kwargs)
        self.tracer = tracer

    def launch(self, b: int) -> None:
        super().launch(b)
        bucket = self.buckets[b]
        if self.tracer is not None and bucket.work is not None:
            self.tracer.comm(bucket.work, f"bucket {b}")

    def wait(self, bucket) -> None:
        super().wait(bucket)
        if self.tracer is not None and bucket.work is not None:
            self.tracer.waited(bucket.work)  # gloo's thread has let go of it (see Tracer.waited)

    def waiting(self):
        return span(self.tracer, "idle", "wait for all-reduce")


class Replicated(Strategy):
    """What the replicated strategies share: the forward under autocast (``precision="bf16"`` or ``"fp16"``) and,
    for fp16, a loss scaler (option ``loss_scaler``: a :class:`LossScaler`, None for the default, False for none).

    The scale multiplies the gradient entering backward (the same as ``GradScaler.scale(loss).backward()``);
    after the gradients are averaged, ``step`` unscales them and skips the step if any is inf or NaN. The
    averaged gradients are the same bits on every rank, so the check is local: no collective, unlike ZeRO's.
    """

    def __init__(self, setup: Setup):
        super().__init__(setup)
        autocast(self.option("precision"))  # refuses what plain data parallelism cannot do, before a step
        self.scaler = loss_scaler_for(self.option("precision"), self.option("loss_scaler"))

    def autocast_forward(self, module: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        with autocast(self.option("precision"), inputs.device.type):  # 16-bit compute, fp32 weights
            output = module(inputs).float()
        if self.scaler is not None and output.requires_grad:
            output.register_hook(self.scaler.scale_gradient)  # backward of (loss x scale)
        return output

    def step(self) -> None:
        grads = [p.grad for p in self.model.parameters()]
        if self.scaler is None or self.scaler.unscale_and_update(grads, replicated=True):
            super().step()

    def counters(self) -> dict:
        return scaler_counters(self.scaler)


@register("naive")
class Naive(Replicated):
    """Start from rank 0's weights; after backward, :func:`average_gradients` one tensor at a time."""

    options = {"collectives": "ring", "precision": None, "loss_scaler": None}

    def __init__(self, setup: Setup):
        super().__init__(setup)
        broadcast_parameters(self.model, group=self.group)
        self.all_reduce = _collectives.get_collectives(self.option("collectives")).all_reduce

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.autocast_forward(self.model, inputs)

    def synchronize(self) -> None:
        with self.span("comm", "all-reduce grads"):
            average_gradients(self.model, group=self.group, all_reduce=self.all_reduce)


@register("bucketed")
class Bucketed(Replicated):
    """:class:`DataParallel`: buckets all-reduced from backward hooks (``overlap=False``: after backward)."""

    # 25,000 float32 elements a bucket, as megabytes: six of the course transformer, to overlap backward
    options = {"bucket_cap_mb": megabytes(25_000), "bucket_elements": None, "overlap": True, "precision": None,
               "loss_scaler": None}

    def __init__(self, setup: Setup):
        super().__init__(setup)
        self.wrapped = MeasuredDataParallel(self.model, bucket_cap_mb=self.option("bucket_cap_mb"), group=self.group,
                                            tracer=self.tracer, overlap=self.option("overlap"),
                                            bucket_elements=self.option("bucket_elements"))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.autocast_forward(self.wrapped, inputs)

    def backward_context(self, last: bool):
        return nullcontext() if last else self.wrapped.no_sync()

    def synchronize(self) -> None:
        self.wrapped.finish_gradient_synchronization()  # done when the last backward ended: a no-op check

    def zero_grad(self) -> None:
        self.wrapped.zero_grad(set_to_none=False)  # in place: the gradients stay views into the buckets

    def counters(self) -> dict:  # the buckets' all-reduces, as comm recorded them
        return {**super().counters(), "elements_reduced": self.record.collective_counts().total("all_reduce")}

