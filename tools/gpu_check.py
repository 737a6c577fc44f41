"""``make gpu-check``: the course's collectives on GPUs under NCCL, each equal to ``torch.distributed``'s own.

Everything in the course is tested on CPU with gloo; this is the part that can only be checked where there are
GPUs. For every world size from 2 to the number of GPUs (at most 4), with one GPU per rank, on CUDA tensors
whose lengths do not divide evenly by the world size:

* coursekit's naive, master and ring all-reduce, and the ring's reduce-scatter + all-gather, equal
  ``dist.all_reduce`` of the same tensors (float32: to rounding; the ring's order of additions differs);
* the ring's traffic, counted by ``coursekit.comm``, equals its formula: 2(G−1)·N elements in all (R6);
* every chapter's core equivalence, through the capstone trainer (:mod:`coursekit.capstone`) for 20 steps on
  the rank's GPU (``coursekit.device()``): data parallelism with ZeRO-1 and ZeRO-3, the pipeline (1F1B and
  ZB-H1), tensor parallelism, ring attention (sequence parallelism), and dp × tp, tp × pp on 4 GPUs -- each
  loss curve equal to one process's on the CPU (relative 1e-4: GPU kernels add in other orders);
* expert parallelism (``train(..., "expert")``: tokens to their experts' GPUs and back, uneven all-to-alls) at
  ep = 2, and dp 2 × ep 2 on 4 GPUs, against one process on the CPU alike.

The process group is ``"cpu:gloo,cuda:nccl"`` (:mod:`coursekit.comm.devices`): CUDA tensors over NCCL, the few CPU
tensors of the bookkeeping over gloo. About 2 minutes on a machine with 4 GPUs.

    make gpu-check                                   # on a machine with >= 2 GPUs; without: "skipped: no GPU"
    python tools/gpu_check.py --backend gloo         # the same checks on CPU ranks (tries the script itself)

Exit status: 0 all equal (or skipped: fewer than 2 GPUs), 1 a check failed (each failure printed).
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
    where = coursekit.device()
    if where.type == "cuda":
        torch.cuda.set_device(where)
    return where


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


CAPSTONE = [  # (label, ranks, the layout's options): each chapter's core, then two compositions
    ("data parallel, ZeRO-1", 2, dict(dp=2, zero=1)),
    ("data parallel, ZeRO-3", 2, dict(dp=2, zero=3)),
    ("pipeline, 1F1B", 2, dict(pp=2, microbatches=4)),
    ("pipeline, ZB-H1", 2, dict(pp=2, microbatches=4, schedule="zb_h1")),
    ("tensor parallel", 2, dict(tp=2)),
    ("ring attention", 2, dict(sp=2)),
    ("data × tensor", 4, dict(dp=2, tp=2)),
    ("tensor × pipeline", 4, dict(tp=2, pp=2, microbatches=2)),
]


def capstone(backend: str, top: int, steps: int = 20) -> list[str]:
    """The capstone's layouts that fit ``top`` ranks, each against one process's curve; one line printed each."""
    from coursekit.capstone import Config, one_process_losses, run

    failures = []
    for label, ranks, layout in CAPSTONE:
        if ranks > top:
            print(f"capstone {label}: skipped (needs {ranks} ranks)")
            continue
        config = Config(steps=steps, quiet=True, **layout)
        start = time.perf_counter()
        got = coursekit.launch(run, ranks, config, backend=backend, timeout=300)[0]["losses"]
        failures += _judged(f"capstone {label}", f"{config.layout}, {backend}", got, one_process_losses(config), start)
    return failures


def _judged(name: str, detail: str, got: list[float], want: list[float], start: float) -> list[str]:
    """Print one line for a loss curve against one process's (relative 1e-4); return the failure, if any."""
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    ok = len(got) == len(want) and worst <= 1e-4
    print(f"{name} ({detail}): {'ok' if ok else 'FAILED'}, largest relative difference {worst:.1e} "
          f"({time.perf_counter() - start:.1f} s)")
    return [] if ok else [f"{name}: its loss curve differs from one process's by {worst:.2e} (relative)"]


EXPERT = [("experts over 2", 2, 2), ("data × experts", 4, 2)]  # (label, ranks, ep)


def _expert_losses(rank: int, world_size: int, ep: int, steps: int) -> list[float]:
    from coursekit.models import LanguageData
    from coursekit.parallel.expert import tiny_moe
    from coursekit.train import train

    strategy, options = ("single", {}) if world_size == 1 else ("expert", {"ep": ep})
    return train(rank, world_size, strategy, model=lambda: tiny_moe(n_experts=4, k=2), data=LanguageData(),
                 steps=steps, global_batch=7, record=False, **options)["losses"]


def expert(backend: str, top: int, steps: int = 20) -> list[str]:
    """Expert parallelism's layouts that fit ``top`` ranks, each against one process's curve (on the CPU)."""
    failures, want = [], _expert_losses(0, 1, 1, steps)
    for label, ranks, ep in EXPERT:
        if ranks > top:
            print(f"expert {label}: skipped (needs {ranks} ranks)")
            continue
        start = time.perf_counter()
        got = coursekit.launch(_expert_losses, ranks, ep, steps, backend=backend, timeout=300)[0]
        failures += _judged(f"expert {label}", f"ep{ep} on {ranks}, {backend}", got, want, start)
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--max-ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20, help="steps of each capstone layout")
    options = parser.parse_args(argv)
    gpus = coursekit.comm.devices.gpu_count()
    if options.backend == "nccl" and gpus < 2:
        print(f"skipped: no GPU (found {gpus}; NCCL needs at least 2). On this machine the course runs on CPU ranks "
              f"with gloo (make test); to try this script's checks there: python tools/gpu_check.py --backend gloo")
        return 0
    backend = coursekit.comm.devices.MIXED if options.backend == "nccl" else "gloo"
    top = min(options.max_ranks, gpus) if options.backend == "nccl" else options.max_ranks
    failures = []
    for world_size in range(2, top + 1):
        start = time.perf_counter()
        per_rank = coursekit.launch(_rank, world_size, backend=backend, timeout=300)
        found = [f for rank_failures, _ in per_rank for f in rank_failures]
        for numel in LENGTHS:
            sent = sum(ring_sent[numel] for _, ring_sent in per_rank)
            if sent != 2 * (world_size - 1) * numel:
                found.append(f"G={world_size}, N={numel}: the ring sent {sent} elements in all; the formula (R6) "
                             f"says 2(G−1)·N = {2 * (world_size - 1) * numel}")
        failures += found
        print(f"G={world_size} ({options.backend}): {'ok' if not found else f'{len(found)} FAILED'} "
              f"({time.perf_counter() - start:.1f} s)")
    failures += capstone(backend, top, options.steps)
    failures += expert(backend, top, options.steps)
    for failure in failures:
        print("  " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
