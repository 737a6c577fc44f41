"""Mixed precision: compute in 16 bits, keep the master weights and the optimiser in 32 (issue 23).

Every production trainer computes in bfloat16 (or float16) and keeps an fp32 copy of the weights: a 16-bit
weight cannot take an update much smaller than itself (bf16 has 8 bits of mantissa: ``1 + 2**-9`` rounds
to 1), so the optimiser steps the fp32 *master* copy and the 16-bit compute copy is cast from it after
every step. That is where the ZeRO paper's bytes per parameter come from (Rajbhandari et al. 2020, §3.1):

=================  ===========================  ===========================================
what               bytes per parameter           ZeRO shards it from stage
=================  ===========================  ===========================================
16-bit parameters  2                            3
16-bit gradients   2                            2
optimiser state    K = 12: fp32 master (4),     1
                   Adam's m and v (4 + 4)
=================  ===========================  ===========================================

:class:`MixedPrecision` names the choices as PyTorch's FSDP2 does (``torch.distributed.fsdp.
MixedPrecisionPolicy``), so the same policy reads the same in both:

* ``param_dtype``: the dtype the forward and backward compute in (the parameters are cast to it);
  None keeps the parameters' own.
* ``reduce_dtype``: the dtype gradients are summed over the ranks in. Summing G bf16 gradients in bf16
  rounds at every step of the ring; ``torch.float32`` casts them up first (twice the bytes on the wire).
  None: ``param_dtype``.
* ``output_dtype``: the dtype the model's output is cast to (None: leave it), e.g. fp32 logits for the loss.
* ``cast_forward_inputs``: cast floating-point inputs to ``param_dtype`` (token ids are left alone).

    >>> policy = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32)
    >>> policy.compute_dtype(torch.float32), policy.reduce(torch.float32)
    (torch.bfloat16, torch.float32)
    >>> as_policy("bf16") == policy
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["MixedPrecision", "as_policy", "cast_inputs", "LossScaler", "autocast", "loss_scaler_for", "scaler_counters"]

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclass(frozen=True)
class MixedPrecision:
    """Which dtype the model computes in, the gradients are reduced in, and the output is returned in.

    The field names and their meaning are FSDP2's ``MixedPrecisionPolicy``'s; None everywhere is full
    precision (the parameters' own dtype throughout).
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True

    def __post_init__(self):
        for name in ("param_dtype", "reduce_dtype", "output_dtype"):
            dtype = getattr(self, name)
            if dtype is not None and dtype not in FLOAT_DTYPES:
                raise ValueError(f"MixedPrecision({name}={dtype!r}): use a floating-point dtype, one of "
                                 f"{[str(d) for d in FLOAT_DTYPES]}, or None for the parameters' own.")

    def compute_dtype(self, master: torch.dtype) -> torch.dtype:
        """The dtype the forward and backward run in, for master weights of dtype ``master``."""
        return self.param_dtype or master

    def reduce(self, master: torch.dtype) -> torch.dtype:
        """The dtype gradients are reduced in: ``reduce_dtype``, else the compute dtype."""
        return self.reduce_dtype or self.compute_dtype(master)

    @property
    def mixed(self) -> bool:
        """True when the model computes in another dtype than its master weights are kept in."""
        return self.param_dtype is not None


# The loss is taken on fp32 outputs in each (torchtitan casts the logits to float for its loss the same way).
SHORTHANDS = {
    "fp32": MixedPrecision(),
    "bf16": MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32),
    "bf16-reduce-bf16": MixedPrecision(param_dtype=torch.bfloat16, output_dtype=torch.float32),
    "fp16": MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float32, output_dtype=torch.float32),
}


def as_policy(precision: MixedPrecision | str | None) -> MixedPrecision:
    """A :class:`MixedPrecision` from what ``train(..., precision=)`` accepts: a policy, a shorthand, or None.

    Shorthands: ``"fp32"`` (None: full precision), ``"bf16"`` (bf16 compute, fp32 reduce: the usual choice),
    ``"bf16-reduce-bf16"``, ``"fp16"`` (fp16 compute, fp32 reduce; ZeRO adds a dynamic :class:`LossScaler`);
    each returns fp32 outputs for the loss.
    """
    if precision is None:
        return SHORTHANDS["fp32"]
    if isinstance(precision, MixedPrecision):
        return precision
    if isinstance(precision, str) and precision in SHORTHANDS:
        return SHORTHANDS[precision]
    raise ValueError(f"precision={precision!r}: pass a coursekit.parallel.data.MixedPrecision(param_dtype=..., "
                     f"reduce_dtype=...) or one of {sorted(SHORTHANDS)}.")


def autocast(precision: MixedPrecision | str | None, device_type: str = "cpu", who: str = "plain data parallelism"):
    """Mixed precision for *plain* data parallelism, as ``DistributedDataParallel`` is used with it: the forward
    under ``torch.autocast(device_type, dtype=param_dtype)``. The parameters stay fp32 (they are the master
    weights: there is no 16-bit copy to keep), matmuls run in bf16 or fp16, the gradients come out fp32 and are
    all-reduced in fp32 -- so the memory is fp32's (4 + 4 + 8 bytes a parameter), only the activations shrink.
    ZeRO's ``precision=`` is the other design (16-bit parameters, an fp32 master in the optimiser).

    fp16 needs a loss scale (:class:`LossScaler`, which the strategies add by default, as
    ``torch.amp.GradScaler`` is used with DDP). A bf16 reduce is refused: the gradients autocast leaves are
    fp32, and reducing them in bf16 would need a cast copy of every bucket (ZeRO does that). The composed strategy
    ``"hybrid"`` uses the same design on every layout (``who`` names the strategy in the refusal).
    """
    from contextlib import nullcontext

    policy = as_policy(precision)
    if policy.param_dtype is None:
        return nullcontext()
    if policy.param_dtype not in (torch.bfloat16, torch.float16) or policy.reduce(torch.float32) != torch.float32:
        raise ValueError(f"precision={precision!r} with {who}: only 'bf16' or 'fp16' (16-bit "
                         f"compute under torch.autocast, fp32 gradients reduced in fp32). A bf16 reduce is ZeRO's: "
                         f"train(..., 'zero2', precision=...).")
    return torch.autocast(device_type, dtype=policy.param_dtype)


def loss_scaler_for(precision: MixedPrecision | str | None, loss_scaler: "LossScaler | bool | None" = None):
    """The loss scaler a strategy runs with: ``loss_scaler`` as given, a dynamic :class:`LossScaler` for fp16
    when it is None, and none at all when it is False (to see what fp16 loses without one) or for bf16/fp32."""
    if loss_scaler is None:
        return LossScaler() if as_policy(precision).param_dtype == torch.float16 else None
    return loss_scaler or None


def scaler_counters(scaler: "LossScaler | None") -> dict:
    """What a strategy reports of its loss scaler: the scale now, the steps skipped, the flag all-reduces
    (None, 0, 0 without one)."""
    if scaler is None:
        return {"loss_scale": None, "skipped_steps": 0, "inf_checks": 0}
    return {"loss_scale": scaler.scale, "skipped_steps": scaler.skipped, "inf_checks": scaler.inf_checks}


def cast_inputs(args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` with every floating-point tensor cast to ``dtype`` (token ids stay integers)."""
    def cast(x):
        return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


@dataclass
class LossScaler:
    """Dynamic loss scaling for fp16, as ``torch.amp.GradScaler`` does it (the same names and defaults).

    fp16 has 5 exponent bits: gradients below 2**-24 flush to zero and the largest number is 65,504. So the
    backward runs on the loss times ``scale`` (gradients scaled into fp16's range), and the optimiser gets
    them divided back. When a gradient overflowed (inf or NaN anywhere, on any rank) the step is *skipped*
    and the scale cut by ``backoff_factor``; after ``growth_interval`` good steps in a row it grows by
    ``growth_factor``. bf16 has fp32's 8 exponent bits and needs none of this.

        >>> scaler = LossScaler(init_scale=8.0, growth_interval=2)
        >>> [scaler.update(found_inf) or scaler.scale for found_inf in (True, False, False, False)]
        [4.0, 4.0, 8.0, 8.0]
    """

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    scale: float = field(init=False)
    skipped: int = field(init=False, default=0)   # steps skipped so far (an overflow somewhere)
    inf_checks: int = field(init=False, default=0)  # all-reduces of the overflow flag (sharded gradients only)
    _good: int = field(init=False, default=0)     # good steps since the last change of scale

    def __post_init__(self):
        self.scale = float(self.init_scale)

    def scale_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        """A hook on the model's output: the gradient entering backward, times the scale (= a scaled loss)."""
        return grad * self.scale

    def update(self, found_inf: bool) -> None:
        """After a step: back off on an overflow (the step was skipped), grow after enough good steps."""
        if found_inf:
            self.scale *= self.backoff_factor
            self._good, self.skipped = 0, self.skipped + 1
            return
        self._good += 1
        if self._good == self.growth_interval:
            self.scale *= self.growth_factor
            self._good = 0

    def unscale_and_update(self, grads: list[torch.Tensor | None], group=None, *, replicated: bool = False) -> bool:
        """Divide ``grads`` by the scale in place, update the scale, and tell whether the step may be taken.

        ``torch.amp.GradScaler``'s ``unscale_``, the skip in its ``step`` and its ``update`` in one. Where
        the gradients are *sharded* (ZeRO, ``"zero3_units"``) a rank sees only its segments, so whether any
        gradient overflowed anywhere is one all-reduce (MAX) of a flag over ``group``, counted in
        ``inf_checks``: every rank skips the same steps and the scale stays the same everywhere. Where they
        are *replicated* (plain data parallelism, after the all-reduce: every rank holds the same bits),
        ``replicated=True`` checks locally and sends nothing.
        """
        import torch.distributed as dist

        device = next((g.device for g in grads if g is not None), torch.device("cpu"))
        flag = torch.zeros(1, device=device)  # on the gradients' device: NCCL moves it
        for grad in grads:
            if grad is not None:
                grad.mul_(1.0 / self.scale)
                flag += (~torch.isfinite(grad)).any().float()
        if not replicated and dist.is_initialized() and dist.get_world_size(group) > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
            self.inf_checks += 1
        bad = bool(flag.item())
        self.update(bad)
        return not bad
