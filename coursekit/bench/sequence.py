"""Benchmark sequence parallelism: one attention call, forward + backward, full against ring and all-to-all.

    python -m coursekit.bench sequence [--seq 512 1024 2048] [--ranks 2 4] [--heads 4] [--head-dim 16]
                                       [--repeats 3] [--cap-mib 64] [--check]

For each sequence length S, on real ranks (one thread each):

* full attention in one process: the textbook ``softmax(q kᵀ) v`` (:func:`full_attention`), S×S scores;
  and torch's fused ``scaled_dot_product_attention`` (on CPU a blockwise, FlashAttention-like kernel: what
  removes the S² memory on *one* device; sequence parallelism then divides the rest, and the time, by G);
* ring attention, contiguous and zig-zag, on G = 2 and 4 ranks (S/G tokens each), each block's (S/G)² or
  (S/2G)² scores in memory; and zig-zag with the fused kernel per block (``kernel="fused"``: torch's CPU flash
  kernel, which returns the block's log-sum-exp and never holds a whole score block);
* all-to-all (Ulysses) on G = 2 and 4 ranks (its attention on H/G whole heads is the fused kernel).

Time: the slowest rank's median of ``--repeats`` forward + backward calls (after one warm-up).
Peak memory per rank: measured, the rise of the process's peak resident set (``VmHWM``, reset through
``/proc/self/clear_refs`` before the call) over what it held before — everything the call allocated at
its worst moment, inputs excluded. The longest sequence under ``--cap-mib`` per rank is *extrapolated*
from the measured peaks by a fit ``a + b·S + c·S²`` through the measured lengths (quadratic for full
attention, near-linear for ring attention whose largest tensor is a score block of (S/G)² or (S/2G)²).

Targets: zig-zag ring attention is faster than the contiguous split at G = 4 (the causal work balanced);
with the fused kernel, its peak per rank and its time are at most 1.5× Ulysses' at the longest S (when it is
at least 2048), on every G (the time as the median of 11 paired ratios, the two calls back to back in each,
with its interval).
On 2 cores, 4 ranks share 2 cores: times at G = 4 measure the scheduler as much as the algorithm, and no
split can beat one process on the total work; the memory columns and the work balance are what carry
over to GPUs, where each rank has its own device and the ring's transfers overlap its compute.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from ..launch import launch

METHODS = ["ring contiguous", "ring zig-zag", "ring zig-zag, fused", "all-to-all"]
TARGET_S = 2048  # the fused ring's targets against Ulysses are measured when the longest S is at least this


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set
        return True
    except OSError:
        return False


def _attend(method: str, seq: int):
    from ..parallel.sequence import full_attention, ring_attention
    from ..parallel.sequence import ulysses_attention

    if method == "full":
        return lambda q, k, v: full_attention(q, k, v, True)
    if method == "full, fused kernel":  # torch's scaled_dot_product_attention: blockwise on one device
        return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    if method == "all-to-all":
        return lambda q, k, v: ulysses_attention(q, k, v, True, seq)
    layout = "zigzag" if method.startswith("ring zig-zag") else "contiguous"
    kernel = "fused" if method.endswith("fused") else "textbook"
    return lambda q, k, v: ring_attention(q, k, v, True, layout, seq, kernel=kernel)


def _fixed_malloc() -> None:
    """Make glibc return every large block to the system on free, so that the resident set follows what is live.

    (By default its mmap threshold grows after a free, and freed blocks stay resident for reuse: a second
    call then allocates without the resident set rising, and the measured peak would be too low.)
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: fixed, so blocks >= 64 KiB are mmapped and unmapped
        libc.mallopt(-1, 64 * 1024)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def _one(rank, world_size, method, seq, heads, head_dim, repeats):
    import torch.distributed as dist

    from ..parallel.sequence import shard_sequence

    layout = "zigzag" if method.startswith("ring zig-zag") else "contiguous"
    g = torch.Generator().manual_seed(0)
    whole = [torch.randn(1, heads, seq, head_dim, generator=g) for _ in range(4)]
    q, k, v, grad = (shard_sequence(t, 2, rank, world_size, layout) for t in whole)
    del whole
    attend = _attend(method, seq)

    def once():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        attend(*leaves).backward(grad)

    once()  # warm-up
    times = []
    for _ in range(repeats):
        dist.barrier()
        begin = time.perf_counter()
        once()
        times.append(time.perf_counter() - begin)
    dist.barrier()
    peak = float("nan")
    if _reset_peak():
        before = _rss_kib("VmRSS")
        once()
        peak = (_rss_kib("VmHWM") - before) * 1024
    return statistics.median(times), peak


def _run(rank, world_size, methods, seqs, heads, head_dim, repeats):
    _fixed_malloc()
    return {(m, s): _one(rank, world_size, m, s, heads, head_dim, repeats) for m in methods for s in seqs}


def _paired(rank, world_size, methods, seq, heads, head_dim, iterations):
    """Each iteration times every method once, back to back: this rank's ``[[t_method, ...], ...]``."""
    import torch.distributed as dist

    from ..parallel.sequence import shard_sequence

    g = torch.Generator().manual_seed(0)
    whole = [torch.randn(1, heads, seq, head_dim, generator=g) for _ in range(4)]
    calls = []
    for method in methods:
        layout = "zigzag" if method.startswith("ring zig-zag") else "contiguous"
        q, k, v, grad = (shard_sequence(t, 2, rank, world_size, layout) for t in whole)
        attend = _attend(method, seq)

        def once(attend=attend, q=q, k=k, v=v, grad=grad):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            attend(*leaves).backward(grad)
        calls.append(once)
    for once in calls:
        once()  # warm-up
    rows = []
    for _ in range(iterations):
        row = []
        for once in calls:
            dist.barrier()
            begin = time.perf_counter()
            once()
            row.append(time.perf_counter() - begin)
        rows.append(row)
    return rows


def paired_ratio(world_size: int, seq: int, options, methods=("ring zig-zag, fused", "all-to-all"),
                 iterations: int = 11) -> tuple[float, float, float]:
    """Median over iterations of (first method's time / second's), each the slowest rank's, with an interval.

    The two calls of one iteration run back to back, so whatever else the machine does at that moment
    slows both: the ratio is far steadier than two medians taken apart. The interval is the 2nd and the
    (n−1)th of the n sorted ratios (for n = 11 about 99% coverage of the median; order statistics, no model).
    """
    results = launch(_paired, world_size, list(methods), seq, options.heads, options.head_dim, iterations,
                     timeout=600)
    ratios = sorted(max(r[i][0] for r in results) / max(r[i][1] for r in results) for i in range(iterations))
    return statistics.median(ratios), ratios[1], ratios[-2]


def measure(methods: list[str], world_size: int, options) -> dict:
    """``{(method, S): {"time", "peak"}}``: the slowest rank's median time and the largest peak, one launch."""
    results = launch(_run, world_size, methods, options.seq, options.heads, options.head_dim, options.repeats,
                     timeout=600)
    return {key: {"time": max(r[key][0] for r in results), "peak": max(r[key][1] for r in results)}
            for key in results[0]}


def longest_under(cap: float, lengths: list[int], peaks: list[float]) -> float:
    """The largest S with a + b·S + c·S² ≤ cap, the polynomial fitted (least squares) to the measured peaks."""
    scale = float(max(lengths))
    x = torch.tensor(lengths, dtype=torch.float64) / scale  # well conditioned: x in (0, 1]
    y = torch.tensor(peaks, dtype=torch.float64)
    design = torch.stack([torch.ones_like(x), x, x * x], dim=1)[:, :min(3, len(lengths))]
    coef = torch.linalg.lstsq(design, y.unsqueeze(1), driver="gelsd").solution.squeeze(1).tolist() + [0.0, 0.0]
    a, b, c = coef[0], coef[1] / scale, max(coef[2], 0.0) / scale ** 2
    room = cap - a
    if room <= 0:
        return 0.0
    root = b * b + 4 * c * room
    return 2 * room / (b + root ** 0.5) if b + root ** 0.5 > 0 else float("inf")  # the positive root, stably


def main(argv: list[str]) -> list[tuple[str, str, bool]]:
    parser = argparse.ArgumentParser(prog="python -m coursekit.bench sequence", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cap-mib", type=float, default=64.0)
    options = parser.parse_args(argv)
    print(f"one causal attention call, batch 1, {options.heads} heads of {options.head_dim}, float32; "
          f"forward + backward; {os.cpu_count()} CPU cores\n")
    print("| method | ranks | " + " | ".join(f"S={s}: time, peak/rank" for s in options.seq) + " |")
    print("|---|---|" + "---|" * len(options.seq))
    rows = {}
    for world_size, methods in [(1, ["full", "full, fused kernel"])] + [(g, METHODS) for g in options.ranks]:
        measured = measure(methods, world_size, options)
        for method in methods:
            cells = [measured[method, s] for s in options.seq]
            rows[method, world_size] = cells
            print(f"| {method} | {world_size} | " + " | ".join(
                f"{c['time'] * 1e3:.0f} ms, {c['peak'] / 2**20:.1f} MiB" for c in cells) + " |", flush=True)
    cap = options.cap_mib * 2**20
    print(f"\nlongest sequence under {options.cap_mib:g} MiB per rank (extrapolated from the measured peaks):\n")
    print("| method | ranks | longest S |\n|---|---|---|")
    for (label, world_size), cells in rows.items():
        longest = longest_under(cap, options.seq, [c["peak"] for c in cells])
        print(f"| {label} | {world_size} | {longest:,.0f} |")
    targets = []
    for g in options.ranks:
        if options.seq[-1] < TARGET_S:  # the targets are stated at S = 2048: a quick run at small S measures none
            break
        fused, ulysses = rows["ring zig-zag, fused", g][-1], rows["all-to-all", g][-1]
        targets.append((f"fused zig-zag ring's peak per rank <= 1.5x Ulysses' at G={g}, S={options.seq[-1]}",
                        f"{fused['peak'] / 2**20:.1f} MiB vs {ulysses['peak'] / 2**20:.1f} MiB",
                        fused["peak"] <= 1.5 * ulysses["peak"]))
        ratio, low, high = paired_ratio(g, options.seq[-1], options)
        targets.append((f"fused zig-zag ring's time <= 1.5x Ulysses' at G={g}, S={options.seq[-1]} (paired)",
                        f"{ratio:.2f}x, interval [{low:.2f}, {high:.2f}] over 11 paired calls", ratio <= 1.5))
        if g >= 4:
            z, c = rows["ring zig-zag", g][-1]["time"], rows["ring contiguous", g][-1]["time"]
            targets.append((f"ring zig-zag faster than contiguous at G={g}, S={options.seq[-1]}",
                            f"{z * 1e3:.0f} ms vs {c * 1e3:.0f} ms", z < c))
    return targets
