"""The roofline of this machine: how fast it can compute, how fast it can move bytes, and where each op sits.

Williams, Waterman and Patterson 2009 ("Roofline: an insightful visual performance model", CACM 52(4)): an op
that does ``F`` FLOPs while moving ``B`` bytes has *arithmetic intensity* ``I = F/B``, and cannot run faster
than ``attainable(I) = min(peak, I × bandwidth)``. Below the *ridge* ``peak/bandwidth`` it is memory-bound
(more FLOP/s needs fewer bytes per FLOP), above it compute-bound.

* :func:`measure_peak` -- square fp32 matmuls (``torch.mm``, ``2n³`` FLOPs a call; ``n`` = 2,048 is ~341
  FLOP/byte, far above any CPU's ridge), median of repeats after a warm-up, on ``threads`` threads;
* :func:`measure_bandwidth` -- a copy ``b.copy_(a)`` of two 1 GiB arrays (read ``a``, write ``b``: STREAM's
  "copy", counting ``2n`` words; the write-allocate read of ``b`` is not counted), far larger than this VM's
  caches (L2 4 MiB a core, L3 480 MiB): main memory, not a cache;
* :func:`intensity_of` -- FLOPs and bytes of the course's ops, by formula (below); :func:`measure_op` times
  them here, to place measured points beside the roof;
* :class:`Roofline` -- ``attainable``, ``ridge``, ``seconds``; :func:`network_roofline` -- the same for an
  all-reduce, whose "memory" is the link: chapter 01's network (:class:`coursekit.netsim.Network`).

======================  ===========================  =====================================================
op (``shapes``)         FLOPs                        bytes (``w`` = itemsize, 4 for fp32)
======================  ===========================  =====================================================
matmul (m, k, n)        ``2mkn``                     ``(mk + kn + mn)·w``: read A and B, write C once
layer_norm (rows, h)    ``8`` per element            ``(2·rows·h + 2h)·w``: read x, write y, γ and β
softmax (rows, n)       ``5`` per element            ``2·rows·n·w``: read x, write y
add (n,)                ``1`` per element            ``3n·w``: read two, write one
copy (n,)               0                            ``2n·w``
all_reduce (n, G)       ``(G−1)/G · n`` adds a rank  ``2(G−1)/G · n·w`` *sent* a rank (a ring), over the link
======================  ===========================  =====================================================

Layer norm's 8: the mean (an add), the variance (subtract, square, add), normalise (subtract, multiply by
``1/σ``), the affine (multiply, add); softmax's 5: the max, subtract, ``exp``, the sum, divide -- one FLOP
each, though ``exp`` and ``1/σ`` cost the hardware several. Bytes are the *least* an op must move (each
tensor once); a kernel that spills to memory moves more, so a measured point sits below its roof. An op
small enough to stay in a cache can sit *above* the DRAM roof (measured here: the course model's logits and a
2 MiB residual add, both inside a core's 4 MiB L2): the roof is a bound for data that comes from memory.

    >>> Roofline(peak=200e9, bandwidth=10e9).ridge                     # FLOP per byte
    20.0
    >>> round(intensity_of("matmul", (2048, 2048, 2048)).value, 1)      # 2n³ / (3n²·4)
    341.3
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from ..netsim import Network

__all__ = ["Intensity", "Roofline", "Probe", "MeasuredOp", "intensity_of", "network_roofline", "matmul_probe",
           "copy_probe", "op_probe", "time_probe", "measure_peak", "measure_bandwidth", "measure_op",
           "measure_roofline", "COURSE_OPS", "OPS"]

OPS = ("matmul", "layer_norm", "softmax", "add", "copy", "all_reduce")
PEAK_SIZE, QUICK_PEAK_SIZE = 2048, 256            # the matmul's n
COPY_MIB, QUICK_COPY_MIB = 1024, 16               # each of the copy's two arrays


@dataclass(frozen=True)
class Intensity:
    """An op's FLOPs and the bytes it must move; ``memory``: ``"dram"`` or ``"network"`` (what the bytes cross)."""

    op: str
    flops: float
    bytes: float
    memory: str = "dram"

    @property
    def value(self) -> float:
        """FLOP per byte."""
        return self.flops / self.bytes


def intensity_of(op: str, shapes: tuple[int, ...], itemsize: int = 4) -> Intensity:
    """FLOPs and bytes of ``op`` at ``shapes`` (the module's table).

        >>> intensity_of("all_reduce", (1_000_000, 4)).value           # 1/(2w): no compute to hide it behind
        0.125
    """
    w = itemsize
    if op == "matmul":
        m, k, n = shapes
        return Intensity(op, 2 * m * k * n, (m * k + k * n + m * n) * w)
    if op == "layer_norm":
        rows, h = shapes
        return Intensity(op, 8 * rows * h, (2 * rows * h + 2 * h) * w)
    if op == "softmax":
        rows, n = shapes
        return Intensity(op, 5 * rows * n, 2 * rows * n * w)
    if op in ("add", "copy"):
        (n,) = shapes
        return Intensity(op, n if op == "add" else 0, (3 if op == "add" else 2) * n * w)
    if op == "all_reduce":
        n, group = shapes
        share = (group - 1) / group
        return Intensity(op, share * n, 2 * share * n * w, memory="network")
    raise ValueError(f"unknown op {op!r}: one of {OPS}.")


@dataclass(frozen=True)
class Roofline:
    """``peak`` FLOP/s and ``bandwidth`` bytes/s (of memory, or of a network link)."""

    peak: float
    bandwidth: float
    name: str = "this machine"

    @property
    def ridge(self) -> float:
        """The intensity (FLOP/byte) where the two roofs meet: ``peak / bandwidth``."""
        return self.peak / self.bandwidth

    def attainable(self, intensity: float | Intensity) -> float:
        """``min(peak, intensity × bandwidth)`` FLOP/s."""
        value = intensity.value if isinstance(intensity, Intensity) else intensity
        return min(self.peak, value * self.bandwidth)

    def bound(self, intensity: float | Intensity) -> str:
        value = intensity.value if isinstance(intensity, Intensity) else intensity
        return "memory" if value < self.ridge else "compute"

    def seconds(self, op: Intensity) -> float:
        """The least time ``op`` can take here: ``max(flops/peak, bytes/bandwidth)``."""
        return max(op.flops / self.peak, op.bytes / self.bandwidth)


def network_roofline(peak: float, network: Network, link: str = "net") -> Roofline:
    """The roofline of a collective: the GPU's ``peak`` beside the link's bandwidth (``"net"`` between nodes,
    ``"intra"`` inside one). Chapter 01's α-β model without the α: a ring all-reduce of ``n`` elements takes
    ``2(G−1)/G · n·w / bandwidth`` (:func:`coursekit.netsim.closed_form_time` with ``latency = 0``), so its
    ``seconds`` here are the same, and its attainable FLOP/s ``bandwidth/(2w)``: the adds never set the pace."""
    bandwidth, _ = network.level(link)
    return Roofline(peak, bandwidth, name=f"network ({link})")


# ----------------------------------------------------------------------------------------------- measuring
@dataclass(frozen=True)
class Probe:
    """One call to time (``run``), with the FLOPs and bytes it does."""

    run: Callable[[], object]
    flops: float
    bytes: float


@dataclass(frozen=True)
class MeasuredOp:
    """An op timed here: its :class:`Intensity` and the median seconds of a call."""

    intensity: Intensity
    seconds: float

    @property
    def flops_per_second(self) -> float:
        return self.intensity.flops / self.seconds

    @property
    def bytes_per_second(self) -> float:
        return self.intensity.bytes / self.seconds


@contextlib.contextmanager
def _threads(threads: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def matmul_probe(size: int = PEAK_SIZE) -> Probe:
    """``torch.mm`` of two ``size × size`` fp32 matrices into a third: ``2·size³`` FLOPs a call."""
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator) for _ in range(2))
    out = torch.empty(size, size)
    shape = intensity_of("matmul", (size, size, size))
    return Probe(lambda: torch.mm(a, b, out=out), shape.flops, shape.bytes)


def copy_probe(numel: int) -> Probe:
    """``b.copy_(a)`` of ``numel`` fp32 elements: ``8·numel`` bytes a call, no FLOPs."""
    a, b = torch.ones(numel), torch.empty(numel)
    return Probe(lambda: b.copy_(a), 0, intensity_of("copy", (numel,)).bytes)


def op_probe(op: str, shapes: tuple[int, ...]) -> Probe:
    """A call of one of the course's ops at ``shapes`` (fp32), with its :func:`intensity_of`."""
    shape = intensity_of(op, shapes)
    if op == "all_reduce":
        raise ValueError("an all-reduce needs ranks: time it with coursekit.netsim.calibrate (chapter 01) and "
                         "place it on network_roofline.")
    generator = torch.Generator().manual_seed(0)
    if op == "matmul":
        m, k, n = shapes
        a, b, out = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator), torch.empty(m, n)
        run = lambda: torch.mm(a, b, out=out)  # noqa: E731
    elif op in ("layer_norm", "softmax"):
        x = torch.randn(*shapes, generator=generator)
        weight, bias = torch.ones(shapes[-1]), torch.zeros(shapes[-1])
        run = (lambda: F.layer_norm(x, shapes[-1:], weight, bias)) if op == "layer_norm" else \
            (lambda: torch.softmax(x, dim=-1))
    else:
        return copy_probe(shapes[0]) if op == "copy" else _add_probe(shapes[0])
    return Probe(run, shape.flops, shape.bytes)


def _add_probe(numel: int) -> Probe:
    a, b, out = torch.ones(numel), torch.ones(numel), torch.empty(numel)
    shape = intensity_of("add", (numel,))
    return Probe(lambda: torch.add(a, b, out=out), shape.flops, shape.bytes)


def time_probe(probe: Probe, repeats: int = 5, warmup: int = 1) -> float:
    """The median seconds of ``repeats`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        probe.run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        probe.run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_peak(threads: int = 1, quick: bool = False, size: int | None = None, repeats: int = 5) -> float:
    """Matmul FLOP/s on ``threads`` threads: the compute roof (about 0.5 s at n = 2,048 on one thread here;
    ``quick``: n = 256, milliseconds, for CI -- an underestimate, small matmuls do not fill the pipeline)."""
    size = size or (QUICK_PEAK_SIZE if quick else PEAK_SIZE)
    with _threads(threads):
        probe = matmul_probe(size)
        return probe.flops / time_probe(probe, repeats)


def measure_bandwidth(threads: int = 1, quick: bool = False, mib: int | None = None, repeats: int = 3) -> float:
    """Copy bandwidth in bytes/s on ``threads`` threads: the memory roof. Two arrays of ``mib`` MiB (default
    1,024: 2 GiB in all, 4× this VM's L3, ~2 s); ``quick``: 16 MiB, which the L3 holds -- a cache's
    bandwidth, for CI only."""
    mib = mib or (QUICK_COPY_MIB if quick else COPY_MIB)
    with _threads(threads):
        probe = copy_probe(mib * 2**20 // 4)
        return probe.bytes / time_probe(probe, repeats)


def measure_roofline(threads: int = 1, quick: bool = False) -> Roofline:
    return Roofline(measure_peak(threads, quick), measure_bandwidth(threads, quick),
                    name=f"this machine, {threads} thread{'s' if threads > 1 else ''}")


def measure_op(op: str, shapes: tuple[int, ...], threads: int = 1, repeats: int = 5) -> MeasuredOp:
    """Time one of the course's ops here (fp32, ``threads`` threads): a point to place beside the roof."""
    with _threads(threads):
        probe = op_probe(op, shapes)
        return MeasuredOp(intensity_of(op, shapes), time_probe(probe, repeats))


# The course's shapes: the course transformer (8 sequences of 64 tokens, h = 64, 4 heads, v = 16) and the wide
# MLP of coursekit.experiments.tensor_versus_model (1,024 -> 4,096 -> 1,024 on 512 rows).
COURSE_OPS = (
    ("qkv projection", "matmul", (512, 64, 192)),
    ("MLP up", "matmul", (512, 64, 256)),
    ("attention scores, one head", "matmul", (64, 16, 64)),
    ("head (logits)", "matmul", (512, 64, 16)),
    ("layer norm", "layer_norm", (512, 64)),
    ("attention softmax", "softmax", (8 * 4 * 64, 64)),
    ("wide MLP up", "matmul", (512, 1024, 4096)),
    ("wide MLP down", "matmul", (512, 4096, 1024)),
    ("residual add", "add", (512 * 1024,)),
)
