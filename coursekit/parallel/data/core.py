"""Data parallelism: every rank a full replica, gradients averaged (seed claims P4, R2).

Every rank holds the same model and takes its own slice of the global batch;
its gradients differ from the others' (R2), so before the optimiser step they
are averaged. Then every rank takes the same step from the same weights and
the replicas stay identical -- the same training as one process on the whole
batch. This module builds that up in three steps:

1. :func:`broadcast_parameters` -- every rank starts from the same weights.
2. :func:`average_gradients` -- naive: after backward, all-reduce every
   gradient and divide by the number of ranks. Communication starts only when
   the whole backward pass is over.
3. :class:`DataParallel` -- bucketed: hooks fire as each gradient is ready;
   a full bucket is all-reduced *asynchronously* while backward goes on;
   :meth:`DataParallel.finish_gradient_synchronization` waits before the
   optimiser step. :meth:`DataParallel.no_sync` skips communication on the
   micro-batches of gradient accumulation.

ZeRO, which shards what these replicate, is in :mod:`coursekit.parallel.data.zero`;
the training loop that runs any of them is :func:`coursekit.train.train`
(strategies ``"naive"`` and ``"bucketed"`` are registered in :mod:`~coursekit.parallel.data.replicated`, which
also draws the buckets' all-reduces on the timeline and counts them).

Every function takes ``group=``: the data-parallel process group, or a mesh
axis (``group=mesh["dp"]``, :mod:`coursekit.comm.mesh`); None means all ranks.
Which collective does the work is switchable (:data:`coursekit.collectives.RING`,
chapter 01's ring, every element counted; or ``TORCH``, gloo/NCCL's own). The
bucketed version always uses torch's ``async_op=True`` all-reduce, because
overlap needs a collective that runs on another thread while this one computes.
Buckets are sized by the course's one rule, :mod:`coursekit.parallel.data.buckets` (``bucket_cap_mb``
megabytes of gradient per bucket, as DDP means it).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn

from ... import collectives as _collectives
from ... import comm
from ...comm.mesh import as_group, rank_size
from .buckets import DDP_BUCKET_CAP_MB, bucket_capacity

__all__ = ["broadcast_parameters", "average_gradients", "all_reduce_flat", "shard_batch", "DataParallel"]


# --------------------------------------------------------------------------
# 1. Same start everywhere.
# --------------------------------------------------------------------------
def broadcast_parameters(module: nn.Module, src: int | None = None, group=None, *,
                         group_src: int | None = None) -> nn.Module:
    """Copy one rank's parameters and buffers to every rank of ``group`` (frozen ones too), in place.

    As ``torch.distributed.broadcast``: ``src`` is a *global* rank, ``group_src``
    a rank within ``group``; with neither, the group's first rank (rank 0 of
    the world when ``group`` is None). Without it, ranks that initialised
    differently would train different models.
    """
    group = as_group(group)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        where = {"group_src": 0 if group_src is None else group_src} if src is None else {"src": src}
        with torch.no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor.data, group=group, **where)
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
    all_reduce = all_reduce or _collectives.ring_all_reduce
    group = as_group(group)
    _, size = rank_size(group)
    for param in module.parameters():
        if param.grad is not None:
            all_reduce(param.grad, group=group)
            param.grad.div_(size)
    return module


def all_reduce_flat(grads: list[torch.Tensor], group=None, all_reduce: Callable | None = None,
                    divide_by: int = 1) -> None:
    """Sum ``grads`` over ``group`` in one call instead of one per tensor, then divide by ``divide_by``: flatten into
    one buffer, all-reduce it, copy each piece back (a single bucket, after backward). Nothing moves on one rank."""
    grads = [g for g in grads if g is not None]
    if rank_size(as_group(group))[1] == 1 or not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    (all_reduce or _collectives.ring_all_reduce)(flat, group=group)
    for g, summed in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(summed.view_as(g) / divide_by if divide_by != 1 else summed.view_as(g))


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
    ``bucket_cap_mb`` megabytes (as ``DistributedDataParallel`` names it); each
    bucket is one flat buffer and every ``param.grad`` is a view into it, so
    backward writes the gradients straight into the buffer. When the last
    gradient of a bucket is ready (a ``post_accumulate_grad`` hook), the
    bucket's all-reduce is *started* (``async_op=True``: gloo runs it on its own
    threads) while autograd computes the earlier layers' gradients. A callback
    queued on autograd's engine runs when backward ends, as DDP's does: it
    starts the buckets no hook completed (unused parameters), waits for all of
    them and divides by the world size. So when ``loss.backward()`` returns the
    gradients *are* the average -- never a silent sum still in flight.

        >>> model = DataParallel(tiny_transformer(seed=0), bucket_cap_mb=0.1)
        >>> loss_fn(model(x), y).backward()   # all-reduces start during backward, end with it
        >>> optimizer.step()

    :meth:`finish_gradient_synchronization` is that end-of-backward step made
    explicit (chapter 02 calls it to show the wait); after backward it has
    nothing left to do. Gradient accumulation: ``with model.no_sync():
    loss.backward()`` for every micro-batch but the last; their gradients add
    up locally and only the last backward communicates.

    Args:
        module: the model (its parameters are broadcast from rank 0 here).
        bucket_cap_mb: megabytes (2**20 bytes) of gradient per bucket, DDP's default 25. A parameter
            is never split; a larger one gets a bucket of its own. ``None``: one bucket for everything
            (the rule of every bucket in the course: :mod:`coursekit.parallel.data.buckets`).
        group: the data-parallel process group, or a mesh axis (``mesh["dp"]``).
        overlap: ``False`` starts every bucket only when backward has ended
            (the same buckets, waiting for the end of backward: the baseline overlap is measured against).
        bucket_elements: the bucket size as a number of elements instead (overrides ``bucket_cap_mb``).
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float | None = DDP_BUCKET_CAP_MB, group=None,
                 overlap: bool = True, *, bucket_elements: int | None = None):
        super().__init__()
        self.overlap = overlap
        group = as_group(group)
        self.module = broadcast_parameters(module, group=group)
        self.group = group
        self.world_size = rank_size(group)[1]
        self.require_sync = True
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the module has no trainable parameter: nothing to synchronise.")
        self.buckets = _make_buckets(params, bucket_capacity(bucket_cap_mb, params[0], bucket_elements=bucket_elements))
        self._where = {id(p): (b, i) for b, bucket in enumerate(self.buckets) for i, p in enumerate(bucket.params)}
        self._pending = False  # gradients of this backward not yet averaged
        # The hooks live on the parameters (held from C++, where the garbage collector cannot see them), so they
        # hold this wrapper weakly: dropped, it is freed -- its buffers, its hooks and its group with it -- as
        # DDP's reducer is, instead of living to the interpreter's exit and hooking the module's backward forever.
        self._hooks = [p.register_post_accumulate_grad_hook(_weak_hook(self)) for p in params]
        weakref.finalize(self, _remove_hooks, list(self._hooks))
        # Gradients live in the bucket buffers (as DDP's gradient_as_bucket_view): no copy, no extra memory.
        self.zero_grad(set_to_none=False)

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
        if not self.require_sync:
            return
        if not self._pending:  # the first gradient of this backward: average them all when it ends
            self._pending = True
            torch.autograd.Variable._execution_engine.queue_callback(self.finish_gradient_synchronization)
        if not self.overlap:
            return
        b, i = self._where[id(param)]
        bucket = self.buckets[b]
        bucket.ready.add(i)
        if len(bucket.ready) == len(bucket.params):
            self.launch(b)

    def _attach(self, bucket: _Bucket, i: int, p: nn.Parameter) -> None:
        """Make ``p.grad`` a view into the bucket's buffer (copying a gradient made elsewhere)."""
        view = bucket.buffer[bucket.offsets[i]:bucket.offsets[i] + p.numel()].view_as(p)
        if p.grad is None:
            view.zero_()
        elif p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad)
        p.grad = view

    def launch(self, b: int) -> None:
        """Start bucket ``b``'s all-reduce (``async_op=True``: gloo runs it on its own threads) and go on."""
        bucket = self.buckets[b]
        for i, p in enumerate(bucket.params):  # usually a no-op: the gradients already live in the buffer
            self._attach(bucket, i, p)
        bucket.work = comm.all_reduce(bucket.buffer, group=self.group, async_op=True)  # None on one rank
        bucket.ready = set(range(len(bucket.params)))  # launched

    def wait(self, bucket: _Bucket) -> None:
        """Block until ``bucket``'s all-reduce is done."""
        if bucket.work is not None:
            bucket.work.wait()

    def waiting(self):
        """Around launching the buckets no hook completed and waiting for all: from here the rank only waits."""
        return nullcontext()

    def finish_gradient_synchronization(self) -> None:
        """Start the buckets no hook completed, wait for every all-reduce, divide by the world size.

        Runs by itself at the end of every backward that communicates; calling it
        again does nothing until the next backward or ``zero_grad``. Called after
        ``no_sync`` backward passes, it averages what they accumulated.
        """
        if self._synchronized and not self._pending:
            return  # this backward's gradients are averaged already: never divide twice
        with self.waiting():  # backward's compute is over: from here on this rank only waits
            for b, bucket in enumerate(self.buckets):
                if len(bucket.ready) < len(bucket.params):
                    self.launch(b)
            for bucket in self.buckets:
                self.wait(bucket)
        for bucket in self.buckets:
            bucket.buffer.div_(self.world_size)
            bucket.ready, bucket.work = set(), None
        self._pending, self._synchronized = False, True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients, as ``nn.Module.zero_grad``: ``set_to_none=True`` sets every ``.grad`` to
        None (the buckets stay allocated, as DDP's do); ``False`` zeroes the buffers in place and keeps
        every gradient a view into them (no copy at the next backward)."""
        self._synchronized = False
        for bucket in self.buckets:
            if set_to_none:
                for p in bucket.params:
                    p.grad = None
            else:
                bucket.buffer.zero_()
                for i, p in enumerate(bucket.params):
                    self._attach(bucket, i, p)


def _weak_hook(wrapper: "DataParallel") -> Callable[[nn.Parameter], None]:
    """A post-accumulate-grad hook that calls ``wrapper._grad_ready`` while the wrapper lives, and nothing after."""
    ref = weakref.ref(wrapper)

    def hook(param: nn.Parameter) -> None:
        live = ref()
        if live is not None:
            live._grad_ready(param)

    return hook


def _remove_hooks(handles: list) -> None:
    for handle in handles:
        handle.remove()


def _make_buckets(params: list[nn.Parameter], capacity: int | None) -> list[_Bucket]:
    """Group the parameters, in backward order (the reverse of their order in the module), into buckets."""
    buckets: list[_Bucket] = []
    current: list[nn.Parameter] = []
    for p in reversed(params):
        if current and capacity is not None and sum(q.numel() for q in current) + p.numel() > capacity:
            buckets.append(_Bucket(current))
            current = []
        current.append(p)
    buckets.append(_Bucket(current))
    return buckets
