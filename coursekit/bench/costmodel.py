"""Benchmark the cost model: its predictions against this machine's runs, and the planner against brute force.

    python -m coursekit.bench costmodel [--steps 8] [--gpus 1024] [--quick] [--check]

1. **Predicted vs measured, the course transformer at 2 ranks** (``tiny_transformer()``: 104,832 parameters,
   fp32 Adam, ``--global-batch`` sequences of 31 tokens), for data (``"naive"``, torch's all-reduce), pipeline
   (``"pipeline"``, 1F1B, m = 4) and tensor (``"tensor"``) parallelism, all trained in one launch:

   * bytes per rank -- parameters, gradients, optimizer state as ``coursekit.train`` measures them (chapter
     02's ``PeakMemory``) against :func:`coursekit.costmodel.memory_per_gpu` (Adam's 4-byte step counter per
     tensor is the only difference the model leaves out; tests/test_costmodel_memory_measured.py);
   * step time -- the median step (slowest rank) against :func:`coursekit.costmodel.step_time` on a
     :class:`~coursekit.costmodel.Hardware` fitted once: α and β from :func:`coursekit.netsim.calibrate` on
     all-reduces of 4 KiB-4 MiB timed on the same two ranks, and the CPU's FLOP/s from a matmul probe at
     the model's own shape (tokens × 64 by 64 × 256, the MLP's first layer). Target: within ±30%.

2. **plan against brute force** for a ``--gpus`` space (GPT-3 175 B, batch 1,536, A100s; ``--quick``: GPT-2
   small, its vocabulary padded so that tp can divide it, on 64 in Megatron-LM 2021's space): the same ranking, and both times.

``--quick`` (what tests/test_bench_costmodel.py runs): 4 steps, 3 message sizes, the 64-GPU space.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from ..costmodel import (Hardware, Layout, ModelConfig, Space, brute_force, memory_per_gpu, plan, step_time)
from ..launch import launch
from ..netsim import calibrate
from ..train import train

# label, strategy, train's options, the layout the cost model is asked about (2 ranks)
RUNS = [("data", "naive", {"collectives": "torch"}, Layout(dp=2)),
        ("pipeline", "pipeline", {"micro_batches": 4, "schedule": "1f1b"}, Layout(pp=2, micro_batches=4)),
        ("tensor", "tensor", {}, Layout(tp=2))]
WARMUP = 2
TOLERANCE = 0.30
COURSE = ModelConfig.course()                               # the model's 64 positions: its bytes
GPT2_PADDED = ModelConfig(50304, 1024, 768, 12, 12, name="GPT-2 small, vocabulary padded to 50,304")
TOKENS = 31                                                 # each training sequence: 32 tokens, shifted by one


def matmul_flops(tokens: int, repeats: int = 200) -> float:
    """FLOP/s of one thread on the course MLP's first matmul (``tokens × 64`` by ``64 × 256``), median of runs."""
    a, b = torch.randn(tokens, 64), torch.randn(64, 256)
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - begin)
    return 2 * tokens * 64 * 256 / statistics.median(times)


def _allreduce_samples(sizes: list[int], repeats: int) -> list[tuple[int, float]]:
    samples = []
    for nbytes in sizes:
        x = torch.zeros(nbytes // 4)
        times = []
        for _ in range(repeats):
            dist.barrier()
            begin = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - begin)
        samples.append((nbytes, statistics.median(times)))
    return samples


def _ranks(rank, world_size, steps, global_batch, sizes, repeats):
    """On each of the 2 ranks: the all-reduce samples, the probe, then each strategy's run."""
    torch.set_num_threads(1)
    samples = _allreduce_samples(sizes, repeats)
    flops = matmul_flops(global_batch * TOKENS // 2)
    runs = []
    for _, strategy, extra, _ in RUNS:
        result = train(rank, world_size, strategy, model="transformer", steps=steps, global_batch=global_batch,
                       record=False, **extra)
        runs.append({"step_times": result["step_times"], "memory": result["memory"]})
    return {"samples": samples, "flops": flops, "runs": runs}


def fitted_hardware(samples: list[tuple[int, float]], flops: float) -> Hardware:
    """This machine as the cost model sees it: 2 ranks on one "node", its link and its FLOP/s, nothing idle."""
    network = calibrate(samples, "ring", world_size=2)
    return Hardware(memory=float("inf"), flops=flops, efficiency=1.0, gpus_per_node=2,
                    intra_bandwidth=network.bandwidth, intra_latency=network.latency,
                    bandwidth=network.bandwidth, latency=network.latency, name="this machine, 2 ranks")


def measured_vs_predicted(options) -> list[tuple[str, str, bool]]:
    sizes = [4 << 10, 256 << 10, 4 << 20] if options.quick else [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
    ranks = launch(_ranks, 2, options.steps, options.global_batch, sizes, 5 if options.quick else 20, timeout=900)
    samples = [(n, max(r["samples"][i][1] for r in ranks)) for i, (n, _) in enumerate(ranks[0]["samples"])]
    flops = statistics.median(r["flops"] for r in ranks)
    hardware = fitted_hardware(samples, flops)
    timed = ModelConfig(COURSE.vocab, TOKENS, COURSE.hidden, COURSE.layers, COURSE.heads, COURSE.tied,
                        COURSE.qkv_bias, "course transformer, 31 tokens")
    print(f"## 1. Predicted vs measured: the course transformer at 2 ranks, {options.global_batch} sequences of "
          f"{TOKENS} tokens, fp32 Adam\n\nFitted once: α = {hardware.latency * 1e6:.0f} µs, B = "
          f"{hardware.bandwidth / 1e9:.2f} GB/s (torch's all-reduce, {len(samples)} sizes), matmul probe "
          f"{flops / 1e9:.1f} GFLOP/s (one thread)\n")
    print("| strategy | rank 0 params + grads + optimizer, measured | predicted | measured step | predicted "
          "step (compute + bubble + comm) | predicted / measured | + data's residual |\n|---|---|---|---|---|---|---|")
    targets, residual = [], None
    for i, (label, _, _, layout) in enumerate(RUNS):
        held = ranks[0]["runs"][i]["memory"]
        states = held["params"] + held["grads"] + held["optimizer"]
        micro = options.global_batch // (layout.dp * layout.micro_batches)
        bytes_model = memory_per_gpu(COURSE, layout, micro, precision="fp32", dropout=False)
        model_states = bytes_model.params + bytes_model.grads + bytes_model.optimizer
        measured = statistics.median(max(r["runs"][i]["step_times"][s] for r in ranks)
                                     for s in range(WARMUP, options.steps))
        t = step_time(timed, layout, hardware, options.global_batch, bytes_per_element=4)
        ratio = t.total / measured
        residual = measured - t.total if residual is None else residual
        print(f"| {label} | {states:,} B | {model_states:,} B ({model_states / states:.4f}) | "
              f"{measured * 1e3:.1f} ms | {t.total * 1e3:.1f} ms ({t.compute * 1e3:.1f} + {t.bubble * 1e3:.1f} + "
              f"{t.exposed_communication * 1e3:.2f}) | {ratio:.2f} | {(t.total + residual) / measured:.2f} |")
        targets.append((f"{label} parallelism's step within ±{TOLERANCE:.0%} of measured, 2 ranks",
                        f"predicted / measured = {ratio:.2f}", abs(ratio - 1) <= TOLERANCE))
    print(f"\nWhy the times can miss here: the model counts FLOPs and bytes, this machine's step is mostly "
          f"neither -- a 64-wide transformer issues hundreds of tiny kernels and Python calls (autograd, Adam over "
          f"every parameter tensor, the strategy's hooks), each costing microseconds that "
          f"no FLOP/s or α–β term holds, on {os.cpu_count()} cores shared by both ranks (and by whoever else runs). "
          f"The bytes are exact but for Adam's step counters; the times are reported, not asserted in tests.\n\n"
          f"The last column adds data parallelism's unexplained time (measured minus predicted, "
          f"{residual * 1e3:.0f} ms) to every prediction: where it brings a ratio near 1, the miss is a fixed "
          f"per-step cost of this machine, not a wrong formula. It is not the target.")
    return targets


def planner_vs_brute_force(options) -> list[tuple[str, str, bool]]:
    if options.quick:
        config, gpus, batch, space = GPT2_PADDED, 64, 256, Space.megatron_2021()
    else:
        config, gpus, batch, space = ModelConfig(51200, 2048, 12288, 96, 96, name="GPT-3 175B"), options.gpus, 1536, Space()
    hardware = Hardware()
    begin = time.perf_counter()
    everything = brute_force(config, hardware, gpus, batch, space)
    brute = time.perf_counter() - begin
    fitting = [c for c in everything if c.fits]
    begin = time.perf_counter()
    ranked = plan(config, hardware, gpus, batch, top=options.top, space=space)
    planned = time.perf_counter() - begin
    same = ranked == fitting[:options.top]
    print(f"\n## 2. plan against brute force: {config.name}, {gpus} GPUs (A100 80 GB, 8 per node), batch {batch}\n")
    print(f"| search | layouts evaluated | time | top {options.top} |\n|---|---|---|---|\n"
          f"| brute_force | {len(everything):,} ({len(fitting):,} fit) | {brute * 1e3:.0f} ms | — |\n"
          f"| plan | (pruned) | {planned * 1e3:.0f} ms | {'identical' if same else '**DIFFERENT**'} |")
    best = ranked[0]
    print(f"\nBest: {best.layout} -- {best.seconds:.2f} s a step\n" + "\n".join(f"* {r}" for r in best.reasons))
    return [(f"plan's top {options.top} = brute force's, {gpus} GPUs", "identical" if same else "different", same),
            (f"plan faster than brute force, {gpus} GPUs", f"{planned * 1e3:.0f} ms vs {brute * 1e3:.0f} ms",
             planned < brute)]


def main(argv: list[str]) -> list[tuple[str, str, bool]]:
    parser = argparse.ArgumentParser(prog="python -m coursekit.bench costmodel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="CI-sized: 4 steps, 3 sizes, a 64-GPU space")
    options = parser.parse_args(argv)
    if options.quick:
        options.steps = min(options.steps, 4)
    options.steps = max(options.steps, WARMUP + 1)
    return measured_vs_predicted(options) + planner_vs_brute_force(options)
