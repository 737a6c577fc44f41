"""ZeRO: data parallelism that shards what plain data parallelism replicates (seed claim P4's catch).

P4 says every GPU holds a full copy of the model. ZeRO (Rajbhandari et al.
2020) keeps the data-parallel arithmetic and cuts the copies: stage 1 shards
the optimiser state, stage 2 the gradients too (a reduce-scatter instead of an
all-reduce), stage 3 the parameters too (all-gathered before use, freed
after). Built on chapter 01's ring reduce-scatter and all-gather; registered
for :func:`coursekit.train.train` as ``"zero1"``, ``"zero2"``, ``"zero3"``.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

import torch
import torch.nn as nn

from ...collectives import RING, Collectives, get_collectives, owned_segment, segment_bounds
from ...mesh import as_group, rank_size
from ...strategy import Setup, Strategy, optimizer_tensors, register
from ...trace import Tracer
from ...verify import FlatShard
from ...memory import PeakMemory
from .averaging import broadcast_parameters
from .buckets import DDP_BUCKET_CAP_MB, bucket_capacity, megabytes

__all__ = ["ZeRO", "ZeroStrategy"]


class _Bucket:
    """A contiguous range ``[lo, hi)`` of the flat buffer, and my segment of it (``piece``, absolute)."""

    def __init__(self, lo: int, hi: int, members: list[int], rank: int, world_size: int):
        self.lo, self.hi, self.members = lo, hi, members  # members: indices into ZeRO.params
        start, stop = segment_bounds(hi - lo, world_size)[owned_segment(rank, world_size)]
        self.start, self.stop = lo + start, lo + stop
        self.grad: torch.Tensor | None = None  # the full gradient of this range while backward fills it
        self.ready = 0                         # how many members' gradients are complete


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
      backward is filling -- not Ψ gradients (:class:`coursekit.memory.PeakMemory`
      measures it). Every backward communicates (gradient accumulation adds
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

    Buckets are reduce-scattered in bucket order on every rank (a bucket waits
    for the earlier ones), and the end of backward sends the buckets no hook
    completed (unused parameters: zeros), so every rank issues the same
    collectives in the same order.

    Only element-wise optimisers are exact here (SGD, momentum, Adam, AdamW):
    each rank sees only its segments. (Gradient clipping by global norm would
    need one more all-reduce of the squared norms.)

    Simplification (said honestly): stage 3 gathers *all* parameters for the
    forward pass, so its parameter peak is a full copy; the ``"zero3_units"``
    strategy (:mod:`coursekit.parallel.data.fsdp`) gathers one unit at a time.
    """

    def __init__(self, module: nn.Module, optimizer_fn: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 stage: int = 1, group=None, collectives: str | Collectives = "ring", tracer: Tracer | None = None,
                 bucket_cap_mb: float | None = DDP_BUCKET_CAP_MB, *, bucket_elements: int | None = None):
        super().__init__()
        if stage not in (1, 2, 3):
            raise ValueError(f"ZeRO stage must be 1 (optimiser state), 2 (+ gradients) or 3 (+ parameters); "
                             f"got {stage!r}.")
        group = as_group(group)
        self.module = broadcast_parameters(module, group=group)
        self.stage, self.group, self.tracer = stage, group, tracer
        self.shard_grads = stage >= 2   # reduce-scatter during backward, keep only my segments of the gradients
        self.shard_params = stage == 3  # keep only my segments of the parameters between uses
        self.comm = get_collectives(collectives)
        self.rank, self.world_size = rank_size(group)
        self.peak = PeakMemory()        # noted inside backward, where the gradient peak is
        self._flatten([(name, p) for name, p in module.named_parameters() if p.requires_grad])  # tied: once
        self._make_buckets(bucket_capacity(bucket_cap_mb, self.params[0], bucket_elements=bucket_elements))
        # My segments, as the parameters the optimiser sees. Stages 1-2: views (no copy);
        # stage 3: their own storage, because the full buffer is freed between uses.
        self.pieces = [nn.Parameter(self.flat_param[b.start:b.stop].clone() if self.shard_params
                                    else self.flat_param[b.start:b.stop]) for b in self.buckets]
        self.optimizer = optimizer_fn([piece for piece in self.pieces if piece.numel()])
        self.flat_grad: torch.Tensor | None = None  # stage 1's full gradient buffer
        self.elements_reduce_scattered = 0
        self.elements_all_gathered = 0
        self._next = 0          # stage 2-3: the next bucket to reduce-scatter in this backward
        self._steps = 0         # optimiser steps taken (the first one checks the ring's lengths)
        self._in_backward = False
        if self.shard_grads:
            for i, p in enumerate(self.params):
                p.register_hook(lambda grad, i=i: self._gradient_arrives(i))
                p.register_post_accumulate_grad_hook(lambda p, i=i: self._gradient_complete(i))
        if self.shard_params:
            self._free_params()

    def _flatten(self, named: list[tuple[str, nn.Parameter]]) -> None:
        """Lay the parameters end to end in one flat buffer (each becomes a view into it)."""
        if not named:
            raise ValueError("the module has no trainable parameter: nothing to shard.")
        dtypes = {p.dtype for _, p in named}
        if len(dtypes) > 1:
            raise ValueError(f"ZeRO here keeps one flat buffer, so all trainable parameters need one dtype "
                             f"(found {sorted(map(str, dtypes))}).")
        self.params = [p for _, p in named]
        self.layout = [(name, tuple(p.shape)) for name, p in named]
        self.numel = sum(p.numel() for p in self.params)
        self.flat_param = torch.empty(self.numel, dtype=self.params[0].dtype)
        offset = 0
        self._views = []
        for p in self.params:
            n = p.numel()
            self.flat_param[offset:offset + n].copy_(p.data.reshape(-1))
            p.data = self.flat_param[offset:offset + n].view_as(p)
            self._views.append((offset, n))
            offset += n

    def _make_buckets(self, capacity: int | None) -> None:
        """Contiguous ranges of whole parameters, from the last parameter back (backward order)."""
        self.buckets: list[_Bucket] = []
        members: list[int] = []
        for i in reversed(range(len(self.params))):
            size = sum(self._views[j][1] for j in members)
            if members and capacity is not None and size + self._views[i][1] > capacity:
                self._close_bucket(members)
                members = []
            members.append(i)
        self._close_bucket(members)
        self._bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket.members}

    def _close_bucket(self, members: list[int]) -> None:
        lo = self._views[members[-1]][0]
        hi = self._views[members[0]][0] + self._views[members[0]][1]
        self.buckets.append(_Bucket(lo, hi, members, self.rank, self.world_size))

    @property
    def bucket_sizes(self) -> list[int]:
        return [b.hi - b.lo for b in self.buckets]

    # ---------------------------------------------------------------- parameters (stage 3)
    def _gather_params(self) -> None:
        storage = self.flat_param.untyped_storage()
        if storage.nbytes() == 0:
            storage.resize_(self.numel * self.flat_param.element_size())
            # write through .data: autograd must not see this as an in-place change of a saved tensor
            self._all_gather(self.flat_param.data)
            self.peak.note(self.held_tensors())  # the full parameters are here: stage 3's parameter peak

    def _all_gather(self, flat: torch.Tensor) -> None:
        """Put my (updated) segments in place, then gather everyone's, bucket by bucket, into ``flat``."""
        with self._span("comm", "all-gather params"):
            for bucket, piece in zip(self.buckets, self.pieces):
                mine = flat[bucket.start:bucket.stop]
                if mine.data_ptr() != piece.data.data_ptr():
                    mine.copy_(piece.data)
                self.comm.all_gather(mine, flat[bucket.lo:bucket.hi], group=self.group, **self._checks())
        self.elements_all_gathered += self.numel

    def _free_params(self) -> None:
        self.flat_param.untyped_storage().resize_(0)

    def _span(self, kind: str, name: str):
        if self.tracer is None:
            return nullcontext()
        return self.tracer.blocking(name) if kind == "comm" else self.tracer.span(kind, name)

    # ---------------------------------------------------------------- forward / backward
    def forward(self, *args, **kwargs):
        if self.shard_params:
            self._gather_params()
        if not self.shard_grads:  # stage 1: gradients accumulate into one full flat buffer (views per parameter)
            if self.flat_grad is None:
                self.flat_grad = torch.zeros(self.numel, dtype=self.flat_param.dtype)
            for p, (offset, n) in zip(self.params, self._views):
                _attach(p, self.flat_grad[offset:offset + n])
        output = self.module(*args, **kwargs)
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
            bucket.grad = torch.zeros(bucket.hi - bucket.lo, dtype=self.flat_param.dtype)
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
        bucket, piece = self.buckets[b], self.pieces[b]
        if bucket.grad is None:
            bucket.grad = torch.zeros(bucket.hi - bucket.lo, dtype=self.flat_param.dtype)
        with self._span("comm", f"reduce-scatter bucket {b}"):
            mine = self.comm.reduce_scatter(bucket.grad, group=self.group, **self._checks())
        self.elements_reduce_scattered += bucket.hi - bucket.lo
        piece.grad = mine.clone() if piece.grad is None else piece.grad.add_(mine)
        self.peak.note(self.held_tensors())  # the full bucket and my segment exist together: the moment to measure
        for j in bucket.members:
            self.params[j].grad = None
        bucket.grad = None
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
            with self._span("comm", "reduce-scatter grads"):
                for bucket, piece in zip(self.buckets, self.pieces):
                    # a view into the full gradient buffer, which stage 1 keeps
                    piece.grad = self.comm.reduce_scatter(self.flat_grad[bucket.lo:bucket.hi], group=self.group,
                                                          **self._checks())
                    piece.grad.div_(self.world_size)
            self.elements_reduce_scattered += self.numel
        with self._span("optimizer", "step"):
            self.optimizer.step()
        self.peak.note(self.held_tensors())  # the optimiser state exists from the first step on
        if self.shard_params:
            self._free_params()  # gathered again at the next forward
        else:
            self._all_gather(self.flat_param)
        self._steps += 1

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

    # ---------------------------------------------------------------- for the harness and the accounting
    def grad_shard(self) -> list[FlatShard]:
        """My segments of the averaged gradient (what my optimiser used), for :func:`coursekit.verify.compare`."""
        if any(piece.grad is None for piece in self.pieces):
            raise RuntimeError("no gradient segment yet: call step() first.")
        return [FlatShard(self.layout, b.start, piece.grad) for b, piece in zip(self.buckets, self.pieces)]

    def param_shard(self) -> list[FlatShard]:
        """My segments of the parameters, for :func:`coursekit.verify.compare` (frozen ones whole, once)."""
        frozen = {n: p.data for n, p in self.module.named_parameters() if not p.requires_grad}
        return [FlatShard(self.layout, b.start, piece.data, frozen if k == 0 else {})
                for k, (b, piece) in enumerate(zip(self.buckets, self.pieces))]

    def held_tensors(self) -> dict[str, list[torch.Tensor]]:
        """The tensors this rank holds, by kind: ``params``, ``grads``, ``optimizer``."""
        frozen = [p for p in self.module.parameters() if not p.requires_grad]
        grads = [self.flat_grad] if self.flat_grad is not None else []
        grads += [b.grad for b in self.buckets if b.grad is not None]
        grads += [piece.grad for piece in self.pieces if piece.grad is not None]
        return {"params": [self.flat_param, *self.pieces] + frozen,
                "grads": grads,
                "optimizer": optimizer_tensors(self.optimizer)}


def _attach(p: nn.Parameter, view: torch.Tensor) -> None:
    """Make ``p.grad`` a view into a flat buffer (copying a gradient autograd made elsewhere)."""
    view = view.view_as(p)
    if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
        view.copy_(p.grad)
    p.grad = view


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
    options = {"collectives": "ring", "bucket_cap_mb": DDP_BUCKET_CAP_MB, "bucket_elements": None}

    def __init__(self, setup: Setup):
        self.setup, self.tracer = setup, setup.tracer
        self.group = setup.group("dp")
        self.zero = ZeRO(setup.model, setup.optimizer_fn, stage=self.stage, group=self.group,
                         collectives=self.option("collectives"), tracer=setup.tracer,
                         bucket_cap_mb=self.option("bucket_cap_mb"), bucket_elements=self.option("bucket_elements"))
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
                "elements_all_gathered": self.zero.elements_all_gathered}


for _stage in (1, 2, 3):
    _options = dict(ZeroStrategy.options, bucket_cap_mb=DDP_BUCKET_CAP_MB if _stage == 1 else megabytes(55_000))
    register(f"zero{_stage}")(type(f"Zero{_stage}", (ZeroStrategy,), {"stage": _stage, "options": _options,
                                                                     "__doc__": f"ZeRO stage {_stage}."}))
