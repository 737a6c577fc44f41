"""ZeRO: data parallelism that shards what plain data parallelism replicates (seed claim P4's catch).

P4 says every GPU holds a full copy of the model. ZeRO (Rajbhandari et al.
2020) keeps the data-parallel arithmetic and cuts the copies: stage 1 shards
the optimiser state, stage 2 the gradients too (a reduce-scatter instead of an
all-reduce), stage 3 the parameters too (all-gathered before use, freed
after). Built on chapter 01's ring reduce-scatter and all-gather; registered
for :func:`coursekit.train.train` as ``"zero1"``, ``"zero2"``, ``"zero3"`` (:mod:`.zero_strategy`).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from ...collectives import RING, Collectives, get_collectives
from ...comm.mesh import as_group, rank_size
from ...strategy import optimizer_tensors
from .core import broadcast_parameters
from .buckets import DDP_BUCKET_CAP_MB, bucket_capacity
from .flat import lay_flat, make_buckets
from .precision import LossScaler, MixedPrecision, as_policy, cast_inputs, loss_scaler_for

__all__ = ["ZeRO"]


class ZeRO(nn.Module):
    """ZeRO data parallelism: optimiser state (stage 1), gradients (2) and parameters (3) sharded over the ranks.

    The trainable parameters are laid end to end in one flat buffer (each
    parameter becomes a view into it), and the buffer is cut into *buckets*:
    contiguous ranges of about ``bucket_cap_mb`` megabytes, in backward order
    (the last layers first; DDP's 25 MB by default, one bucket for the course's
    models; :mod:`coursekit.parallel.data.buckets` is the rule). Each bucket
    is cut into ``N`` segments as chapter 01's ring cuts it: rank ``r`` *owns*
    segment ``owned_segment(r, N)`` of every bucket, keeps the optimiser state
    of those segments only and updates only them.

    One step:

    * stage 1: forward, backward (gradients accumulate into a full flat
      gradient buffer, kept between steps), **reduce-scatter** each bucket
      (each rank gets the summed gradient of its segments), optimiser step on
      the segments, **all-gather** the updated segments into every rank's full
      parameters. 2Ψ elements per rank, as plain data parallelism (an
      all-reduce *is* a reduce-scatter plus an all-gather).
    * stage 2: the same traffic, but a bucket's gradient buffer exists only
      while backward fills it. When the last gradient of a bucket is complete
      (a ``post_accumulate_grad`` hook) the bucket is reduce-scattered *during
      backward*, my segment is added to my gradient shard and the full bucket
      is freed. So at its peak a rank holds its shard plus the buckets
      backward is filling -- not Ψ gradients (:class:`~.zero_strategy.MeasuredZeRO`
      measures it, from outside). Every backward communicates (gradient accumulation adds
      the reduced segments), as DeepSpeed's ZeRO-2 does.
    * stage 3: stage 2's gradients, and between steps a rank holds only its
      segments of the parameters. **all-gather** before the forward pass, free
      after it; all-gather again when the backward pass reaches the model (a
      hook on the output), free after the step. 3Ψ elements per rank.

        >>> model = ZeRO(tiny_transformer(seed=0), lambda params: torch.optim.Adam(params, lr=1e-3), stage=2,
        ...              bucket_cap_mb=0.1)
        >>> loss_fn(model(x), y).backward()   # each bucket reduce-scattered and freed as backward completes it
        >>> model.step()                      # optimiser step on my segments, all-gather
        >>> model.zero_grad()

    Mixed precision (``mp_policy``, a :class:`~coursekit.parallel.data.MixedPrecision` or ``"bf16"``): the
    flat buffer -- what the module computes with and what is all-gathered -- is in ``param_dtype``; my
    segments are an fp32 *master* copy the optimiser steps, cast into the buffer after each step;
    gradients are cast to ``reduce_dtype`` before each reduce-scatter and kept in fp32 on my segments.
    With fp16 a :class:`~coursekit.parallel.data.LossScaler` (dynamic, by default) scales the backward and
    skips a step whose gradients overflowed on any rank.

    Buckets are reduce-scattered in bucket order on every rank (a bucket waits
    for the earlier ones), and the end of backward sends the buckets no hook
    completed (unused parameters: zeros), so every rank issues the same
    collectives in the same order.

    Only element-wise optimisers are exact here (SGD, momentum, Adam, AdamW):
    each rank sees only its segments. (Gradient clipping by global norm needs
    one more all-reduce, of the squared norm: :func:`~coursekit.parallel.data.clip_grad_norm_`,
    an option of ``"zero3_units"``; not wired into these stages.)

    Simplification (said honestly): stage 3 gathers *all* parameters for the
    forward pass, so its parameter peak is a full copy; the ``"zero3_units"``
    strategy (:mod:`coursekit.parallel.data.fsdp`) gathers one unit at a time.
    """

    def __init__(self, module: nn.Module, optimizer_fn: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 stage: int = 1, group=None, collectives: str | Collectives = "ring",
                 bucket_cap_mb: float | None = DDP_BUCKET_CAP_MB, *, bucket_elements: int | None = None,
                 mp_policy: MixedPrecision | str | None = None, loss_scaler: LossScaler | bool | None = None):
        super().__init__()
        if stage not in (1, 2, 3):
            raise ValueError(f"ZeRO stage must be 1 (optimiser state), 2 (+ gradients) or 3 (+ parameters); "
                             f"got {stage!r}.")
        group = as_group(group)
        self.module = broadcast_parameters(module, group=group)
        self.stage, self.group = stage, group
        self.shard_grads = stage >= 2   # reduce-scatter during backward, keep only my segments of the gradients
        self.shard_params = stage == 3  # keep only my segments of the parameters between uses
        self.comm = get_collectives(collectives)
        self.rank, self.world_size = rank_size(group)
        self.policy = as_policy(mp_policy)
        # None: dynamic loss scaling for fp16, none otherwise; False: none at all (to see what fp16 loses without)
        self.scaler = loss_scaler_for(self.policy, loss_scaler)
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]  # tied: once
        master = self._flatten(named, bucket_cap_mb, bucket_elements)
        # My segments, as the parameters the optimiser sees. Stages 1-2: views (no copy); stage 3: their own
        # storage, because the full buffer is freed between uses; mixed precision: fp32 master copies.
        own = self.shard_params or self.policy.mixed
        self.pieces = [nn.Parameter(master[b.start:b.stop].clone() if own else self.flat_param[b.start:b.stop])
                       for b in self.buckets]
        self.optimizer = optimizer_fn([piece for piece in self.pieces if piece.numel()])
        self.flat_grad: torch.Tensor | None = None  # stage 1's full gradient buffer
        self._next = 0          # stage 2-3: the next bucket to reduce-scatter in this backward
        self._steps = 0         # optimiser steps taken (the first one checks the ring's lengths)
        self._in_backward = False
        self._reducing: torch.Tensor | None = None  # a bucket cast to reduce_dtype, while it is reduced
        if self.shard_grads:
            for i, p in enumerate(self.params):
                p.register_hook(lambda grad, i=i: self._gradient_arrives(i))
                p.register_post_accumulate_grad_hook(lambda p, i=i: self._gradient_complete(i))
        if self.shard_params:
            self._free_params()

    def _flatten(self, named: list[tuple[str, nn.Parameter]], bucket_cap_mb, bucket_elements) -> torch.Tensor:
        """The flat buffer in the compute dtype (the parameters become views of it) and its buckets.

        Returns the master copy: the parameters' own values in their own dtype, taken before any cast. With
        mixed precision my segments of it are what the optimiser steps (fp32), never the rounded bf16 ones.
        A bucket's megabytes count the buffer that is reduced (``reduce_dtype``), as DDP's count the buffer it
        all-reduces: with an fp32 reduce a bucket holds as many elements as in an fp32 run.
        """
        master = torch.cat([p.detach().reshape(-1) for _, p in named]) if named else None
        dtype = self.policy.compute_dtype(named[0][1].dtype) if named else None
        self.params, self.layout, self.flat_param, self._views = lay_flat(named, dtype)  # refuses no parameter
        self.numel = self.flat_param.numel()
        self.reduce_dtype = self.policy.reduce(master.dtype)
        capacity = bucket_capacity(bucket_cap_mb, torch.empty(0, dtype=self.reduce_dtype),
                                   bucket_elements=bucket_elements)
        self.buckets = make_buckets(self._views, capacity, self.rank, self.world_size)
        self._bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket.members}
        return master

    @property
    def bucket_sizes(self) -> list[int]:
        return [b.hi - b.lo for b in self.buckets]

    # ---------------------------------------------------------------- parameters (stage 3)
    def _gather_params(self) -> bool:
        """Stage 3: the full parameters back from every rank's segments; True if they had been freed."""
        storage = self.flat_param.untyped_storage()
        if storage.nbytes() != 0:
            return False
        storage.resize_(self.numel * self.flat_param.element_size())
        # write through .data: autograd must not see this as an in-place change of a saved tensor
        self._all_gather(self.flat_param.data)
        return True

    def _all_gather(self, flat: torch.Tensor) -> None:
        """Put my (updated) segments in place, then gather everyone's, bucket by bucket, into ``flat``."""
        for bucket, piece in zip(self.buckets, self.pieces):
            mine = flat[bucket.start:bucket.stop]
            if mine.data_ptr() != piece.data.data_ptr():
                mine.copy_(piece.data)
            self.comm.all_gather(mine, flat[bucket.lo:bucket.hi], group=self.group, **self._checks())

    def _free_params(self) -> None:
        self.flat_param.untyped_storage().resize_(0)

    # ---------------------------------------------------------------- forward / backward
    def forward(self, *args, **kwargs):
        if self.policy.mixed and self.policy.cast_forward_inputs:
            args, kwargs = cast_inputs(args, kwargs, self.flat_param.dtype)
        if self.shard_params:
            self._gather_params()
        if not self.shard_grads:  # stage 1: gradients accumulate into one full flat buffer (views per parameter)
            if self.flat_grad is None:
                self.flat_grad = torch.zeros(self.numel, dtype=self.flat_param.dtype, device=self.flat_param.device)
            for p, (offset, n) in zip(self.params, self._views):
                _attach(p, self.flat_grad[offset:offset + n])
        output = self.module(*args, **kwargs)
        if self.policy.output_dtype is not None and isinstance(output, torch.Tensor):
            output = output.to(self.policy.output_dtype)
        if self.scaler is not None and isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(self.scaler.scale_gradient)  # backward of (loss × scale)
        if self.shard_params:
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(self._before_backward)
            elif torch.is_grad_enabled():
                raise ValueError("ZeRO-3 here gathers the parameters again when backward reaches the model's "
                                 "output, so the module must return one tensor that requires grad (wrap it to "
                                 "return e.g. the logits only).")
            self._free_params()
        return output

    def _before_backward(self, grad: torch.Tensor) -> torch.Tensor:
        self._gather_params()  # backward needs the full weights again
        return grad

    def _gradient_arrives(self, i: int) -> None:
        """Before autograd writes parameter ``i``'s gradient: make sure its bucket's buffer exists."""
        if not self._in_backward:  # the first gradient of this backward: finish every bucket when it ends
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        bucket = self.buckets[self._bucket_of[i]]
        if bucket.grad is None:  # allocated only now, freed as soon as it is reduce-scattered
            bucket.grad = torch.zeros(bucket.hi - bucket.lo, dtype=self.flat_param.dtype,
                                      device=self.flat_param.device)
            for j in bucket.members:  # autograd accumulates in place into these views
                offset, n = self._views[j]
                _attach(self.params[j], bucket.grad[offset - bucket.lo:offset - bucket.lo + n])

    def _gradient_complete(self, i: int) -> None:
        bucket = self.buckets[self._bucket_of[i]]
        bucket.ready += 1
        while self._next < len(self.buckets) and \
                self.buckets[self._next].ready == len(self.buckets[self._next].members):
            self._reduce_scatter_bucket(self._next)  # in bucket order: every rank issues the same sequence

    def _end_of_backward(self) -> None:
        while self._next < len(self.buckets):  # buckets no hook completed (unused parameters): zeros
            self._reduce_scatter_bucket(self._next)
        self._next, self._in_backward = 0, False
        for bucket in self.buckets:
            bucket.ready = 0

    @torch.no_grad()
    def _reduce_scatter_bucket(self, b: int) -> None:
        """Stage 2-3, during backward: sum bucket ``b`` over the ranks, add my segment to my shard, free it."""
        self._sum_bucket(b)
        self._free_bucket(b)

    def _sum_bucket(self, b: int) -> None:
        """Reduce-scatter bucket ``b``: my segment of the sum, added to my gradient shard."""
        bucket, piece = self.buckets[b], self.pieces[b]
        if bucket.grad is None:
            bucket.grad = torch.zeros(bucket.hi - bucket.lo, dtype=self.flat_param.dtype,
                                      device=self.flat_param.device)
        mine = self.comm.reduce_scatter(self._to_reduce(bucket.grad), group=self.group, **self._checks())
        mine = mine.to(piece.dtype)  # mixed precision: the master's dtype (no copy when they agree)
        piece.grad = mine.clone() if piece.grad is None else piece.grad.add_(mine)

    def _free_bucket(self, b: int) -> None:
        """Drop the full bucket ``b`` (and its cast copy): from here on a rank keeps only its segment."""
        self._reducing = None
        for j in self.buckets[b].members:
            self.params[j].grad = None
        self.buckets[b].grad = None
        self._next = b + 1

    # ---------------------------------------------------------------- the step
    @torch.no_grad()
    def step(self) -> None:
        """Reduce-scatter (stage 1; stages 2-3 did it during backward), step my segments, all-gather or free."""
        if self.shard_grads:
            if all(piece.grad is None for piece in self.pieces):
                raise RuntimeError("ZeRO.step() before any backward pass: call model(inputs), loss.backward() "
                                   "first.")
            for piece in self.pieces:
                piece.grad.div_(self.world_size)
        else:
            if self.flat_grad is None:
                raise RuntimeError("ZeRO.step() before any backward pass: call model(inputs), loss.backward() "
                                   "first.")
            self._reduce_scatter_grads()
        self._optimizer_step()
        if self.shard_params:
            self._free_params()  # gathered again at the next forward
        else:
            self._all_gather(self.flat_param)
        self._steps += 1

    def _reduce_scatter_grads(self) -> None:
        """Stage 1, at the step: reduce-scatter every bucket of the full gradient buffer, averaged."""
        for b in range(len(self.buckets)):
            self._average_segment(b)
            self._reducing = None

    def _average_segment(self, b: int) -> None:
        bucket, piece = self.buckets[b], self.pieces[b]
        # a view into the full gradient buffer, which stage 1 keeps
        reduced = self.comm.reduce_scatter(self._to_reduce(self.flat_grad[bucket.lo:bucket.hi]),
                                           group=self.group, **self._checks())
        # fp32: a view into the full buffer, which stage 1 keeps; mixed: a copy, so the cast buffer goes
        piece.grad = reduced.to(piece.dtype, copy=self.policy.mixed)
        piece.grad.div_(self.world_size)

    def _optimizer_step(self) -> None:
        if self._unscale_and_check():
            self.optimizer.step()

    def _unscale_and_check(self) -> bool:
        """With a loss scaler: divide my segments' gradients by the scale and tell whether to step.

        Each rank sees only its segments, so whether *any* gradient overflowed is one all-reduce of a flag
        (:meth:`LossScaler.unscale_and_update`; ``inf_checks`` counts them): every rank skips the same steps.
        """
        if self.scaler is None:
            return True
        return self.scaler.unscale_and_update([piece.grad for piece in self.pieces], group=self.group)

    @property
    def inf_checks(self) -> int:
        """All-reduces of the overflow flag so far (one a step with a loss scaler, on more than one rank)."""
        return 0 if self.scaler is None else self.scaler.inf_checks

    def _to_reduce(self, grad: torch.Tensor) -> torch.Tensor:
        """``grad`` in the dtype gradients are summed in (``reduce_dtype``): a cast copy, or itself.

        The copy is a whole bucket in ``reduce_dtype`` (fp32: twice a bf16 bucket), alive while it is reduced:
        :meth:`held_tensors` counts it (``_reducing``) so the peak includes it.
        """
        if grad.dtype == self.reduce_dtype:
            return grad
        self._reducing = grad.to(self.reduce_dtype)
        return self._reducing

    def _checks(self) -> dict:
        """Keyword arguments for chapter 01's ring: its length check only until the first step is done.

        The buckets have the same layout on every rank by construction, and every call of the first
        step checked it, so later calls skip the check's message and wait (each ring call pays it
        otherwise). Every rank takes the same steps, so all switch at the same call.
        """
        return {"check_lengths": False} if self._steps and self.comm is RING else {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients: zero stage 1's full buffer in place (it is kept), drop my segments'."""
        if self.flat_grad is not None:
            self.flat_grad.zero_()
        for piece in self.pieces:
            piece.grad = None

    # ---------------------------------------------------------------- what a rank holds
    def held_tensors(self) -> dict[str, list[torch.Tensor]]:
        """The tensors this rank holds, by kind: ``params``, ``grads``, ``optimizer``."""
        frozen = [p for p in self.module.parameters() if not p.requires_grad]
        grads = [self.flat_grad] if self.flat_grad is not None else []
        grads += [b.grad for b in self.buckets if b.grad is not None]
        grads += [piece.grad for piece in self.pieces if piece.grad is not None]
        grads += [self._reducing] if self._reducing is not None else []
        if self.policy.mixed:  # my segments are the fp32 master copy: optimiser state, as the ZeRO paper's K counts it
            return {"params": [self.flat_param] + frozen, "grads": grads,
                    "optimizer": list(self.pieces) + optimizer_tensors(self.optimizer)}
        return {"params": [self.flat_param, *self.pieces] + frozen,
                "grads": grads,
                "optimizer": optimizer_tensors(self.optimizer)}


def _attach(p: nn.Parameter, view: torch.Tensor) -> None:
    """Make ``p.grad`` a view into a flat buffer (copying a gradient autograd made elsewhere)."""
    view = view.view_as(p)
    if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
        view.copy_(p.grad)
    p.grad = view
