"""ZeRO in the training loop: ``"zero1"``, ``"zero2"``, ``"zero3"`` for :func:`coursekit.train.train`.

:class:`~coursekit.parallel.data.zero.ZeRO` is the algorithm; :class:`MeasuredZeRO` measures it from outside
(spans, the memory peak at the moments it can occur), and :class:`ZeroStrategy` is the adapter
the one training loop calls (its optimiser steps my segments; ``step`` also communicates), with the defaults
each stage runs with.
"""

from __future__ import annotations

import torch

from ...measure.memory import PeakMemory
from ...measure.trace import Tracer, span
from ...measure.verify import FlatShard
from ...strategy import Setup, Strategy, register
from .buckets import DDP_BUCKET_CAP_MB, megabytes
from .precision import as_policy, scaler_counters
from .zero import ZeRO

__all__ = ["MeasuredZeRO", "ZeroStrategy", "CAST_BUCKET_CAP_MB"]

#: Stage 1's buckets when each is cast before its reduce: the copy of one bucket, not of every gradient, sits
#: beside the 16-bit gradients (the fp32 copy of the whole model made bf16 ZeRO-1 peak above fp32's).
CAST_BUCKET_CAP_MB = megabytes(25_000)


class MeasuredZeRO(ZeRO):
    """:class:`ZeRO`, measured: a span around each collective and the optimiser step (``tracer``), and :attr:`peak`, the tensors held at each moment the peak
    can occur -- a bucket summed beside my segment (stages 2-3, inside backward), a cast bucket beside its
    result (stage 1), the full parameters gathered (stage 3), the optimiser state after a step."""

    def __init__(self, *args, tracer: Tracer | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.tracer, self.peak = tracer, PeakMemory()

    def _gather_params(self) -> bool:
        gathered = super()._gather_params()
        if gathered:
            self.peak.note(self.held_tensors())  # the full parameters are here: stage 3's parameter peak
        return gathered

    def _all_gather(self, flat: torch.Tensor) -> None:
        with span(self.tracer, "comm", "all-gather params", waits=True):
            super()._all_gather(flat)

    def _sum_bucket(self, b: int) -> None:
        with span(self.tracer, "comm", f"reduce-scatter bucket {b}", waits=True):
            super()._sum_bucket(b)
        self.peak.note(self.held_tensors())  # the full bucket and my segment exist together: the moment to measure

    def _reduce_scatter_grads(self) -> None:
        with span(self.tracer, "comm", "reduce-scatter grads", waits=True):
            super()._reduce_scatter_grads()

    def _average_segment(self, b: int) -> None:
        super()._average_segment(b)
        self.peak.note(self.held_tensors())  # a cast buffer and the result exist together

    def _optimizer_step(self) -> None:
        with span(self.tracer, "optimizer", "step"):
            super()._optimizer_step()
        self.peak.note(self.held_tensors())  # the optimiser state exists from the first step on


class ZeroStrategy(Strategy):
    """:class:`ZeRO` in the training loop: its optimiser steps my segments; ``step`` also communicates.

    Buckets by the course's one rule (:mod:`coursekit.parallel.data.buckets`): ``bucket_cap_mb``
    megabytes, or ``bucket_elements``. Defaults, chosen because every bucket costs one blocking ring
    call (two for ZeRO-3's gathers) and each call has a fixed cost of its own:

    * stage 1: DDP's 25 MB, one bucket for the course's models. Its gradients are all complete at the
      end of backward anyway, so smaller buckets buy nothing -- 1 reduce-scatter and 1 all-gather per step.
      Except when each bucket is cast to another dtype before it is reduced (bf16 or fp16 with an fp32
      reduce): the copy is a whole bucket beside the 16-bit gradients, so stage 1 then casts and reduces
      ``megabytes(25_000)`` at a time (:data:`CAST_BUCKET_CAP_MB`, six buckets of the course transformer).
    * stages 2-3: ``megabytes(55_000)``, buckets of 55,000 float32 elements, two for the course
      transformer (49,984 and 54,848): a rank still frees half the gradients before backward ends, with
      2 ring calls per pass instead of the 6 that 25,000-element buckets cost. The course MLP is one bucket.
    """

    stage = 1
    options = {"collectives": "ring", "bucket_cap_mb": DDP_BUCKET_CAP_MB, "bucket_elements": None, "precision": None,
               "loss_scaler": None}

    def __init__(self, setup: Setup):
        super().__init__(setup)
        self.zero = MeasuredZeRO(setup.model, setup.optimizer_fn, stage=self.stage, group=self.group,
                                 collectives=self.option("collectives"), tracer=setup.tracer,
                                 bucket_cap_mb=self._bucket_cap_mb(setup),
                                 bucket_elements=self.option("bucket_elements"), mp_policy=self.option("precision"),
                                 loss_scaler=self.option("loss_scaler"))
        self.model, self.optimizer = self.zero, self.zero.optimizer
        self.peak = self.zero.peak  # noted inside backward too (the loop adds its own moments)

    def _bucket_cap_mb(self, setup: Setup) -> float | None:
        """The option, or stage 1's default: DDP's one bucket, :data:`CAST_BUCKET_CAP_MB` when a bucket is cast."""
        policy = as_policy(self.option("precision"))
        casts = policy.mixed and policy.reduce(torch.float32) != policy.compute_dtype(torch.float32)
        if self.stage == 1 and casts and "bucket_cap_mb" not in setup.options:
            return CAST_BUCKET_CAP_MB
        return self.option("bucket_cap_mb")

    def step(self) -> None:
        self.zero.step()  # (stage 1: reduce-scatter), step my segments, all-gather (or free, stage 3)

    def zero_grad(self) -> None:
        self.zero.zero_grad()

    def gradients(self) -> list[FlatShard]:
        """My segments of the averaged gradient (what my optimiser used), for :func:`coursekit.measure.verify.compare`."""
        zero = self.zero
        if any(piece.grad is None for piece in zero.pieces):
            raise RuntimeError("no gradient segment yet: call step() first.")
        return [FlatShard(zero.layout, b.start, piece.grad) for b, piece in zip(zero.buckets, zero.pieces)]

    def parameters(self) -> list[FlatShard]:
        """My segments of the parameters, for :func:`coursekit.measure.verify.compare` (frozen ones whole, once)."""
        zero = self.zero
        frozen = {n: p.data for n, p in zero.module.named_parameters() if not p.requires_grad}
        return [FlatShard(zero.layout, b.start, piece.data, frozen if k == 0 else {})
                for k, (b, piece) in enumerate(zip(zero.buckets, zero.pieces))]

    def held_tensors(self) -> dict[str, list[torch.Tensor]]:
        return self.zero.held_tensors()

    def counters(self) -> dict:
        moved = self.record.collective_counts("collectives")  # the buckets' collectives, as comm recorded them
        return {"bucket_sizes": self.zero.bucket_sizes,
                "elements_reduce_scattered": moved.total("reduce_scatter"),
                "elements_all_gathered": moved.total("all_gather"),
                "compute_dtype": str(self.zero.flat_param.dtype).split(".")[-1],  # the flat buffer the forward uses
                **scaler_counters(self.zero.scaler)}


for _stage in (1, 2, 3):
    _options = dict(ZeroStrategy.options, bucket_cap_mb=DDP_BUCKET_CAP_MB if _stage == 1 else megabytes(55_000))
    _doc = f"ZeRO stage {_stage}." if _stage < 3 else \
        "ZeRO stage 3, the whole model gathered at once (one unit at a time: 'zero3_units')."
    register(f"zero{_stage}")(type(f"Zero{_stage}", (ZeroStrategy,), {"stage": _stage, "options": _options,
                                                                     "__doc__": _doc}))
