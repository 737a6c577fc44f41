"""Benchmark the launcher: cold ``launch`` of a no-op, and a warm ``Cluster.run`` round trip.

    python -m coursekit.bench launch [--repeats 20] [--check]

Cold launch = the whole ``launch`` call: fork the ranks, initialise
torch.distributed (gloo), run the no-op, collect results, tear everything down.
Warm round trip = one ``Cluster.run`` of a no-op on ranks already running.
Targets (2-core machine): cold 4 ranks <= 0.5 s, warm 4 ranks <= 10 ms.
"""

from __future__ import annotations

import argparse
import statistics
import time

from ..launch import Cluster, launch


def _noop(rank: int, world_size: int) -> int:
    return rank


def _median_seconds(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str]) -> list[tuple[str, str, bool]]:
    """Print the table; return the targets as ``(target, measured, met)`` (``--check`` is handled by the caller)."""
    parser = argparse.ArgumentParser(prog="python -m coursekit.bench launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20, help="runs per measurement (median reported)")
    options = parser.parse_args(argv)
    repeats = max(10, options.repeats)
    print("| measurement | world size | median | target |\n|---|---|---|---|")
    targets = []
    for world_size in (2, 4):
        launch(_noop, world_size)  # warm the page cache / imports once
        cold = _median_seconds(lambda: launch(_noop, world_size), repeats)
        print(f"| cold `launch` (no-op) | {world_size} | {cold * 1e3:.0f} ms | {'≤ 0.5 s' if world_size == 4 else ''} |")
        if world_size == 4:
            targets.append(("cold `launch` of a no-op, 4 ranks ≤ 0.5 s", f"{cold * 1e3:.0f} ms", cold <= 0.5))
    for world_size in (2, 4):
        with Cluster(world_size) as cluster:
            cluster.run(_noop)
            warm = _median_seconds(lambda: cluster.run(_noop), repeats * 5)
        print(f"| warm `Cluster.run` round trip | {world_size} | {warm * 1e3:.2f} ms | "
              f"{'≤ 10 ms' if world_size == 4 else ''} |")
        if world_size == 4:
            targets.append(("warm `Cluster.run` round trip, 4 ranks ≤ 10 ms", f"{warm * 1e3:.2f} ms", warm <= 0.010))
    print(f"\n{repeats} cold runs and {repeats * 5} warm runs per row.")
    return targets
