"""ZeRO-3 by units in the training loop: ``"zero3_units"`` for :func:`coursekit.train.train`.

:class:`~coursekit.parallel.data.fsdp.ShardedUnits` is the algorithm; this is the adapter the one training loop
calls: its optimiser steps my segment of every unit (and the parameters kept whole), with fp16's loss scale
and clipping by the global norm where asked.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from ...measure.memory import PeakMemory
from ...strategy import Setup, Strategy, optimizer_tensors, register
from .clip import clip_grad_norm_
from .fsdp import ShardedUnits
from .precision import scaler_counters

__all__ = ["MeasuredUnits", "Zero3Units"]


class MeasuredUnits(ShardedUnits):
    """:class:`ShardedUnits`, measured: :attr:`peak` notes what the rank holds at every moment it can peak --
    each gather and free of a unit, each full gradient allocated, each gradient cast for its reduce-scatter.
    ``optimizer`` (set once it exists) adds its state; with mixed precision my segments are the fp32 master,
    optimiser state as the ZeRO paper's K counts it (:class:`~coursekit.parallel.data.MeasuredZeRO` alike)."""

    optimizer = None

    def _measure(self) -> None:
        super()._measure()
        if "peak" in self.__dict__:  # ShardedUnits frees the units before this class made its meter
            self.peak.note(self.held_tensors())

    def held_tensors(self) -> dict[str, list[torch.Tensor]]:
        units, whole = self.units, list(self.whole.values())
        masters = [u.shard for u in units]
        grads = [g for u in units for g in (u.flat_grad, u.sending, u.shard.grad) if g is not None]
        state = optimizer_tensors(self.optimizer) if self.optimizer is not None else []
        params = [u.flat for u in units] + list(self.frozen.values()) + whole
        if self.policy.mixed:
            return {"params": params, "grads": grads + [p.grad for p in whole if p.grad is not None],
                    "optimizer": masters + state}
        return {"params": params + masters, "grads": grads + [p.grad for p in whole if p.grad is not None],
                "optimizer": state}


@register("zero3_units")
class Zero3Units(Strategy):
    """:class:`ShardedUnits` in the training loop; the optimiser steps my segment of every unit."""

    options = {"collectives": "ring", "units": None, "prefetch": True, "precision": None, "clip_norm": None,
               "loss_scaler": None, "replicate": None}

    def __init__(self, setup: Setup):
        super().__init__(setup)
        self.norms: list[float] = []  # with clip_norm: each step's global gradient norm, before clipping
        self.model = MeasuredUnits(setup.model, self.option("units"), self.group, self.option("collectives"),
                                  setup.tracer, self.option("prefetch"), self.option("precision"),
                                  self.option("loss_scaler"), self.option("replicate"))
        self.optimizer = self.model.optimizer = setup.optimizer_fn(self.model.shard_parameters())
        self.model.peak = self.peak = PeakMemory()  # noted inside forward and backward too (the loop adds its own)
        self.peaks: list[int] = []

    def backward_context(self, last: bool):
        return nullcontext() if last else self.model.no_sync()

    def step(self) -> None:
        """fp16: unscale first and skip the step on an overflow (clipping must see true gradients, as with
        ``GradScaler.unscale_``). Option ``clip_norm``: clip by the global norm -- one all-reduce of one
        number (:mod:`.clip`)."""
        if not self.model.unscale_and_check():
            return
        if self.option("clip_norm") is not None:
            with self.span("comm", "all-reduce the gradient norm"):
                segments = [u.shard for u in self.model.units]
                norm = clip_grad_norm_(segments, self.option("clip_norm"), group=self.group,
                                       collectives=self.option("collectives"), whole=list(self.model.whole.values()))
            self.norms.append(norm.item())
        super().step()

    def zero_grad(self) -> None:
        self.peaks.append(self.model.reset_peak())  # this step's peak; the next step starts afresh
        self.optimizer.zero_grad(set_to_none=True)

    def gradients(self):
        return self.model.full_gradients()

    def parameters(self):
        return self.model.full_parameters()

    def held_tensors(self) -> dict[str, list[torch.Tensor]]:
        return self.model.held_tensors()

    def counters(self) -> dict:
        moved = self.record.collective_counts("collectives")  # the units' collectives, as comm recorded them
        units = self.model
        return {**scaler_counters(units.scaler), "peak_param_bytes": list(self.peaks), "grad_norms": list(self.norms),
                "unit_sizes": [u.numel for u in units.blocks], "root_size": units.root.numel if units.root else 0,
                "compute_dtype": str(units.units[0].flat.dtype).split(".")[-1],
                **{f"elements_{name}": moved.total(op) for name, op in (("all_gathered", "all_gather"),
                   ("reduce_scattered", "reduce_scatter"), ("all_reduced", "all_reduce"))}}
