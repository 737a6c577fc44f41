"""The same strategies in PyTorch's production API, as training-loop strategies to run side by side.

Every chapter ends with PyTorch doing what the chapter built by hand, run by
the same loop (:func:`coursekit.train.train`) on the same model and batches,
so the two can be proven equal and timed together:

=====================================================  ===================================================
coursekit                                              PyTorch (registered here as)
=====================================================  ===================================================
``DataParallel(model, bucket_cap_mb, group)``          ``DistributedDataParallel(model, bucket_cap_mb=...,
                                                       process_group=...)`` (``"torch_ddp"``)
``model.no_sync()``                                    ``ddp.no_sync()``
``broadcast_parameters(model)``                        done inside DDP's constructor
``ZeRO(..., stage=1)`` (optimiser state sharded)       DDP + ``ZeroRedundancyOptimizer(params,
                                                       optimizer_class=...)`` (``"torch_zero1"``)
``ZeRO(..., stage=3)`` (parameters sharded)            FSDP2 ``fully_shard`` on each block, then the
                                                       root (``"torch_fsdp"``)
``precision="fp16"``: :class:`LossScaler`               ``torch.amp.GradScaler`` (:func:`grad_scaler`)
=====================================================  ===================================================

    >>> train(rank, world_size, "torch_ddp", model="transformer", bucket_cap_mb=0.1)   # doctest: +SKIP
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from ...measure.memory import held_bytes
from ...strategy import Setup, Strategy, optimizer_tensors, register
from .buckets import DDP_BUCKET_CAP_MB
from .precision import as_policy, autocast, loss_scaler_for

__all__ = ["TorchDDP", "TorchZeRO1", "TorchFSDP", "FSDP2ParameterBytes", "optimizer_class_and_defaults", "grad_scaler",
           "GradScaling"]


def optimizer_class_and_defaults(setup: Setup) -> tuple[type, dict]:
    """Which optimiser class and settings ``setup.optimizer_fn`` makes (ZeroRedundancyOptimizer wants a class)."""
    probe = setup.optimizer_fn([nn.Parameter(torch.zeros(1))])
    defaults = {k: v for k, v in probe.defaults.items() if k in ("lr", "momentum", "betas", "eps", "weight_decay")}
    return type(probe), defaults


def grad_scaler(precision, loss_scaler, device_type: str = "cpu") -> torch.amp.GradScaler | None:
    """PyTorch's ``torch.amp.GradScaler`` where the course's strategies would run a :class:`LossScaler`: for fp16
    by default, with the given scaler's settings (``init_scale``, ``growth_factor`` ...), none for False."""
    ours = loss_scaler_for(precision, loss_scaler)
    if ours is None:
        return None
    return torch.amp.GradScaler(device_type, init_scale=ours.init_scale, growth_factor=ours.growth_factor,
                                backoff_factor=ours.backoff_factor, growth_interval=ours.growth_interval)


class GradScaling(Strategy):
    """fp16 as PyTorch does it, for the strategies below (option ``loss_scaler``, read as :func:`grad_scaler`).

    ``GradScaler.scale`` multiplies the gradient entering backward (the loop owns ``loss.backward()``;
    ``scale(loss).backward()`` sends exactly this gradient), ``GradScaler.step`` unscales and skips the step
    if a gradient is inf or NaN (FSDP2's DTensor gradients: the flag is all-reduced by DTensor's own
    handler), ``update`` moves the scale. GradScaler keeps no count of skipped steps: a step whose update
    backed the scale off was one.
    """

    def start_scaling(self) -> None:
        device_type = next(self.model.parameters()).device.type
        self.scaler = grad_scaler(self.option("precision"), self.option("loss_scaler"), device_type)
        self.skipped = 0

    def scale_backward(self, output: torch.Tensor) -> torch.Tensor:
        if self.scaler is not None and output.requires_grad:
            output.register_hook(self.scaler.scale)
        return output

    def step(self) -> None:
        if self.scaler is None:
            return super().step()
        with self.span("optimizer", "step"):
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.skipped += self.scaler.get_scale() < before

    def counters(self) -> dict:
        return {"loss_scale": None if self.scaler is None else self.scaler.get_scale(), "skipped_steps": self.skipped}


@register("torch_ddp")
class TorchDDP(GradScaling):
    """``torch.nn.parallel.DistributedDataParallel``: gradients averaged by the time backward returns."""

    # DDP's cap; None: one bucket, as in the course
    options = {"bucket_cap_mb": DDP_BUCKET_CAP_MB, "precision": None, "loss_scaler": None}

    def __init__(self, setup: Setup):
        super().__init__(setup)
        cap = self.option("bucket_cap_mb")
        if cap is None:  # as large as the model: one bucket (DDP itself reads None as 25 MB; its first bucket is 1 MB)
            cap = sum(p.numel() * p.element_size() for p in self.model.parameters()) / 2**20
        self.ddp = nn.parallel.DistributedDataParallel(self.model, process_group=self.group, bucket_cap_mb=cap)
        self.start_scaling()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        with autocast(self.option("precision"), inputs.device.type):  # DDP under torch.autocast, as it is used
            return self.scale_backward(self.ddp(inputs).float())

    def micro_batch_context(self, last: bool):
        # DDP decides in forward whether the backward will communicate: no_sync must wrap both
        return super().micro_batch_context(last) if last else self.ddp.no_sync()


@register("torch_zero1")
class TorchZeRO1(TorchDDP):
    """DDP for the gradients, ``ZeroRedundancyOptimizer`` for the optimiser state: ZeRO stage 1."""

    def __init__(self, setup: Setup):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        super().__init__(setup)
        optimizer_class, defaults = optimizer_class_and_defaults(setup)
        self.optimizer = ZeroRedundancyOptimizer([p for p in self.model.parameters() if p.requires_grad],
                                                 optimizer_class=optimizer_class, process_group=self.group,
                                                 **defaults)

    def held_tensors(self) -> dict[str, list[torch.Tensor]]:
        held = super().held_tensors()
        held["optimizer"] = optimizer_tensors(self.optimizer.optim)  # this rank's shard of the state only
        return held


class FSDP2ParameterBytes:
    """The bytes of parameter storage an FSDP2 model holds, sampled before every leaf module's forward and
    backward, and the maximum seen (:attr:`peak`), to set beside :class:`coursekit.parallel.data.ShardedUnits`'
    ``peak_param_bytes``.

    What it counts, through FSDP2's own (private, torch 2.13) objects: every parameter's padded shard, every
    all-gather output in flight and every unsharded parameter still allocated; a freed buffer (its storage
    resized to 0, as FSDP2 frees) counts nothing, a view nothing extra (:func:`coursekit.measure.memory.held_bytes`).

        >>> meter = FSDP2ParameterBytes(model)       # after fully_shard   # doctest: +SKIP
        >>> loss_fn(model(x), y).backward(); meter.reset()   # this step's peak
    """

    def __init__(self, model: nn.Module):
        self.groups = [m._get_fsdp_state()._fsdp_param_group for m in model.modules()
                       if hasattr(m, "_get_fsdp_state") and m._get_fsdp_state()._fsdp_param_group is not None]
        if not self.groups:
            raise ValueError("FSDP2ParameterBytes needs a model after fully_shard: it has no FSDP parameter group.")
        self.peak = 0
        for module in model.modules():
            if not list(module.children()):
                module.register_forward_pre_hook(self.sample)
                module.register_full_backward_pre_hook(self.sample)

    def held(self) -> int:
        tensors = [g._all_gather_result.all_gather_output for g in self.groups if g._all_gather_result is not None]
        for fsdp_param in (fp for g in self.groups for fp in g.fsdp_params):
            tensors += [fsdp_param._sharded_param_data, *fsdp_param.all_gather_outputs]
        return held_bytes(tensors)

    def sample(self, *_) -> None:
        self.peak = max(self.peak, self.held())

    def reset(self) -> int:
        """The peak since the last reset; start measuring afresh."""
        peak, self.peak = self.peak, self.held()
        return peak


@register("torch_fsdp")
class TorchFSDP(GradScaling):
    """FSDP2: ``fully_shard`` on each block of the model, then on the root; parameters become DTensors.

    Its counters give ``peak_param_bytes`` per step, measured by :class:`FSDP2ParameterBytes`, as
    ``"zero3_units"`` gives its own. Option ``precision``: a :class:`~coursekit.parallel.data.MixedPrecision`
    (or ``"bf16"``), handed to ``fully_shard`` as FSDP2's own ``MixedPrecisionPolicy`` with the same fields;
    for fp16, ``torch.amp.GradScaler`` (:class:`GradScaling`)."""

    options = {"precision": None, "loss_scaler": None}

    def __init__(self, setup: Setup):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        super().__init__(setup)
        mesh = DeviceMesh.from_group(self.group or dist.group.WORLD, "cpu")
        policy = as_policy(self.option("precision"))
        inner = MixedPrecisionPolicy(param_dtype=policy.param_dtype, reduce_dtype=policy.reduce_dtype,
                                     cast_forward_inputs=policy.cast_forward_inputs)
        for block in getattr(self.model, "blocks", None) or getattr(self.model, "layers", []):
            fully_shard(block, mesh=mesh, mp_policy=inner)  # one unit per block (per layer of the MLP)
        # output_dtype on the root only: FSDP2 casts each unit's output, and the next block wants param_dtype
        fully_shard(self.model, mesh=mesh, mp_policy=MixedPrecisionPolicy(
            param_dtype=policy.param_dtype, reduce_dtype=policy.reduce_dtype, output_dtype=policy.output_dtype,
            cast_forward_inputs=policy.cast_forward_inputs))
        self.meter, self.peaks = FSDP2ParameterBytes(self.model), []
        self.start_scaling()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.scale_backward(self.model(inputs))

    def zero_grad(self) -> None:
        self.peaks.append(self.meter.reset())  # this step's peak; the next step starts afresh
        super().zero_grad()

    def counters(self) -> dict:
        return {**super().counters(), "peak_param_bytes": list(self.peaks)}

    def backward_context(self, last: bool):
        # accumulate gradients locally, reduce-scatter only after the last micro-batch (FSDP2's no_sync)
        self.model.set_requires_gradient_sync(last)
        return super().backward_context(last)

    def gradients(self):
        return {n: p.grad.full_tensor() for n, p in self.model.named_parameters() if p.grad is not None}

    def parameters(self):
        return {n: p.detach().full_tensor() for n, p in self.model.named_parameters()}

    def held_tensors(self) -> dict[str, list[torch.Tensor]]:
        params = [p.to_local() for p in self.model.parameters()]
        grads = [p.grad.to_local() for p in self.model.parameters() if p.grad is not None]
        state = [v.to_local() if hasattr(v, "to_local") else v for v in optimizer_tensors(self.optimizer)]
        return {"params": params, "grads": grads, "optimizer": state}
