"""Benchmark tensor parallelism on the course transformer: step time, communication share, DTensor side by side.

    python -m coursekit.bench tensor [--global-batch 32] [--steps 10] [--repeats 3] [--iters 40] [--check]

Measures, on the same global batch (the same work per step):

* strategy ``"tensor"`` at degrees 1, 2 and 4 (every rank of the group takes the whole batch; degree 1 is
  one process running the same code, no communication);
* ``"dp_tp"``: data × tensor parallelism on a 2 × 2 mesh (each tensor group takes half of the batch);
* one block's MLP and attention, forward and backward at degree 2: coursekit's layers
  (:mod:`coursekit.parallel.tensor`) against DTensor's ``parallelize_module`` (``ColwiseParallel``,
  ``RowwiseParallel``). Target: coursekit ≤ 1.2× DTensor's time;
* P10 where it is true (:mod:`coursekit.experiments.tensor_versus_model`): 4 residual MLP blocks 1024 → 4096 → 1024
  on 256 tokens, one process against tensor parallelism and model parallelism (2 + 2 blocks) on 2 ranks,
  the three back to back in each iteration (paired). Targets: tensor parallelism ≥ 1.6× one process, and
  faster than model parallelism (median paired ratios).

"comm share" is the time ranks spend inside the blocking all-reduces and all-gathers of the layers
(timed in the operators; waiting for a slower rank included) and, for the hybrid, in the gradient
all-reduce over ``dp``, over the step time. Each number is the median over ``--repeats`` runs (round-robin
over the variants) of the median over the measured steps (the first 3 are warm-up); a step's time is the
slowest rank's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from ..launch import launch
from ..train import train

VARIANTS = [  # label, strategy, world size, extra arguments
    ("tensor, degree 1 (one process)", "tensor", 1, {}),
    ("tensor, degree 2", "tensor", 2, {}),
    ("tensor, degree 4", "tensor", 4, {}),
    ("data × tensor, 2 × 2 mesh", "dp_tp", 4, {"tp": 2, "collectives": "torch"}),
]
WARMUP = 3


def _run(rank, world_size, strategy, options, extra):
    result = train(rank, world_size, strategy, model="transformer", steps=options["steps"],
                   global_batch=options["global_batch"], record=False, **extra)
    return result["step_times"], result["tp_comm_seconds"] + result.get("dp_comm_seconds", 0.0)


def measure(strategy: str, world_size: int, options: dict, extra: dict) -> dict:
    """Median step time (slowest rank) and the share of it spent in the layers' collectives."""
    results = launch(_run, world_size, strategy, options, extra, timeout=600)
    per_step = [max(times[i] for times, _ in results) for i in range(WARMUP, options["steps"])]
    share = statistics.mean(seconds / sum(times) for times, seconds in results)
    return {"step": statistics.median(per_step), "share": share}


def _blocks(rank, world_size, iters, batch):
    """Forward + backward of one block's MLP then attention, coursekit's and DTensor's, iterations alternated."""
    from torch.distributed.device_mesh import init_device_mesh

    from ..models import tiny_transformer
    from ..parallel.tensor import ParallelMLP, ParallelSelfAttention
    from ..parallel.tensor import torch_parallel_attention, torch_parallel_mlp

    device_mesh = init_device_mesh("cpu", (world_size,))
    group = device_mesh.get_group()
    block = tiny_transformer(seed=0).blocks[0]
    ours = [ParallelMLP.from_dense(block.fc, block.out, group), ParallelSelfAttention.from_dense(block.attn, group)]
    theirs = [torch_parallel_mlp(block.fc, block.out, device_mesh), torch_parallel_attention(block.attn, device_mesh)]
    x = torch.randn(batch, 31, 64, generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {"coursekit": [], "DTensor": []}
    for i in range(iters + 5):
        for name, (mlp, attn) in (("coursekit", ours), ("DTensor", theirs)):
            inputs = x.clone().requires_grad_(True)
            begin = time.perf_counter()
            attn(mlp(inputs)).sum().backward()
            if i >= 5:
                times[name].append(time.perf_counter() - begin)
    return times


def main(argv: list[str]) -> list[tuple[str, str, bool]]:
    parser = argparse.ArgumentParser(prog="python -m coursekit.bench tensor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iters", type=int, default=40, help="block iterations per variant (DTensor comparison)")
    parser.add_argument("--wide-iters", type=int, default=11, help="iterations of the wide-model comparison (P10)")
    options = parser.parse_args(argv)
    config = {"steps": max(WARMUP + 2, options.steps), "global_batch": options.global_batch}
    print(f"transformer (tiny_transformer(): d_model 64, 4 heads, 2 layers, vocabulary 16), "
          f"{config['global_batch']} sequences of 31 tokens per step, Adam\n")
    print("| variant | ranks | step time | vs degree 1 | comm share |\n|---|---|---|---|---|")
    runs: dict[int, list[dict]] = {i: [] for i in range(len(VARIANTS))}
    for _ in range(max(1, options.repeats)):
        for i, (_, strategy, world_size, extra) in enumerate(VARIANTS):
            runs[i].append(measure(strategy, world_size, config, extra))
    rows = []
    for i, (label, _, world_size, _) in enumerate(VARIANTS):
        best = {key: statistics.median(r[key] for r in runs[i]) for key in runs[i][0]}
        rows.append(best)
        print(f"| {label} | {world_size} | {best['step'] * 1e3:.1f} ms | {best['step'] / rows[0]['step']:.2f}× | "
              f"{best['share']:.0%} |", flush=True)

    times = launch(_blocks, 2, options.iters, 16, timeout=600)
    ours = statistics.median(max(t["coursekit"][i] for t in times) for i in range(options.iters))
    theirs = statistics.median(max(t["DTensor"][i] for t in times) for i in range(options.iters))
    ratio = ours / theirs
    print("\none block's MLP + attention, forward and backward, degree 2, 16 × 31 tokens (median of "
          f"{options.iters} iterations, slowest rank):\n")
    print(f"| coursekit | DTensor parallelize_module | ratio (target ≤ 1.20×) |\n|---|---|---|\n"
          f"| {ours * 1e3:.2f} ms | {theirs * 1e3:.2f} ms | {ratio:.2f}× |")
    cores = os.cpu_count()
    batch_bytes = config["global_batch"] * 31 * 64 * 4
    print(f"\nWhat {cores} cores do to these numbers: every layer boundary waits for an all-reduce of b·s·h "
          f"floats ({batch_bytes / 2**10:.0f} KiB at this batch; 5 forward and 5 backward per step with 2 layers), "
          f"on the critical path, while each rank's share of the arithmetic is a 64-wide matrix product: "
          f"communication is {rows[1]['share']:.0%} of degree 2's step. Degree 2 gives each rank a core of its own; "
          f"degree 4 and the 2 × 2 mesh put 4 single-thread ranks on {cores} cores, so their times measure the "
          f"scheduler as much as tensor parallelism (degree 4 is {rows[2]['step'] / rows[1]['step']:.2f}× "
          f"degree 2's step). On GPUs of one node the matrices are thousands wide and the all-reduces cross "
          f"NVLink; that is where tensor parallelism pays, and why it stays inside a node.")
    targets = [("coursekit's tensor-parallel block ≤ 1.2× DTensor's", f"{ratio:.2f}×", ratio <= 1.2)]
    return targets + wide_model(options.wide_iters)


def wide_model(iterations: int) -> list[tuple[str, str, bool]]:
    """P10 on the wide MLP: step times of the three variants, paired ratios, and the two targets."""
    from ..experiments import VARIANTS, step_times

    results = launch(step_times, 2, iterations, timeout=600)
    slowest = {v: [max(r[v][i] for r in results) for i in range(iterations)] for v in VARIANTS}

    def paired(a: str, b: str) -> tuple[float, float, float]:
        ratios = sorted(x / y for x, y in zip(slowest[a], slowest[b]))
        return statistics.median(ratios), ratios[0], ratios[-1]

    print(f"\nP10 where compute dominates: 4 residual MLP blocks 1024 → 4096 → 1024, 256 tokens, forward + "
          f"backward, 2 ranks of one thread; median of {iterations} iterations (slowest rank), the three variants "
          f"back to back in each:\n")
    print("| variant | step time | one process / variant (paired: median [lowest, highest]) |\n|---|---|---|")
    for v in VARIANTS:
        median, low, high = paired("one process", v)
        print(f"| {v} | {statistics.median(slowest[v]) * 1e3:.0f} ms | {median:.2f}× [{low:.2f}, {high:.2f}] |")
    speedup, low, high = paired("one process", "tensor parallel")
    versus, vlow, vhigh = paired("model parallel", "tensor parallel")
    return [("tensor parallelism ≥ 1.6× one process on the wide MLP (2 ranks)",
             f"{speedup:.2f}× [{low:.2f}, {high:.2f}]", speedup >= 1.6),
            ("tensor parallelism faster than model parallelism on the wide MLP",
             f"model / tensor {versus:.2f}× [{vlow:.2f}, {vhigh:.2f}]", versus > 1.0)]
