"""How big a bucket is: the one rule every bucketed strategy of the course follows.

Gradients travel in *buckets*: parameters grouped, in backward order, into flat buffers of about
``bucket_cap_mb`` **megabytes** (2**20 bytes) of gradient each, as ``DistributedDataParallel``
means it; a parameter is never split, and a larger one gets a bucket of its own. ``None`` is one
bucket for everything. ``bucket_elements``, an exact element count, overrides ``bucket_cap_mb``
(tests and small examples count elements). :func:`bucket_capacity` is that rule; the bucketed
all-reduce (:class:`~coursekit.parallel.data.DataParallel`) and ZeRO
(:class:`~coursekit.parallel.data.ZeRO`) both cut their buckets with it.

Defaults. The wrappers, ``DataParallel`` and ``ZeRO``, and ``"torch_ddp"`` default to DDP's 25 MB
(:data:`DDP_BUCKET_CAP_MB`). The course's models are about 0.4 MB, one such bucket, so the strategies
of :func:`coursekit.train.train` whose story *is* their buckets default to sizes picked for these
models, written as the megabytes of so many float32 elements (:func:`megabytes`), which keeps the
element counts the chapters' timelines, traffic and memory figures were measured with:

* ``"bucketed"`` and ``"sharded_optimizer"``: ``megabytes(25_000)``, six buckets of the course
  transformer (the MLP is one), so that the all-reduce overlaps backward (chapter 02's timeline);
* ``"zero2"`` and ``"zero3"``: ``megabytes(55_000)``, two buckets of the course transformer, so that a
  rank frees half its gradients before backward ends (:class:`~coursekit.parallel.data.zero_strategy.ZeroStrategy`);
* ``"zero1"`` and ``"torch_ddp"``: DDP's 25, one bucket for the whole model; ``"zero1"`` with 16-bit
  gradients and an fp32 reduce takes ``megabytes(25_000)``, so that it casts one bucket at a time.

    >>> megabytes(25_000), bucket_capacity(megabytes(25_000), torch.zeros(1))
    (0.095367431640625, 25000)
"""

from __future__ import annotations

import torch

__all__ = ["DDP_BUCKET_CAP_MB", "megabytes", "bucket_capacity"]

#: ``torch.nn.parallel.DistributedDataParallel``'s bucket size, in megabytes (2**20 bytes).
DDP_BUCKET_CAP_MB = 25.0


def megabytes(elements: int, dtype: torch.dtype = torch.float32) -> float:
    """``elements`` of ``dtype`` in DDP's megabytes (2**20 bytes), exactly: ``megabytes(25_000) == 0.095367431640625``.

    The strategies' bucket defaults are written this way, so that they keep their element counts for the
    course's float32 models while meaning megabytes, as everywhere else.
    """
    return elements * torch.empty((), dtype=dtype).element_size() / 2**20


def bucket_capacity(bucket_cap_mb: float | None, like: torch.Tensor, *, bucket_elements: int | None = None
                    ) -> int | None:
    """How many elements of ``like``'s dtype one bucket holds: the one bucket rule of the course.

    ``bucket_cap_mb`` megabytes (2**20 bytes) of gradient, as ``DistributedDataParallel(bucket_cap_mb=)``
    counts them (at least one element); ``None``: no limit, one bucket for everything. ``bucket_elements``,
    when given, is the capacity itself and overrides ``bucket_cap_mb``. Every bucketed strategy cuts its
    buckets with this; a parameter is never split across two.

        >>> bucket_capacity(megabytes(25_000), torch.zeros(1)), bucket_capacity(None, torch.zeros(1))
        (25000, None)
    """
    if bucket_elements is not None:
        if bucket_elements < 1:
            raise ValueError(f"bucket_elements must be a positive number of elements (got {bucket_elements}).")
        return bucket_elements
    if bucket_cap_mb is None:
        return None
    if bucket_cap_mb <= 0:
        raise ValueError(f"bucket_cap_mb must be a positive number of megabytes or None (got {bucket_cap_mb}).")
    return max(1, int(bucket_cap_mb * 2**20) // like.element_size())

