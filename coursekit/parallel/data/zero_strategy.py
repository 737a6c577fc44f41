"""ZeRO in the training loop: ``"zero1"``, ``"zero2"``, ``"zero3"`` for :func:`coursekit.train.train`.

:class:`~coursekit.parallel.data.zero.ZeRO` is the algorithm; this is the adapter the one training loop
calls (its optimiser steps my segments; ``step`` also communicates), and the defaults each stage runs with.
"""

from __future__ import annotations

import torch

from ...strategy import Setup, Strategy, register
from ...measure.verify import FlatShard
from .buckets import DDP_BUCKET_CAP_MB, megabytes
from .precision import scaler_counters
from .zero import ZeRO

__all__ = ["ZeroStrategy"]


class ZeroStrategy(Strategy):
    """:class:`ZeRO` in the training loop: its optimiser steps my segments; ``step`` also communicates.

    Buckets by the course's one rule (:mod:`coursekit.parallel.data.buckets`): ``bucket_cap_mb``
    megabytes, or ``bucket_elements``. Defaults, chosen because every bucket costs one blocking ring
    call (two for ZeRO-3's gathers) and each call has a fixed cost of its own:

    * stage 1: DDP's 25 MB, one bucket for the course's models. Its gradients are all complete at the
      end of backward anyway, so smaller buckets buy nothing -- 1 reduce-scatter and 1 all-gather per step.
    * stages 2-3: ``megabytes(55_000)``, buckets of 55,000 float32 elements, two for the course
      transformer (49,984 and 54,848): a rank still frees half the gradients before backward ends, with
      2 ring calls per pass instead of the 6 that 25,000-element buckets cost. The course MLP is one bucket.
    """

    stage = 1
    options = {"collectives": "ring", "bucket_cap_mb": DDP_BUCKET_CAP_MB, "bucket_elements": None, "precision": None,
               "loss_scaler": None}

    def __init__(self, setup: Setup):
        super().__init__(setup)
        self.zero = ZeRO(setup.model, setup.optimizer_fn, stage=self.stage, group=self.group,
                         collectives=self.option("collectives"), tracer=setup.tracer,
                         bucket_cap_mb=self.option("bucket_cap_mb"), bucket_elements=self.option("bucket_elements"),
                         mp_policy=self.option("precision"), loss_scaler=self.option("loss_scaler"))
        self.model, self.optimizer = self.zero, self.zero.optimizer
        self.peak = self.zero.peak  # noted inside backward too (the loop adds its own moments)

    def step(self) -> None:
        self.zero.step()  # (stage 1: reduce-scatter), step my segments, all-gather (or free, stage 3)

    def zero_grad(self) -> None:
        self.zero.zero_grad()

    def gradients(self) -> list[FlatShard]:
        return self.zero.grad_shard()

    def parameters(self) -> list[FlatShard]:
        return self.zero.param_shard()

    def held_tensors(self) -> dict[str, list[torch.Tensor]]:
        return self.zero.held_tensors()

    def counters(self) -> dict:
        return {"bucket_sizes": self.zero.bucket_sizes,
                "elements_reduce_scattered": self.zero.elements_reduce_scattered,
                "elements_all_gathered": self.zero.elements_all_gathered,
                **scaler_counters(self.zero.scaler)}


for _stage in (1, 2, 3):
    _options = dict(ZeroStrategy.options, bucket_cap_mb=DDP_BUCKET_CAP_MB if _stage == 1 else megabytes(55_000))
    register(f"zero{_stage}")(type(f"Zero{_stage}", (ZeroStrategy,), {"stage": _stage, "options": _options,
                                                                     "__doc__": f"ZeRO stage {_stage}."}))
