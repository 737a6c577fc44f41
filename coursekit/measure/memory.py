"""Memory per rank: what data parallelism and ZeRO hold, measured and by formula (P4's catch).

Plain data parallelism keeps a full copy of everything on every rank. With
Adam, for Ψ parameters (the ZeRO paper, Rajbhandari et al. 2020):

=================  ==========  =========  ===============  ======
precision          parameters  gradients  optimiser state  total
=================  ==========  =========  ===============  ======
fp32 (as run here)  4Ψ         4Ψ         8Ψ (m, v)         16Ψ
mixed (ZeRO paper)  2Ψ         2Ψ         12Ψ (fp32 copy,   16Ψ
                                          m, v)
=================  ==========  =========  ===============  ======

ZeRO divides by the number of data-parallel ranks N: stage 1 the optimiser
state, stage 2 also the gradients, stage 3 also the parameters.

:func:`held_bytes` *measures*: it adds up the storage actually allocated
behind a list of tensors (a view is free, a freed storage counts 0), so the
chapter can put measured bars next to :func:`formula_bytes`.

    >>> formula_bytes(1_000_000, world_size=4, stage=2)
    {'params': 4000000, 'grads': 1000000, 'optimizer': 2000000}
"""

from __future__ import annotations

import torch

from ..collectives import owned_segment, segment_bounds

__all__ = ["PRECISIONS", "held_bytes", "PeakMemory", "formula_bytes", "exact_share", "expected_held_bytes", "shard_elements",
           "peak_held_bytes", "mixed_peak_held_bytes", "unit_peak_held_bytes", "comm_elements", "max_parameters"]

# bytes per parameter: (parameters, gradients, optimiser state)
PRECISIONS = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}


def held_bytes(tensors: list[torch.Tensor], seen: set | None = None) -> int:
    """Bytes of storage actually allocated behind ``tensors``; storage shared by several counts once.

    A view costs nothing more than its base; a freed (resized-to-0) storage
    counts 0. Pass the same ``seen`` set across calls so that a storage is
    counted in one category only.

        >>> flat = torch.zeros(10)
        >>> held_bytes([flat, flat[:5], flat[5:]])
        40
    """
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.nbytes() == 0:
            continue
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


class PeakMemory:
    """The most bytes held at any moment it was shown, by kind and in total.

    Memory that matters is the *peak*: plain data parallelism holds every
    gradient at the end of backward and may free them after the step, so a
    snapshot after the step can flatter a strategy. Call :meth:`note` at every
    moment something is about to be freed (the end of backward, inside a hook
    just before a bucket is dropped, after the optimiser step); ``by_kind``
    keeps each kind's maximum, ``total`` the maximum of the sum at one moment.

        >>> peak = PeakMemory()
        >>> _ = peak.note({"grads": [torch.zeros(10)]}); _ = peak.note({"grads": []})
        >>> peak.by_kind, peak.total
        ({'grads': 40}, 40)
    """

    def __init__(self):
        self.by_kind: dict[str, int] = {}
        self.total = 0

    def note(self, held: dict[str, list[torch.Tensor]]) -> dict[str, int]:
        """Measure ``held`` now (each storage once, as :func:`held_bytes`), keep the maxima, return the bytes."""
        seen: set = set()
        now = {kind: held_bytes(tensors, seen) for kind, tensors in held.items()}
        for kind, nbytes in now.items():
            self.by_kind[kind] = max(self.by_kind.get(kind, 0), nbytes)
        self.total = max(self.total, sum(now.values()))
        return now


def _check(stage: int, world_size: int, precision) -> tuple[int, int, int]:
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0 (plain data parallelism), 1, 2 or 3 (got {stage!r}).")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1 (got {world_size}).")
    if isinstance(precision, tuple) and len(precision) == 3:
        return precision
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {sorted(PRECISIONS)}.")
    return PRECISIONS[precision]


def exact_share(total: float, parts: int) -> float:
    """``total / parts``: an int when it divides, else a float -- bytes stay exact wherever they can."""
    return total // parts if isinstance(total, int) and total % parts == 0 else total / parts


def formula_bytes(psi: float, world_size: int = 1, stage: int = 0, precision="fp32") -> dict[str, float]:
    """Bytes per rank for ``psi`` parameters: ``{"params", "grads", "optimizer"}`` (stage 0 = plain DP).

    The ZeRO paper's arithmetic, the one copy of it (the cost model's :func:`~coursekit.costmodel.
    model_state_bytes` calls it): ``precision`` is a name of :data:`PRECISIONS` or the bytes per parameter
    ``(parameters, gradients, optimiser state)``; stage s shards the last s of the three over ``world_size``.
    """
    p, g, k = _check(stage, world_size, precision)

    def share(bytes_per_param, sharded):
        total = bytes_per_param * psi
        return exact_share(total, world_size) if sharded else total

    return {"params": share(p, stage >= 3), "grads": share(g, stage >= 2), "optimizer": share(k, stage >= 1)}


def shard_elements(numel: int, world_size: int, rank: int, bucket_sizes: list[int] | None = None) -> list[int]:
    """How many elements of each bucket ``rank`` keeps under ZeRO: its ring segment of every bucket.

    ZeRO reduce-scatters bucket by bucket, so a rank's shard is one segment per
    bucket (one bucket of ``numel`` elements by default).

        >>> shard_elements(10, 4, 0), shard_elements(10, 4, 0, [6, 4])
        ([3], [2, 1])
    """
    sizes = [numel] if bucket_sizes is None else list(bucket_sizes)
    if sum(sizes) != numel:
        raise ValueError(f"bucket sizes {sizes} add up to {sum(sizes)}, not numel={numel}.")
    out = []
    for size in sizes:
        start, stop = segment_bounds(size, world_size)[owned_segment(rank, world_size)]
        out.append(stop - start)
    return out


def expected_held_bytes(numel: int, n_tensors: int, world_size: int, rank: int, stage: int,
                        bucket_sizes: list[int] | None = None) -> dict[str, int]:
    """Exactly what :func:`coursekit.train.train` should measure on ``rank`` right after a step with fp32 Adam.

    The formula's terms, with the real segment sizes (the ring's split: segments
    differ by at most one element; one segment per bucket, see
    :func:`shard_elements`) and the one thing the formula leaves out:
    ``torch.optim.Adam`` keeps a 4-byte ``step`` counter per parameter tensor
    (``n_tensors`` of them for plain DP; one per non-empty segment under ZeRO).
    """
    pieces = shard_elements(numel, world_size, rank, bucket_sizes)
    mine = sum(pieces)
    if stage == 0:
        return {"params": 4 * numel, "grads": 4 * numel, "optimizer": 8 * numel + 4 * n_tensors}
    return {"params": 4 * (mine if stage >= 3 else numel),
            "grads": 4 * (mine if stage >= 2 else numel),
            "optimizer": 8 * mine + 4 * sum(1 for n in pieces if n)}


def peak_held_bytes(numel: int, n_tensors: int, world_size: int, rank: int, stage: int,
                    bucket_sizes: list[int] | None = None) -> dict[str, int]:
    """Each kind's peak *during* a step on ``rank`` (fp32 Adam), as :class:`PeakMemory` measures it.

    * gradients: plain DP and ZeRO-1 hold all of them at the end of backward, 4Ψ. ZeRO-2 and -3
      reduce-scatter each bucket as backward completes it (buckets in backward order) and free it, so
      when bucket b is reduced a rank holds that bucket and its segments of buckets 0..b:
      4·max_b(size_b + Σ_{k≤b} seg_k) -- about 4(bucket + Ψ/N) instead of 4Ψ.
    * parameters: ZeRO-3 gathers the whole model while it computes, on top of its own segments,
      4(Ψ + Σ seg); the others hold 4Ψ throughout.
    * optimiser state: created in the first step and kept, so its peak is what is held after the step.

    (A model whose backward finishes a later bucket before an earlier one would hold two at once;
    the course models finish them in order.)
    """
    after = expected_held_bytes(numel, n_tensors, world_size, rank, stage, bucket_sizes)
    sizes = [numel] if bucket_sizes is None else list(bucket_sizes)
    segments = shard_elements(numel, world_size, rank, sizes)
    grads = 4 * numel if stage < 2 else 4 * max(size + sum(segments[:b + 1]) for b, size in enumerate(sizes))
    return {"params": 4 * (numel + sum(segments)) if stage == 3 else 4 * numel, "grads": grads,
            "optimizer": after["optimizer"]}


def mixed_peak_held_bytes(numel: int, world_size: int, rank: int, stage: int, bucket_sizes: list[int] | None = None,
                          reduce_bytes: int = 4) -> dict[str, int]:
    """Each kind's peak during a step of ZeRO ``stage`` (1-3) with bf16 compute and fp32 Adam on my segments.

    What ``train(..., "zeroN", precision="bf16")`` holds (:mod:`coursekit.parallel.data.precision`):

    * parameters: the bf16 copy the model computes with, 2Ψ (ZeRO-3 gathers all of it while it computes);
    * optimiser state, the ZeRO paper's K = 12 on my segments: the fp32 master, Adam's m and v, 12·Σseg,
      plus a 4-byte step counter per segment;
    * gradients: each bucket of bf16 gradients is cast to the reduce dtype (``reduce_bytes``: 4 for fp32, 2
      for bf16 -- then no copy) just before it is reduced, and my fp32 segment made from the result. ZeRO-1
      keeps its whole bf16 buffer and reduces bucket by bucket in the step: 2Ψ + max_b(c·size_b + 4·Σ_{k≤b}
      seg_k); ZeRO-2/3 hold one bucket at a time during backward: max_b((2 + c)·size_b + 4·Σ_{k≤b} seg_k),
      ``c`` = ``reduce_bytes`` when the cast copies, else 0.

    Against fp32's 4Ψ + 4Ψ + 8Ψ, mixed precision moves bytes from the replicated kinds (parameters and
    gradients: halved) to the sharded one (the master copy), so the larger N, the more it saves.
    """
    if stage not in (1, 2, 3):
        raise ValueError(f"mixed_peak_held_bytes is for ZeRO stages 1-3 (got stage={stage!r}).")
    sizes = [numel] if bucket_sizes is None else list(bucket_sizes)
    segments = shard_elements(numel, world_size, rank, sizes)
    cast = reduce_bytes if reduce_bytes != 2 else 0
    so_far = [4 * sum(segments[:b + 1]) for b in range(len(sizes))]
    if stage == 1:
        grads = 2 * numel + max(cast * size + mine for size, mine in zip(sizes, so_far))
    else:
        grads = max((2 + cast) * size + mine for size, mine in zip(sizes, so_far))
    return {"params": 2 * numel, "grads": grads,
            "optimizer": 12 * sum(segments) + 4 * sum(1 for n in segments if n)}


def unit_peak_held_bytes(unit_sizes: list[int], root: int, world_size: int, rank: int, precision: str = "fp32",
                         prefetch: bool = True) -> dict[str, int]:
    """Each kind's peak during a step of per-unit ZeRO-3 (``train(..., "zero3_units")``) on ``rank``, Adam.

    ``unit_sizes``: the units' elements in forward order; ``root``: the rest (0: none). ``precision``:
    ``"fp32"``, ``"bf16"`` (bf16 compute, fp32 reduce) or ``"bf16-reduce-bf16"``. With ``s_u`` my ring
    segment of unit ``u`` (the root one too), ``p`` the compute dtype's bytes and ``c`` those of a cast copy
    (4 for an fp32 reduce of bf16 gradients, else 0):

    * parameters: the root (gathered through forward and through backward) and at most two units at once
      with a prefetch (one without): ``p·(root + max(u_i + u_{i+1}))``, plus my segments ``4·Σs`` in fp32;
    * gradients: backward fills one unit's full gradient while the unit after it is reduce-scattered; before
      the next one starts, that one is waited for and only my segment of it stays. The peak is the largest
      of ``p·root + (p + c)·u_{j+1} + p·u_j + 4·Σ s`` (``s`` over the units already settled) and, when a
      unit's cast copy appears, ``p·root + (p + c)·u_j + 4·Σ s``; last the root's own reduce-scatter and
      then my segments' gradients alone, ``4·Σs``;
    * optimiser state: Adam's m and v (8·Σs), the fp32 master too with mixed precision (12·Σs), and a
      4-byte step counter per unit.
    """
    if precision not in ("fp32", "bf16", "bf16-reduce-bf16"):
        raise ValueError(f"precision={precision!r}: use 'fp32', 'bf16' or 'bf16-reduce-bf16'.")
    sizes = list(unit_sizes)

    def seg(numel: int) -> int:
        start, stop = segment_bounds(numel, world_size)[owned_segment(rank, world_size)]
        return stop - start

    p = 4 if precision == "fp32" else 2
    c = 4 if precision == "bf16" else 0
    mine = [seg(n) for n in sizes] + ([seg(root)] if root else [])
    pairs = [a + b for a, b in zip(sizes, sizes[1:])] if prefetch and len(sizes) > 1 else sizes
    params = p * (root + max(pairs, default=0)) + (4 * sum(mine) if p == 4 else 0)
    moments, settled, in_flight = [], 0, 0  # bytes of the settled segments' gradients, of the unit in flight
    for j in reversed(range(len(sizes))):  # backward order
        moments.append(p * root + in_flight + p * sizes[j] + settled)  # unit j allocated beside the one in flight
        settled += 4 * mine[j + 1] if in_flight else 0                  # that one settled...
        moments.append(p * root + (p + c) * sizes[j] + settled)         # ...and unit j cast for its reduce-scatter
        in_flight = (p + c) * sizes[j]
    settled += 4 * mine[0] if in_flight else 0
    moments += [(p + c) * root + settled, settled + 4 * mine[-1]]  # the root cast, then settled too
    return {"params": params, "grads": max(moments),
            "optimizer": (8 if p == 4 else 12) * sum(mine) + 4 * len(mine)}


def comm_elements(psi: int, world_size: int, stage: int = 0) -> int:
    """Elements sent per step, summed over all ranks, by a ring: 2(N−1)Ψ for DP and ZeRO-1/2, 3(N−1)Ψ for ZeRO-3.

    Per rank that is about 2Ψ (3Ψ) times (N−1)/N: the "2Ψ vs 3Ψ" of the ZeRO paper.
    """
    _check(stage, world_size, "fp32")
    return (3 if stage == 3 else 2) * (world_size - 1) * psi


def max_parameters(memory_bytes: float, world_size: int, stage: int, precision: str = "fp32") -> float:
    """The largest Ψ whose parameters, gradients and optimiser state fit in ``memory_bytes`` per rank.

    (Activations and buffers come on top; this is the model-state bound only.)

        >>> max_parameters(80e9, 1, 0, "mixed") / 1e9      # one 80 GB GPU, plain DP: 5 B parameters
        5.0
    """
    p, g, k = _check(stage, world_size, precision)
    per_param = (p / world_size if stage >= 3 else p) + (g / world_size if stage >= 2 else g) + \
                (k / world_size if stage >= 1 else k)
    return memory_bytes / per_param
