"""``make gpu-check``: the course's collectives on GPUs under NCCL, each equal to ``torch.distributed``'s own.

Everything in the course is tested on CPU with gloo; this is the part that can only be checked where there are
GPUs. For every world size from 2 to the number of GPUs (at most 4), with one GPU per rank, on CUDA tensors
whose lengths do not divide evenly by the world size:

* coursekit's naive, master and ring all-reduce, and the ring's reduce-scatter + all-gather, equal
  ``dist.all_reduce`` of the same tensors (float32: to rounding; the ring's order of additions differs);
* the ring's traffic, counted by ``coursekit.comm``, equals its formula: 2(G−1)·N elements in all (R6).

    make gpu-check                                   # on a machine with >= 2 GPUs
    python tools/gpu_check.py --backend gloo         # the same checks on CPU ranks (tries the script itself)

Exit status: 0 all equal, 1 a check failed (each failure printed), 2 not enough GPUs for NCCL (says what to do).
What it does not cover yet: the strategies (``coursekit.train`` builds its models on the CPU).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist

import coursekit
from coursekit import comm
from coursekit.collectives import master_all_reduce, naive_all_reduce, ring_all_gather, ring_all_reduce
from coursekit.collectives import ring_reduce_scatter

LENGTHS = (1, 7, 1000, 1_000_003)  # one element, fewer than G·2, and lengths that do not divide by 2, 3 or 4
ALGORITHMS = {"naive": naive_all_reduce, "master": master_all_reduce, "ring": ring_all_reduce}


def _device(rank: int) -> torch.device:
    if dist.get_backend() == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _rank(rank: int, world_size: int) -> tuple[list[str], dict[int, int]]:
    """Every check on this rank: what failed (one sentence each), and what its ring sent per length."""
    device, failed, ring_sent = _device(rank), [], {}
    for numel in LENGTHS:
        generator = torch.Generator().manual_seed(1000 * rank + numel)
        mine = torch.randn(numel, generator=generator).to(device)
        want = mine.clone()
        dist.all_reduce(want)
        for name, all_reduce in ALGORITHMS.items():
            got = mine.clone()
            with comm.record() as traffic:
                all_reduce(got)
            if not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
                failed.append(f"G={world_size}, N={numel}, rank {rank}: {name} all-reduce differs from "
                              f"dist.all_reduce by {(got - want).abs().max().item():.3g}")
            if name == "ring":
                ring_sent[numel] = traffic.total
        x = mine.clone()
        segment = ring_reduce_scatter(x)
        ring_all_gather(segment, x)
        if not torch.allclose(x, want, rtol=1e-5, atol=1e-5):
            failed.append(f"G={world_size}, N={numel}, rank {rank}: reduce-scatter + all-gather differs from "
                          f"dist.all_reduce by {(x - want).abs().max().item():.3g}")
    return failed, ring_sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--max-ranks", type=int, default=4)
    options = parser.parse_args(argv)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if options.backend == "nccl" and gpus < 2:
        print(f"gpu-check needs at least 2 GPUs for NCCL, found {gpus}. On this machine the course runs on CPU "
              f"ranks with gloo (make test); try this script there with: python tools/gpu_check.py --backend gloo",
              file=sys.stderr)
        return 2
    top = min(options.max_ranks, gpus) if options.backend == "nccl" else options.max_ranks
    failures = []
    for world_size in range(2, top + 1):
        start = time.perf_counter()
        per_rank = coursekit.launch(_rank, world_size, backend=options.backend, timeout=300)
        found = [f for rank_failures, _ in per_rank for f in rank_failures]
        for numel in LENGTHS:
            sent = sum(ring_sent[numel] for _, ring_sent in per_rank)
            if sent != 2 * (world_size - 1) * numel:
                found.append(f"G={world_size}, N={numel}: the ring sent {sent} elements in all; the formula (R6) "
                             f"says 2(G−1)·N = {2 * (world_size - 1) * numel}")
        failures += found
        print(f"G={world_size} ({options.backend}): {'ok' if not found else f'{len(found)} FAILED'} "
              f"({time.perf_counter() - start:.1f} s)")
    for failure in failures:
        print("  " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
