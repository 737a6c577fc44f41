"""Benchmark expert parallelism: how a step's time grows with the routing's imbalance, on 2 ranks.

    python -m coursekit.bench expert [--tokens 1024] [--iterations 11] [--width 512] [--hidden 2048] [--check]

Chapter 07's run, larger: 4 experts ``width → hidden → width``, two on each of 2 ranks (one core each),
``--tokens`` tokens per rank. A fixed router sends a share s of every rank's tokens to rank 0's experts, so
the imbalance (the busier rank's rows over the mean) is ``2·max(s, 1 − s)``, from 1 to 2. Each iteration times
forward + backward at every share back to back (:func:`~coursekit.experiments.expert_imbalance.imbalance_times`),
and the experts alone on an even load's rows.

Then the same layer (an even router: the model's own, 4 experts, k = 1) as coursekit's
:class:`~coursekit.parallel.expert.ExpertParallelMoE` and as torchtitan 0.3.0's MoE on the same weights
(:mod:`coursekit.parallel.expert.torch`: its router, dispatch and combine, our GELU experts through its grouped
matrix product), taking turns in every iteration.

Targets: ours within 1.2× of torchtitan's step (the median of the paired ratios); at imbalance 2 the step's growth over the even step (ratio − 1, the median of the paired ratios) is
within 20% of the growth that the busiest rank's load predicts (the even step's expert part × 2, the rest
unchanged: :func:`~coursekit.experiments.expert_imbalance.predicted_ratio`). Judge it on a quiet machine: on
2 shared cores an idle rank's core goes to the busy one, and the growth shrinks (the output says the load
average before and after).
"""

from __future__ import annotations

import argparse
import os
import statistics

import time

import torch
import torch.distributed as dist

from ..experiments.expert_imbalance import imbalance_times, predicted_ratio
from ..launch import launch
from .allreduce import paired_ratio

SHARES = [0.5, 0.625, 0.75, 0.875, 1.0]
GROWTH_TOLERANCE = 0.20   # measured growth within ±20% of the predicted growth, at imbalance 2
TORCHTITAN_RATIO = 1.2    # our layer's step over torchtitan's, median of paired ratios


def versus_torchtitan(rank: int, world_size: int, tokens: int, width: int, hidden: int,
                      iterations: int) -> dict[str, list[float]]:
    """Seconds of forward + backward of our layer and torchtitan's, in turns (who goes first alternates)."""
    from ..parallel.expert import ExpertParallelMoE, MoE
    from ..parallel.expert.torch import torchtitan_moe

    torch.set_num_threads(1)
    moe = MoE(width, hidden, 4, k=1)
    layers = {"coursekit": ExpertParallelMoE(moe), "torchtitan": torchtitan_moe(moe)}
    calls = {"coursekit": lambda x: layers["coursekit"](x)[0], "torchtitan": lambda x: layers["torchtitan"](x[None])[0]}
    x = torch.randn(tokens, width, generator=torch.Generator().manual_seed(rank), requires_grad=True)
    times: dict[str, list[float]] = {name: [] for name in layers}
    for iteration in range(iterations + 1):                 # the first is a warm-up
        for name in (list(layers) if iteration % 2 else list(layers)[::-1]):
            dist.barrier()
            begin = time.perf_counter()
            calls[name](x).square().mean().backward()
            dist.barrier()
            if iteration:
                times[name].append(time.perf_counter() - begin)
    return times


def growth_target(times: dict) -> tuple[str, str, bool]:
    """The target at the last share (imbalance 2): measured growth against the predicted one."""
    even, full = times[SHARES[0]], times[SHARES[-1]]
    median, low, high = paired_ratio(full, even)
    predicted = predicted_ratio(times, 2.0)
    off = (median - 1) / (predicted - 1) - 1
    return (f"step-time growth at imbalance 2 within {GROWTH_TOLERANCE:.0%} of the busiest rank's prediction",
            f"{median - 1:+.2f} [{low - 1:+.2f}, {high - 1:+.2f}] against {predicted - 1:+.2f} ({off:+.0%})",
            abs(off) <= GROWTH_TOLERANCE)


def main(argv: list[str]) -> list[tuple[str, str, bool]]:
    parser = argparse.ArgumentParser(prog="python -m coursekit.bench expert")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per rank")
    parser.add_argument("--iterations", type=int, default=11)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=2048)
    args = parser.parse_args(argv)
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    times = launch(imbalance_times, 2, SHARES, tokens=args.tokens, d_model=args.width, d_ff=args.hidden,
                   iterations=args.iterations, timeout=600)[0]
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    even = statistics.median(times[SHARES[0]])
    print(f"2 ranks, {args.tokens} tokens each, experts {args.width} → {args.hidden} → {args.width}; "
          f"an even step: {1e3 * even:.1f} ms, {statistics.median(times['experts']) / even:.0%} of it in the experts\n")
    print("| share to rank 0 | imbalance | step / even step (median [95% interval]) | predicted |\n|---|---|---|---|")
    for share in SHARES:
        load = 2 * max(share, 1 - share)
        median, low, high = paired_ratio(times[share], times[SHARES[0]])
        print(f"| {share:.3f} | {load:.2f} | {median:.2f} [{low:.2f}, {high:.2f}] | {predicted_ratio(times, load):.2f} |")
    targets = [growth_target(times)]
    try:
        import torchtitan  # noqa: F401
    except ImportError:
        from ..parallel.expert.torch import TORCHTITAN_INSTALL
        print(f"\ntorchtitan is not installed: its comparison is skipped ({TORCHTITAN_INSTALL})")
        return targets
    pair = launch(versus_torchtitan, 2, args.tokens, args.width, args.hidden, args.iterations, timeout=600)[0]
    median, low, high = paired_ratio(pair["coursekit"], pair["torchtitan"])
    print(f"\ncoursekit's layer / torchtitan's, same weights and tokens: {median:.2f} [{low:.2f}, {high:.2f}] "
          f"({1e3 * statistics.median(pair['coursekit']):.1f} ms against "
          f"{1e3 * statistics.median(pair['torchtitan']):.1f} ms)")
    targets.append((f"coursekit's expert-parallel step within {TORCHTITAN_RATIO}× of torchtitan's",
                    f"{median:.2f} [{low:.2f}, {high:.2f}]", median <= TORCHTITAN_RATIO))
    return targets
