"""Data parallelism, from gradient averaging to ZeRO sharding (seed claims P4, R2).

Every rank holds the same model and takes its own slice of the global batch;
its gradients differ from the others' (R2), so before the optimiser step they
are averaged. Then every rank takes the same step from the same weights and
the replicas stay identical -- the same training as one process on the whole
batch. This module builds that up in five steps:

1. :func:`broadcast_parameters` -- every rank starts from rank 0's weights.
2. :func:`average_gradients` -- naive: after backward, all-reduce every
   gradient and divide by the number of ranks. Communication starts only when
   the whole backward pass is over.
3. :class:`DataParallel` -- bucketed: hooks fire as each gradient is ready;
   a full bucket is all-reduced *asynchronously* while backward goes on;
   :meth:`DataParallel.finish_gradient_synchronization` waits before the
   optimiser step. :meth:`DataParallel.no_sync` skips communication on the
   micro-batches of gradient accumulation.
4. :class:`ZeRO` stages 1–3 -- the catch of P4 ("every GPU holds a full copy")
   answered: shard the optimiser state (1), then the gradients (2, a
   reduce-scatter instead of an all-reduce), then the parameters (3,
   all-gathered before use and freed after), over the data-parallel ranks.
   Built on chapter 01's ring reduce-scatter and all-gather.
5. :func:`train` -- one training loop that runs any of them and records what
   the equivalence harness (:mod:`coursekit.verify`), the timelines
   (:mod:`coursekit.trace`) and the memory accounting need.

    >>> import coursekit
    >>> from coursekit.parallel.data import train
    >>> def run(rank, world_size):
    ...     return train(rank, world_size, strategy="zero2", steps=3)["records"]
    >>> per_rank = coursekit.launch(run, 2)                       # doctest: +SKIP

Which collective does the work is switchable: ``collectives="ring"`` (chapter
01's ring, every element counted by :func:`coursekit.comm.record`) or
``"torch"`` (gloo/NCCL's own). The bucketed version always uses torch's
``async_op=True`` all-reduce, because overlap needs a collective that runs on
another thread while this one computes.
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator, NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import collectives as _ring
from ..memory import held_bytes
from ..trace import Tracer
from ..verify import FlatShard, record_step

__all__ = ["Collectives", "RING", "TORCH", "get_collectives", "broadcast_parameters", "average_gradients",
           "shard_batch", "DataParallel", "ZeRO", "train", "STRATEGIES"]


# --------------------------------------------------------------------------
# Which collectives: chapter 01's ring, or torch.distributed's.
# --------------------------------------------------------------------------
def _torch_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    dist.all_reduce(tensor, group=group)
    return tensor


def _torch_reduce_scatter(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Same contract as the ring's: returns this rank's owned segment (a view), fully summed."""
    flat = tensor.view(-1)
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    dist.all_reduce(flat, group=group)  # gloo has no uneven reduce-scatter; correct, but moves 2x the data
    start, stop = _ring.segment_bounds(flat.numel(), size)[_ring.owned_segment(rank, size)]
    return flat[start:stop]


def _torch_all_gather(segment: torch.Tensor, out: torch.Tensor, group=None) -> torch.Tensor:
    flat = out.view(-1)
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    start, stop = _ring.segment_bounds(flat.numel(), size)[_ring.owned_segment(rank, size)]
    piece = segment.reshape(-1).clone()
    flat.zero_()
    flat[start:stop].copy_(piece)
    dist.all_reduce(flat, group=group)  # zeros elsewhere: the sum is an exact copy
    return out


class Collectives(NamedTuple):
    """The three collectives data parallelism needs, with the ring's contracts (sum, owned segments)."""

    name: str
    all_reduce: Callable[..., torch.Tensor]
    reduce_scatter: Callable[..., torch.Tensor]
    all_gather: Callable[..., torch.Tensor]


RING = Collectives("ring", _ring.ring_all_reduce, _ring.ring_reduce_scatter, _ring.ring_all_gather)
TORCH = Collectives("torch", _torch_all_reduce, _torch_reduce_scatter, _torch_all_gather)


def get_collectives(which: str | Collectives) -> Collectives:
    """``"ring"`` (chapter 01, counted by ``comm.record``), ``"torch"``, or a :class:`Collectives`."""
    if isinstance(which, Collectives):
        return which
    if which == "ring":
        return RING
    if which == "torch":
        return TORCH
    raise ValueError(f"collectives={which!r}: use 'ring' (chapter 01's, counted) or 'torch' (gloo/NCCL's).")


def _world(group) -> tuple[int, int]:
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


# --------------------------------------------------------------------------
# 1. Same start everywhere.
# --------------------------------------------------------------------------
def broadcast_parameters(module: nn.Module, src: int = 0, group=None) -> nn.Module:
    """Copy rank ``src``'s parameters and buffers to every rank (frozen ones too), in place.

    Without it, ranks that initialised differently would train different models.
    """
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        with torch.no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor.data, src=src, group=group)
    return module


def shard_batch(inputs: torch.Tensor, targets: torch.Tensor, rank: int, world_size: int
                ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """This rank's slice of a global batch, and the weight that keeps the averaged loss exact.

    The batch is split like ``torch.tensor_split`` (the first ``B % N`` ranks get
    one sample more). A rank's mean loss times ``weight = N · b_rank / B``,
    averaged over ranks, is exactly the mean loss of the global batch, so the
    averaged gradient is the single-process gradient even when ``B`` is not
    divisible by ``N``.

    Raises ``ValueError`` if some rank would get no sample at all.

        >>> x, y, w = shard_batch(torch.arange(10), torch.arange(10), rank=3, world_size=4)
        >>> x.tolist(), w
        ([8, 9], 0.8)
    """
    total = inputs.shape[0]
    if total < world_size:
        raise ValueError(f"a global batch of {total} samples cannot feed {world_size} ranks (some would get none); "
                         f"use a global batch of at least {world_size}, or fewer ranks.")
    local_inputs = inputs.tensor_split(world_size)[rank]
    local_targets = targets.tensor_split(world_size)[rank]
    return local_inputs, local_targets, world_size * local_inputs.shape[0] / total


# --------------------------------------------------------------------------
# 2. Naive: average every gradient after backward.
# --------------------------------------------------------------------------
def average_gradients(module: nn.Module, group=None, all_reduce: Callable | None = None) -> nn.Module:
    """All-reduce every parameter's gradient and divide by the number of ranks, one tensor at a time.

    Call it after ``loss.backward()`` and before ``optimizer.step()``. Frozen
    parameters (no ``.grad``) are skipped; a tied weight is one parameter, so it
    is averaged once. ``all_reduce`` defaults to chapter 01's ring.

        >>> loss.backward()
        >>> average_gradients(model)
        >>> optimizer.step()
    """
    all_reduce = all_reduce or _ring.ring_all_reduce
    _, size = _world(group)
    for param in module.parameters():
        if param.grad is not None:
            all_reduce(param.grad, group=group)
            param.grad.div_(size)
    return module


# --------------------------------------------------------------------------
# 3. Bucketed, overlapped with backward.
# --------------------------------------------------------------------------
class _Bucket:
    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.offsets, total = [], 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        self.buffer = torch.zeros(total, dtype=params[0].dtype, device=params[0].device)
        self.ready: set[int] = set()
        self.work = None


class DataParallel(nn.Module):
    """Bucketed gradient all-reduce started from backward hooks, so it overlaps the backward pass.

    Gradients become ready in roughly reverse order of the forward pass. The
    parameters are grouped, in that order, into buckets of about
    ``bucket_size`` elements; each bucket is one flat buffer and every
    ``param.grad`` is a view into it, so backward writes the gradients straight
    into the buffer. When the last gradient of a bucket is ready (a
    ``post_accumulate_grad`` hook), the bucket's all-reduce is *started*
    (``async_op=True``: gloo runs it on its own threads) while autograd
    computes the earlier layers' gradients. Use ``model.zero_grad()`` (in
    place) rather than ``optimizer.zero_grad()``, which would drop the views
    (that still works, at the cost of one copy per gradient).

        >>> model = DataParallel(tiny_transformer(seed=0), bucket_size=25_000)
        >>> loss_fn(model(x), y).backward()          # all-reduces start during backward
        >>> model.finish_gradient_synchronization()  # wait, average, copy back
        >>> optimizer.step()

    Gradient accumulation: ``with model.no_sync(): loss.backward()`` for every
    micro-batch but the last; their gradients add up locally and only the last
    backward communicates.

    Args:
        module: the model (its parameters are broadcast from rank 0 here).
        bucket_size: elements per bucket (a parameter is never split; a larger
            one gets a bucket of its own). ``None``: one bucket for everything.
        group: the data-parallel process group.
        tracer: optional :class:`coursekit.trace.Tracer`; all-reduces are recorded as ``comm`` spans.
        overlap: ``False`` starts every bucket only in ``finish_gradient_synchronization``
            (the same buckets, waiting for the end of backward: the baseline overlap is measured against).
    """

    def __init__(self, module: nn.Module, bucket_size: int | None = 25_000, group=None, tracer: Tracer | None = None,
                 overlap: bool = True):
        super().__init__()
        self.overlap = overlap
        if bucket_size is not None and bucket_size < 1:
            raise ValueError(f"bucket_size must be a positive number of elements or None (got {bucket_size}).")
        self.module = broadcast_parameters(module, group=group)
        self.group, self.tracer = group, tracer
        self.world_size = _world(group)[1]
        self.require_sync = True
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the module has no trainable parameter: nothing to synchronise.")
        self.buckets: list[_Bucket] = []
        current: list[nn.Parameter] = []
        for p in reversed(params):  # backward order
            if current and bucket_size is not None and sum(q.numel() for q in current) + p.numel() > bucket_size:
                self.buckets.append(_Bucket(current))
                current = []
            current.append(p)
        self.buckets.append(_Bucket(current))
        self._where = {id(p): (b, i) for b, bucket in enumerate(self.buckets) for i, p in enumerate(bucket.params)}
        self.elements_reduced = 0  # elements all-reduced so far (for exact counting in tests)
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params]
        # Gradients live in the bucket buffers (as DDP's gradient_as_bucket_view): no copy, no extra memory.
        self.zero_grad()

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally, without communicating."""
        previous, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = previous

    def _grad_ready(self, param: nn.Parameter) -> None:
        if not self.require_sync or not self.overlap:
            return
        b, i = self._where[id(param)]
        bucket = self.buckets[b]
        bucket.ready.add(i)
        if len(bucket.ready) == len(bucket.params):
            self._launch(b)

    def _attach(self, bucket: _Bucket, i: int, p: nn.Parameter) -> None:
        """Make ``p.grad`` a view into the bucket's buffer (copying a gradient made elsewhere)."""
        view = bucket.buffer[bucket.offsets[i]:bucket.offsets[i] + p.numel()].view_as(p)
        if p.grad is None:
            view.zero_()
        elif p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad)
        p.grad = view

    def _launch(self, b: int) -> None:
        bucket = self.buckets[b]
        for i, p in enumerate(bucket.params):  # usually a no-op: the gradients already live in the buffer
            self._attach(bucket, i, p)
        if self.world_size > 1:
            bucket.work = dist.all_reduce(bucket.buffer, group=self.group, async_op=True)
            if self.tracer is not None:
                self.tracer.comm(bucket.work, f"bucket {b}")
        else:
            bucket.work = None
        self.elements_reduced += bucket.buffer.numel()
        bucket.ready = set(range(len(bucket.params)))  # launched

    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket's all-reduce and divide by the world size (the gradients are views).

        Buckets that never filled (a parameter unused in this forward pass) are launched now.
        """
        for b, bucket in enumerate(self.buckets):
            if len(bucket.ready) < len(bucket.params):
                self._launch(b)
        waiting = self.tracer.span("idle", "wait for all-reduce") if self.tracer else nullcontext()
        with waiting:
            for bucket in self.buckets:
                if bucket.work is not None:
                    bucket.work.wait()
        for bucket in self.buckets:
            bucket.buffer.div_(self.world_size)
            bucket.ready, bucket.work = set(), None

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero the gradient buffers in place (the gradients stay views into them)."""
        for bucket in self.buckets:
            bucket.buffer.zero_()
            for i, p in enumerate(bucket.params):
                self._attach(bucket, i, p)


# --------------------------------------------------------------------------
# 4. ZeRO stages 1, 2, 3.
# --------------------------------------------------------------------------
class ZeRO(nn.Module):
    """ZeRO data parallelism: optimiser state (stage 1), gradients (2) and parameters (3) sharded over the ranks.

    The trainable parameters are laid end to end in one flat buffer (each
    parameter becomes a view into it) and the buffer is cut into ``N`` segments
    as chapter 01's ring cuts it: rank ``r`` *owns* segment
    ``owned_segment(r, N)``. Each rank keeps the optimiser state of its segment
    only and updates only its segment.

    One step:

    * stage 1 and 2: forward, backward (gradients accumulate into a flat
      gradient buffer), **reduce-scatter** (each rank gets the summed gradient
      of its segment), optimiser step on the segment, **all-gather** the updated
      segments into every rank's full parameters. 2Ψ elements per rank, as
      plain data parallelism (an all-reduce *is* a reduce-scatter plus an
      all-gather). Stage 1 keeps the full gradient buffer between steps;
      stage 2 frees it after the reduce-scatter and keeps only its segment.
    * stage 3: between steps a rank holds only its segment of the parameters.
      **all-gather** before the forward pass, free after it; all-gather again
      when the backward pass reaches the model (a hook on the output), then
      reduce-scatter, step, free. 3Ψ elements per rank.

        >>> model = ZeRO(tiny_transformer(seed=0), lambda params: torch.optim.Adam(params, lr=1e-3), stage=2)
        >>> loss_fn(model(x), y).backward()
        >>> model.step()        # reduce-scatter, optimiser step on my segment, all-gather
        >>> model.zero_grad()

    Backward passes between two ``step()`` calls accumulate (no communication
    until ``step``), which is gradient accumulation without ``no_sync``.
    After ``step()`` only my segment of the gradient is the average; the
    reduce-scatter leaves partial sums in the rest of stage 1's buffer
    (scratch, zeroed by ``zero_grad``).

    Only element-wise optimisers are exact here (SGD, momentum, Adam, AdamW):
    each rank sees only its segment. (Gradient clipping by global norm would
    need one more all-reduce of the squared norms.)

    Simplification (said honestly): the whole model is one unit. Stage 3 here
    gathers *all* parameters for the forward pass, so its *peak* is a full
    copy; real ZeRO-3/FSDP gathers one layer at a time. Between steps the
    held bytes are what the formulas say, and that is what is measured.
    """

    def __init__(self, module: nn.Module, optimizer_fn: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 stage: int = 1, group=None, collectives: str | Collectives = "ring", tracer: Tracer | None = None):
        super().__init__()
        if stage not in (1, 2, 3):
            raise ValueError(f"ZeRO stage must be 1 (optimiser state), 2 (+ gradients) or 3 (+ parameters); "
                             f"got {stage!r}.")
        self.module = broadcast_parameters(module, group=group)
        self.stage, self.group, self.tracer = stage, group, tracer
        self.comm = get_collectives(collectives)
        self.rank, self.world_size = _world(group)
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]  # tied: first name only
        if not named:
            raise ValueError("the module has no trainable parameter: nothing to shard.")
        dtypes = {p.dtype for _, p in named}
        if len(dtypes) > 1:
            raise ValueError(f"ZeRO here keeps one flat buffer, so all trainable parameters need one dtype "
                             f"(found {sorted(map(str, dtypes))}).")
        self.params = [p for _, p in named]
        self.layout = [(name, tuple(p.shape)) for name, p in named]
        self.numel = sum(p.numel() for p in self.params)
        bounds = _ring.segment_bounds(self.numel, self.world_size)
        self.start, self.stop = bounds[_ring.owned_segment(self.rank, self.world_size)]

        # One flat buffer; every parameter becomes a view into it.
        self.flat_param = torch.empty(self.numel, dtype=self.params[0].dtype)
        offset = 0
        self._views = []
        for p in self.params:
            n = p.numel()
            self.flat_param[offset:offset + n].copy_(p.data.reshape(-1))
            p.data = self.flat_param[offset:offset + n].view_as(p)
            self._views.append((offset, n))
            offset += n
        # My segment, as the parameter the optimiser sees. Stages 1-2: a view (no copy);
        # stage 3: its own storage, because the full buffer is freed between uses.
        segment = self.flat_param[self.start:self.stop]
        self.shard = nn.Parameter(segment.clone() if stage == 3 else segment)
        self.optimizer = optimizer_fn([self.shard])
        self.flat_grad: torch.Tensor | None = None
        self.elements_reduce_scattered = 0
        self.elements_all_gathered = 0
        if stage == 3:
            self._free_params()

    # ---------------------------------------------------------------- parameters (stage 3)
    def _gather_params(self) -> None:
        storage = self.flat_param.untyped_storage()
        if storage.nbytes() == 0:
            storage.resize_(self.numel * self.flat_param.element_size())
            # write through .data: autograd must not see this as an in-place change of a saved tensor
            self._all_gather(self.flat_param.data)
            self.elements_all_gathered += self.numel

    def _all_gather(self, flat: torch.Tensor) -> None:
        """Put my (updated) segment in place, then gather everyone's into ``flat``."""
        mine = flat[self.start:self.stop]
        if mine.data_ptr() != self.shard.data.data_ptr():
            mine.copy_(self.shard.data)
        with self._span("comm", "all-gather params"):
            self.comm.all_gather(mine, flat, group=self.group)

    def _free_params(self) -> None:
        self.flat_param.untyped_storage().resize_(0)

    def _span(self, kind: str, name: str):
        if self.tracer is None:
            return nullcontext()
        return self.tracer.blocking(name) if kind == "comm" else self.tracer.span(kind, name)

    # ---------------------------------------------------------------- forward / backward
    def forward(self, *args, **kwargs):
        if self.stage == 3:
            self._gather_params()
        if self.flat_grad is None:  # gradients accumulate into one flat buffer (views per parameter)
            self.flat_grad = torch.zeros(self.numel, dtype=self.flat_param.dtype)
        for p, (offset, n) in zip(self.params, self._views):
            view = self.flat_grad[offset:offset + n].view_as(p)
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
        output = self.module(*args, **kwargs)
        if self.stage == 3:
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

    # ---------------------------------------------------------------- the step
    @torch.no_grad()
    def step(self) -> None:
        """Reduce-scatter the gradients, step the optimiser on my segment, all-gather (stages 1-2) or free (3)."""
        if self.flat_grad is None:
            raise RuntimeError("ZeRO.step() before any backward pass: call model(inputs), loss.backward() first.")
        with self._span("comm", "reduce-scatter grads"):
            mine = self.comm.reduce_scatter(self.flat_grad, group=self.group)
        self.elements_reduce_scattered += self.numel
        mine.div_(self.world_size)
        if self.stage == 1:
            self.shard.grad = mine  # a view into the full gradient buffer, which stage 1 keeps
        else:
            self.shard.grad = mine.clone()  # keep my segment only ...
            for p in self.params:
                p.grad = None
            self.flat_grad = None  # ... and free the full gradient buffer
        with self._span("optimizer", "step"):
            self.optimizer.step()
        if self.stage == 3:
            self._free_params()
        else:
            self._all_gather(self.flat_param)
            self.elements_all_gathered += self.numel

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients (stage 1 zeroes its buffer in place; stages 2-3 drop their segment)."""
        if self.flat_grad is not None:
            self.flat_grad.zero_()
        if self.stage == 1:
            if self.shard.grad is not None:
                self.shard.grad = None
        else:
            self.shard.grad = None

    # ---------------------------------------------------------------- for the harness and the accounting
    def grad_shard(self) -> FlatShard:
        """My segment of the averaged gradient (what my optimiser used), for :func:`coursekit.verify.compare`."""
        if self.shard.grad is None:
            raise RuntimeError("no gradient segment yet: call step() first.")
        return FlatShard(self.layout, self.start, self.shard.grad)

    def param_shard(self) -> FlatShard:
        """My segment of the parameters, for :func:`coursekit.verify.compare`."""
        frozen = {n: p.data for n, p in self.module.named_parameters() if not p.requires_grad}
        return FlatShard(self.layout, self.start, self.shard.data, frozen)

    def held_tensors(self) -> dict[str, list[torch.Tensor]]:
        """The tensors this rank holds, by kind: ``params``, ``grads``, ``optimizer``."""
        frozen = [p for p in self.module.parameters() if not p.requires_grad]
        grads = [g for g in (self.flat_grad, self.shard.grad) if g is not None]
        return {"params": [self.flat_param, self.shard] + frozen,
                "grads": grads,
                "optimizer": _optimizer_tensors(self.optimizer)}


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


# --------------------------------------------------------------------------
# 5. One training loop for every variant.
# --------------------------------------------------------------------------
STRATEGIES = ("single", "naive", "bucketed", "zero1", "zero2", "zero3")


def _make_model(model: str | Callable[[], nn.Module], seed: int):
    from .. import models

    if callable(model):
        return model(), None
    if model == "mlp":
        return models.tiny_mlp(seed=seed), models.TeacherData(seed=seed)
    if model == "transformer":
        return models.tiny_transformer(seed=seed), models.LanguageData(seed=seed)
    raise ValueError(f"model={model!r}: use 'mlp', 'transformer', or a function returning a module.")


def _make_optimizer_fn(optimizer: str, lr: float):
    if optimizer == "adam":
        return lambda params: torch.optim.Adam(params, lr=lr)
    if optimizer == "sgd":
        return lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9)
    raise ValueError(f"optimizer={optimizer!r}: use 'adam' or 'sgd' (with momentum 0.9).")


def train(rank: int, world_size: int, strategy: str = "naive", model: str | Callable[[], nn.Module] = "mlp",
          data=None, steps: int = 3, global_batch: int = 16, micro_batches: int = 1, optimizer: str = "adam",
          lr: float = 1e-3, seed: int = 0, collectives: str | Collectives = "ring", bucket_size: int | None = 25_000,
          group=None, record: bool = True, trace: bool = False, freeze: tuple[str, ...] = (),
          count_traffic: bool = False, overlap: bool = True) -> dict:
    """Train for ``steps`` steps with one data-parallel ``strategy`` and return what happened on this rank.

    Run it on every rank (``coursekit.launch(lambda r, n: train(r, n, "zero2"), 4)``) or, with
    ``strategy="single"``, as the single-process reference (rank 0 of 1).

    Args:
        strategy: ``"single"``, ``"naive"``, ``"bucketed"``, ``"zero1"``, ``"zero2"`` or ``"zero3"``.
        model: ``"mlp"``, ``"transformer"`` or a zero-argument function returning a module (then pass ``data``).
        data: an object with ``batch(step, batch_size) -> (inputs, targets)``; default: the model's.
        global_batch: samples per optimiser step over all ranks (need not divide by ``world_size``).
        micro_batches: gradient accumulation: each rank splits its slice into this many micro-batches
            and communicates once per step.
        freeze: names of parameters to freeze (``requires_grad=False``) before training.
        count_traffic: record chapter 01's traffic counter around the steps (``result["traffic"]``).
        overlap: for ``"bucketed"``: ``False`` waits for the end of backward before communicating.

    Returns a dict with ``records`` (one :func:`coursekit.verify.record_step` per step),
    ``losses``, ``spans`` (if ``trace``; every rank's, on the shared clock), ``memory`` (bytes
    held after the last step, by kind), ``step_times`` and ``traffic``.
    """
    import time

    from .. import comm
    from ..models import loss_fn

    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: use one of {STRATEGIES}.")
    if strategy == "single" and world_size != 1:
        raise ValueError("strategy='single' is the one-process reference: run it with world_size=1.")
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be at least 1 (got {micro_batches}).")
    net, default_data = _make_model(model, seed)
    data = data or default_data
    if data is None:
        raise ValueError("pass data= (an object with batch(step, batch_size)) when model is a function.")
    for name, p in net.named_parameters():
        if name in freeze:
            p.requires_grad_(False)
    tracer = Tracer(rank) if trace else None
    optimizer_fn = _make_optimizer_fn(optimizer, lr)
    zero = None
    if strategy.startswith("zero"):
        zero = wrapped = ZeRO(net, optimizer_fn, stage=int(strategy[-1]), group=group, collectives=collectives,
                              tracer=tracer)
        opt = zero.optimizer
    elif strategy == "bucketed":
        wrapped = DataParallel(net, bucket_size=bucket_size, group=group, tracer=tracer, overlap=overlap)
        opt = optimizer_fn([p for p in net.parameters() if p.requires_grad])
    else:
        wrapped = broadcast_parameters(net, group=group) if strategy == "naive" else net
        opt = optimizer_fn([p for p in net.parameters() if p.requires_grad])
    all_reduce = get_collectives(collectives).all_reduce
    if tracer is not None:
        tracer.start(group)
    records, losses, step_times, memory = [], [], [], {}
    recording = comm.record() if count_traffic else nullcontext(None)
    with recording as traffic:
        for step in range(steps):
            begin = time.perf_counter()
            inputs, targets = data.batch(step, global_batch)
            local_x, local_y, weight = shard_batch(inputs, targets, rank, world_size)
            micro = list(zip(local_x.tensor_split(micro_batches), local_y.tensor_split(micro_batches)))
            if any(m[0].shape[0] == 0 for m in micro):
                raise ValueError(f"rank {rank} has {local_x.shape[0]} samples, fewer than micro_batches="
                                 f"{micro_batches}; use a larger global batch or fewer micro-batches.")
            outputs, local_loss = [], 0.0
            for i, (x, y) in enumerate(micro):
                last = i == len(micro) - 1
                sync = wrapped.no_sync() if (strategy == "bucketed" and not last) else nullcontext()
                with tracer.span("forward", f"micro {i}") if tracer else nullcontext():
                    out = wrapped(x)
                    loss = loss_fn(out, y) * weight * x.shape[0] / local_x.shape[0]
                with sync, tracer.span("backward", f"micro {i}") if tracer else nullcontext():
                    loss.backward()
                outputs.append(out.detach())
                local_loss += loss.item()
            if strategy == "naive":
                with tracer.blocking("all-reduce grads") if tracer else nullcontext():
                    average_gradients(net, group=group, all_reduce=all_reduce)
            elif strategy == "bucketed":
                wrapped.finish_gradient_synchronization()
            if record and zero is None:
                grads = {n: p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None}
            if zero is not None:
                zero.step()
            else:
                with tracer.span("optimizer", "step") if tracer else nullcontext():
                    opt.step()
            # the global batch's loss, for logging (torch's all-reduce: not part of the counted traffic)
            global_loss = torch.tensor([local_loss / world_size], dtype=torch.float64)
            if world_size > 1:
                dist.all_reduce(global_loss, group=group)
            losses.append(global_loss.item())
            if record:
                if zero is not None:
                    records.append(record_step(torch.cat(outputs), global_loss.item(), zero.grad_shard(),
                                               zero.param_shard()))
                else:
                    records.append(record_step(torch.cat(outputs), global_loss.item(), grads, net))
            step_times.append(time.perf_counter() - begin)
            # bytes held right after the step: parameters, gradients, optimiser state
            if zero is not None:
                held = zero.held_tensors()
            else:
                held = {"params": list(net.parameters()),
                        "grads": [p.grad for p in net.parameters() if p.grad is not None],
                        "optimizer": _optimizer_tensors(opt)}
            seen: set = set()
            memory = {kind: held_bytes(tensors, seen) for kind, tensors in held.items()}
            if zero is not None or strategy == "bucketed":
                wrapped.zero_grad()
            else:
                opt.zero_grad(set_to_none=True)
    spans = tracer.gather(group) if tracer is not None else None
    return {"records": records, "losses": losses, "spans": spans, "memory": memory, "step_times": step_times,
            "traffic": traffic, "numel": sum(p.numel() for p in net.parameters() if p.requires_grad),
            "elements_reduced": getattr(wrapped, "elements_reduced", None)}
