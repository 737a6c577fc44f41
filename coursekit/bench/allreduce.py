"""Benchmark chapter 01's all-reduces against ``torch.distributed.all_reduce`` (gloo here).

    python -m coursekit.bench allreduce [--world-sizes 2 4] [--min-kib 4] [--max-mib 64] [--check]

For each world size and message size (float32, powers of 4 from 4 KiB to
64 MiB): the median time of torch's own all-reduce, of a *plain* ring (bare
``dist.isend``/``dist.irecv``: no length check, no counting, no waiting notes
-- what the algorithm costs in Python at all), of coursekit's ring with its
length check off (``check_lengths=False``: what the check costs) and on (the
target), of master and naive; nccl-tests' algbw and busbw and the
ratios to torch. The algorithms take turns **within every iteration** (a
barrier before each), so a change in the machine's load hits all of them
alike; one iteration's time is the slowest rank's (an all-reduce is done when
every rank is).

The fixed cost per call: the time at the smallest size minus one α, the
one-way latency of one message of that size between two ranks (half a
ping-pong, measured in the same launch). Then the cost of the counting layer
at 1 MiB: recording on vs off, and its Python cost when off, measured on a
transport that moves nothing. Then the network model's calibration (chapter
01): at 2 ranks (the one world size where each rank has a core here) α and B
are fitted to the ring's measured times by :func:`coursekit.netsim.calibrate`
leaving out one size at a time, and the model's time for the size left out is
compared with the measurement. Targets: coursekit's ring no slower than torch
at every size >= 1 MiB on every world size measured; within 1.05x of the plain
ring there (the paired median); counting off < 5%; the
model within ±30% of the measured 2-rank ring at every size >= 1 MiB. Each
ring-versus-torch line also gives the median of the per-iteration ratios and a
bootstrap 95% interval for it (:func:`paired_ratio`): an interval that
contains 1.00 says the two are tied within this machine's noise.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from .. import comm
from ..collectives import master_all_reduce, naive_all_reduce, ring_all_reduce
from ..launch import launch
from ..netsim import calibrate, collective_time, fit_alpha_beta

ALGORITHMS = ["torch", "plain", "unchecked", "ring", "master", "naive"]
PLAIN_RING_LIMIT = 1.05  # coursekit's ring (length check, counting, notes) against a bare isend/irecv ring


def algbw(nbytes: float, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth: message bytes / time (bytes per second)."""
    return nbytes / seconds


def busbw(nbytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth for all-reduce: algbw · 2(n−1)/n, comparable across world sizes."""
    return algbw(nbytes, seconds) * 2 * (world_size - 1) / world_size


_plain_scratch = torch.empty(0)


def plain_ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """The ring with nothing around it: bare ``dist.isend``/``dist.irecv``, no check, no counting, no notes.

    The baseline that says what the algorithm itself costs from Python (its one receive buffer is kept
    between calls, so that large calls do not page-fault).
    """
    import torch.distributed as dist

    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    segments = tensor.view(-1).tensor_split(size)
    if _plain_scratch.numel() < segments[0].numel() or _plain_scratch.dtype != tensor.dtype:
        _plain_scratch.set_(torch.empty(segments[0].numel(), dtype=tensor.dtype))
    into = _plain_scratch[:segments[0].numel()]
    for step in range(size - 1):  # reduce-scatter
        k = (rank - step - 1) % size
        receiving = dist.irecv(into[:segments[k].numel()], left)
        sending = dist.isend(segments[(rank - step) % size], right)
        receiving.wait()
        segments[k].add_(into[:segments[k].numel()])
        sending.wait()
    for step in range(size - 1):  # all-gather
        receiving = dist.irecv(segments[(rank - step) % size], left)
        sending = dist.isend(segments[(rank + 1 - step) % size], right)
        receiving.wait()
        sending.wait()
    return tensor


def _function(name: str):
    if name == "torch":
        import torch.distributed as dist

        return lambda t: dist.all_reduce(t)
    if name == "unchecked":  # coursekit's ring with its length check off: what the check costs
        return lambda t: ring_all_reduce(t, check_lengths=False)
    return {"plain": plain_ring_all_reduce, "ring": ring_all_reduce, "master": master_all_reduce,
            "naive": naive_all_reduce}[name]


def _repeats_for(nbytes: int, repeats: int) -> int:
    return max(3, repeats if nbytes <= 1 << 20 else repeats // (1 + nbytes // (4 << 20)))


def _ping_pong(rank: int, x: torch.Tensor) -> None:
    """Ranks 0 and 1 pass ``x`` there and back (the others wait at the next barrier)."""
    import torch.distributed as dist

    if rank == 0:
        dist.send(x, 1)
        dist.recv(x, 1)
    elif rank == 1:
        dist.recv(x, 0)
        dist.send(x, 0)


def _time_rank(rank: int, world_size: int, sizes: list[int], algorithms: list[str], repeats: int,
               record: bool = False, ping: bool = False) -> dict:
    import torch.distributed as dist

    times: dict = {}
    functions = {name: _function(name) for name in algorithms}
    if ping:
        functions["ping-pong"] = lambda t: _ping_pong(rank, t)
    for nbytes in sizes:
        x = torch.zeros(nbytes // 4)  # zeros stay zeros: no overflow however often it is summed
        n = _repeats_for(nbytes, repeats)
        for fn in functions.values():
            for _ in range(2):
                fn(x)  # warm-up: connections, buffers
        samples: dict[str, list[float]] = {name: [] for name in functions}
        for _ in range(n):
            for name, fn in functions.items():  # every algorithm once per iteration: the same load for all
                dist.barrier()
                start = time.perf_counter()
                if record:
                    with comm.record():
                        fn(x)
                else:
                    fn(x)
                samples[name].append(time.perf_counter() - start)
        for name in functions:
            times[(name, nbytes)] = samples[name]
    return times


def measure(world_size: int, sizes: list[int], algorithms: list[str] = ALGORITHMS, repeats: int = 20,
            record: bool = False, timeout: float = 600.0, ping: bool = False) -> list[dict]:
    """Median seconds per (algorithm, size) on ``world_size`` real ranks; each iteration = slowest rank.

    Returns rows ``{"algorithm", "bytes", "world_size", "seconds", "algbw", "busbw"}``; with
    ``ping=True`` also ``"ping-pong"`` rows (ranks 0 and 1 there and back: twice one α).
    """
    per_rank = launch(_time_rank, world_size, sizes, algorithms, repeats, record, ping, timeout=timeout)
    rows = []
    for (name, nbytes), _ in per_rank[0].items():
        slowest = [max(samples) for samples in zip(*(r[(name, nbytes)] for r in per_rank))]
        seconds = statistics.median(slowest)
        rows.append({"algorithm": name, "bytes": nbytes, "world_size": world_size, "seconds": seconds,
                     "algbw": algbw(nbytes, seconds), "busbw": busbw(nbytes, seconds, world_size),
                     "samples": slowest})
    return rows


def paired_ratio(numerator: list[float], denominator: list[float], resamples: int = 2000,
                 seed: int = 0) -> tuple[float, float, float]:
    """``(median, low, high)`` of the per-iteration ratios ``numerator[i] / denominator[i]``, with a
    bootstrap 95% interval for that median.

    Why paired: the algorithms take turns within every iteration, so iteration ``i`` of both saw the same
    machine. On this VM the load drifts by ±10-20% between runs and within one; a ratio of two
    medians carries all of that, the median of same-iteration ratios much less, and the interval says
    whether "slower" is a measurement or noise (an interval containing 1.00 is a tie).

        >>> paired_ratio([4.0, 1.0, 2.0], [1.0, 2.0, 4.0])[0]      # iteration by iteration: 4, 0.5, 0.5
        0.5
    """
    import numpy as np

    if len(numerator) != len(denominator) or not numerator:
        raise ValueError(f"paired_ratio needs two equally long, non-empty lists of per-iteration times "
                         f"(got {len(numerator)} and {len(denominator)}).")
    ratios = np.asarray(numerator, dtype=float) / np.asarray(denominator, dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(ratios), size=(resamples, len(ratios)))
    low, high = np.percentile(np.median(ratios[picks], axis=1), [2.5, 97.5])
    return float(np.median(ratios)), float(low), float(high)


# ----------------------------------------------------------------- the counting layer's own cost
class _FreeWork:
    def wait(self):
        return True

    @staticmethod
    def is_completed():
        return False  # the worst case: every wait writes its "waiting on" note


class _FreeTransport:
    """Pretends to be rank 0 of ``size`` and moves nothing: what is left is Python overhead."""

    name = "free"

    def __init__(self, size: int):
        self.size, self.work = size, _FreeWork()

    def rank(self, group):
        return 0

    def world_size(self, group):
        return self.size

    @staticmethod
    def global_rank(group, rank):
        return rank

    def send(self, tensor, dst, group):
        pass

    def recv(self, tensor, src, group):
        if tensor.dtype == torch.int64 and tensor.numel() == 2:  # the length check: echo a matching one
            tensor.copy_(self.signature)

    def isend(self, tensor, dst, group):
        return self.work

    def irecv(self, tensor, src, group):
        self.recv(tensor, src, group)
        return self.work


class _NoLabel:
    __slots__ = ()

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _overhead_rank(rank: int, world_size: int, numel: int, size: int, iterations: int) -> dict:
    """Python seconds per ring_all_reduce with free communication: as is, and with labels/waits stubbed."""
    x = torch.zeros(numel)
    transport = _FreeTransport(size)
    transport.signature = torch.tensor([numel, 0], dtype=torch.int64)
    out = {}
    with comm.using(transport):
        for label in ("as is", "stubbed", "as is", "stubbed"):
            originals = (comm.phase, comm.blocked)
            if label == "stubbed":
                comm.phase = comm.blocked = _NoLabel
            try:
                start = time.perf_counter()
                for _ in range(iterations):
                    ring_all_reduce(x)
                out.setdefault(label, []).append((time.perf_counter() - start) / iterations)
            finally:
                comm.phase, comm.blocked = originals
    return {k: min(v) for k, v in out.items()}


def instrumentation_overhead(world_size: int = 4, nbytes: int = 1 << 20, iterations: int = 300) -> dict:
    """Seconds of Python the counting layer (phase labels, waiting notes, record checks) adds per call, off."""
    result = launch(_overhead_rank, 1, nbytes // 4, world_size, iterations)[0]
    return {"python_per_call": result["as is"], "labels_and_waits": max(0.0, result["as is"] - result["stubbed"])}


def _human(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def ring_vs_torch_targets(rows: list[dict], world_sizes: tuple[int, ...] = (4,)) -> list[tuple[str, str, bool]]:
    """The target "ring no slower than torch at >= 1 MiB", one ``(target, measured, met)`` per world size and size."""
    targets = []
    for world_size in world_sizes:
        seconds = {(r["algorithm"], r["bytes"]): r["seconds"] for r in rows if r["world_size"] == world_size}
        sizes = sorted(nbytes for name, nbytes in seconds if name == "ring" and nbytes >= 1 << 20)
        samples = {(r["algorithm"], r["bytes"]): r.get("samples") for r in rows if r["world_size"] == world_size}
        for nbytes in sizes:
            measured = f"ring / torch = {seconds[('ring', nbytes)] / seconds[('torch', nbytes)]:.2f}"
            if samples[("ring", nbytes)] and samples[("torch", nbytes)]:
                median, low, high = paired_ratio(samples[("ring", nbytes)], samples[("torch", nbytes)])
                measured += f" (paired {median:.2f}, 95% CI {low:.2f}–{high:.2f})"
            targets.append((f"ring ≤ torch at {_human(nbytes)}, {world_size} ranks", measured,
                            seconds[("ring", nbytes)] <= seconds[("torch", nbytes)]))
    return targets


def ring_vs_plain_targets(rows: list[dict], world_sizes: tuple[int, ...] = (2, 4),
                          limit: float = PLAIN_RING_LIMIT) -> list[tuple[str, str, bool]]:
    """The target "coursekit's ring within ``limit`` of the plain ring at >= 1 MiB": what its safety (lengths agreed
    before any payload moves) and its counting cost on top of the bare algorithm. Judged on the median of the
    per-iteration ratios (the two take turns in every iteration), reported with its 95% interval."""
    targets = []
    for world_size in world_sizes:
        samples = {(r["algorithm"], r["bytes"]): r.get("samples") for r in rows if r["world_size"] == world_size}
        for nbytes in sorted(n for name, n in samples if name == "ring" and n >= 1 << 20):
            ring, plain = samples[("ring", nbytes)], samples.get(("plain", nbytes))
            if not ring or not plain:
                continue
            median, low, high = paired_ratio(ring, plain)
            targets.append((f"ring ≤ {limit}× the plain ring at {_human(nbytes)}, {world_size} ranks",
                            f"paired ring / plain = {median:.2f}, 95% CI {low:.2f}–{high:.2f}", median <= limit))
    return targets


def _size_table(world_size: int, sizes: list[int], repeats: int) -> list[dict]:
    """Measure every algorithm at every size on ``world_size`` ranks; print the table, the fixed cost, the fit."""
    rows = measure(world_size, sizes, repeats=repeats, ping=True)
    table = {(r["algorithm"], r["bytes"]): r for r in rows}
    print(f"\n### {world_size} ranks (gloo, float32; median ms, slowest rank per iteration, algorithms "
          f"interleaved)\n")
    print("| size | torch | plain ring | ring, check off | ring | master | naive | plain / torch "
          "| check off / torch | ring / torch | master / torch | naive / torch | ring algbw GB/s "
          "| ring busbw GB/s | torch busbw GB/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for nbytes in sizes:
        t = {name: table[(name, nbytes)]["seconds"] for name in ALGORITHMS}
        print(f"| {_human(nbytes)} | " + " | ".join(f"{t[n] * 1e3:.3g}" for n in ALGORITHMS) + " | "
              + " | ".join(f"{t[n] / t['torch']:.2f}" for n in ("plain", "unchecked", "ring", "master", "naive"))
              + " | "
              + f"{table[('ring', nbytes)]['algbw'] / 1e9:.2f} | {table[('ring', nbytes)]['busbw'] / 1e9:.2f} | "
              + f"{table[('torch', nbytes)]['busbw'] / 1e9:.2f} |")
    smallest = sizes[0]
    alpha = table[("ping-pong", smallest)]["seconds"] / 2
    print(f"\nFixed cost per call (time at {_human(smallest)} minus one α = {alpha * 1e6:.0f} µs, half a "
          f"{_human(smallest)} ping-pong): " + ", ".join(
              f"{n} {(table[(n, smallest)]['seconds'] - alpha) * 1e6:.0f} µs" for n in ("torch", "plain", "unchecked", "ring")))
    fits = fit_alpha_beta(rows)
    print("\nα–β fit (time = α + β·bytes): " + "; ".join(
        f"{n}: α = {a * 1e6:.0f} µs, 1/β = {1 / b / 1e9 if b else float('inf'):.2f} GB/s"
        for n, (a, b) in sorted(fits.items())))
    return rows


def calibration_targets(rows: list[dict], world_size: int = 2, tolerance: float = 0.30
                        ) -> list[tuple[str, str, bool]]:
    """The network model fitted to the measured ring (all sizes but one), against the size left out (>= 1 MiB)."""

    ring = sorted((r["bytes"], r["seconds"]) for r in rows if r["algorithm"] == "ring" and r["world_size"] == world_size)
    print(f"\n### Network model against the measured ring, {world_size} ranks (fit leaving the size out)\n")
    print("| size | measured | model | model / measured | α (µs) | B (GB/s) |\n|---|---|---|---|---|---|")
    targets = []
    for nbytes, seconds in ring:
        if nbytes < 1 << 20 or len(ring) < 3:
            continue
        network = calibrate([x for x in ring if x[0] != nbytes], "ring", world_size)
        model = collective_time("ring", world_size, nbytes // 4, network).total
        print(f"| {_human(nbytes)} | {seconds * 1e3:.3g} ms | {model * 1e3:.3g} ms | {model / seconds:.2f} | "
              f"{network.latency * 1e6:.0f} | {network.bandwidth / 1e9:.2f} |")
        targets.append((f"network model within ±{tolerance:.0%} of the ring at {_human(nbytes)}, {world_size} ranks",
                        f"model / measured = {model / seconds:.2f}", abs(model / seconds - 1) <= tolerance))
    return targets


def _counting_layer(probe: int, repeats: int) -> tuple[str, str, bool]:
    """Measure what counting costs a ring on 4 ranks at ``probe`` bytes; print it; the < 5% target."""
    off = measure(4, [probe], ["ring"], repeats=repeats)[0]["seconds"]
    on = measure(4, [probe], ["ring"], repeats=repeats, record=True)[0]["seconds"]
    cost = instrumentation_overhead(4, probe)
    share = cost["labels_and_waits"] / off
    print(f"\n### Counting layer, ring on 4 ranks at {_human(probe)}\n")
    print("| measurement | value |\n|---|---|")
    print(f"| ring, recording off (median) | {off * 1e3:.3g} ms |")
    print(f"| ring, inside comm.record() (median) | {on * 1e3:.3g} ms ({on / off:.2f}×) |")
    print(f"| Python per call with free communication | {cost['python_per_call'] * 1e6:.0f} µs |")
    print(f"| of which phase labels + waiting notes (counting off) | {cost['labels_and_waits'] * 1e6:.0f} µs "
          f"= {share:.1%} of the call (target < 5%) |")
    return (f"counting layer off < 5% of a ring at {_human(probe)}, 4 ranks", f"{share:.1%}", share < 0.05)


def main(argv: list[str]) -> list[tuple[str, str, bool]]:
    """Print the tables; return the targets as ``(target, measured, met)`` (``--check`` is handled by the caller)."""
    parser = argparse.ArgumentParser(prog="python -m coursekit.bench allreduce", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--min-kib", type=int, default=4)
    parser.add_argument("--max-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20, help="iterations per point (fewer for big messages)")
    options = parser.parse_args(argv)
    sizes, size = [], options.min_kib << 10
    while size <= options.max_mib << 20:
        sizes.append(size)
        size *= 4
    rows = [row for world_size in options.world_sizes for row in _size_table(world_size, sizes, options.repeats)]
    targets = ring_vs_torch_targets(rows, tuple(options.world_sizes))
    targets += ring_vs_plain_targets(rows, tuple(options.world_sizes))
    if 2 in options.world_sizes:
        targets += calibration_targets(rows)
    probe = 1 << 20
    if probe in sizes and 4 in options.world_sizes:
        targets.append(_counting_layer(probe, max(30, options.repeats)))
    return targets
