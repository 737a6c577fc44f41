"""Benchmark the capstone trainer: every tested layout on this machine, beside the cost model's view of it.

    python -m coursekit.bench capstone [--steps 8] [--batch 16] [--check]

For each layout of ``tests/test_capstone.py`` (4 ranks; the course transformer with 4 blocks, fp32, Adam),
:func:`coursekit.capstone.run` trains ``--steps`` steps and reports tokens/s (the median step after the first)
and the peak bytes per rank of model state (parameters, gradients, Adam's moments) and in all (with
activations), the largest over the ranks. Caveat: 4 ranks share 2 CPU cores here and the model is tiny, so
tokens/s measures the course's communication and Python overhead, not the layouts' merit; the memory is
exact whatever the machine.

Two columns come from chapter 08's cost model (:mod:`coursekit.costmodel`), which never ran anything:

* its model-state bytes on the most loaded rank for the *same* layout of the *same* model in fp32
  (:func:`~coursekit.costmodel.memory_per_gpu`) -- compared with the measured peak;
* the same degrees of tensor, pipeline and sequence parallelism on 1,024 A100s (data parallelism takes the
  rest) for GPT-2 small, 1,024 sequences a step: the modeled step time and tokens/s per GPU.

Targets (``--check``): every layout's loss curve equals one process's (relative 1e-5 at every step), and each
layout's measured model-state peak equals the cost model's count plus Adam's step counters (one 4-byte scalar
per parameter tensor it updates, at most one per tensor of the model, which the cost model does not count). ZeRO-3's
peak also holds two layers, the embeddings and the norms gathered for compute and the full gradients of the layers being
reduced, which these columns of the cost model leave out: its target is per-unit ZeRO-3's own count
(:func:`~coursekit.measure.memory.unit_peak_held_bytes`, the largest rank's).
"""

from __future__ import annotations

import argparse
import os

from ..capstone import Config, one_process_losses, run
from ..costmodel import Hardware, Layout, ModelConfig, memory_per_gpu, step_time
from ..launch import launch
from ..measure.memory import unit_peak_held_bytes
from ..models import tiny_transformer
from ..parallel.data import layer_units

LAYOUTS = [  # label, degrees and options of Config
    ("single", {}),
    ("dp4", {"dp": 4}),
    ("dp4 zero1", {"dp": 4, "zero": 1}),
    ("dp4 zero3", {"dp": 4, "zero": 3}),
    ("dp2×tp2", {"dp": 2, "tp": 2}),
    ("tp4", {"tp": 4}),
    ("dp2×pp2", {"dp": 2, "pp": 2, "microbatches": 2}),
    ("tp2×pp2", {"tp": 2, "pp": 2, "microbatches": 2}),
    ("pp2×sp2", {"pp": 2, "sp": 2, "microbatches": 2}),
    ("dp2×sp2", {"dp": 2, "sp": 2}),
]
STATE = ("params", "grads", "optimizer")


def measure(config: Config) -> dict:
    """One run of ``config``: its curve, tokens/s, and the peak bytes per rank (the largest rank's)."""
    results = launch(run, config.world_size, config, timeout=600)
    peak = [r["peak_memory"] for r in results]
    return {"losses": results[0]["losses"], "tokens_per_s": min(r["tokens_per_s"] for r in results),
            "state": max(sum(p.get(k, 0) for k in STATE) for p in peak), "total": max(p["total"] for p in peak)}


def modeled_state(config: Config) -> int:
    """The cost model's model-state bytes on the most loaded rank, fp32 (4 + 4 + 8 bytes a parameter)."""
    model = ModelConfig.course(vocab=config.vocab, d_model=config.d_model, n_heads=config.heads,
                               n_layers=config.layers, max_seq_len=config.seq_len)
    layout = Layout(dp=config.dp, tp=config.tp, pp=config.pp, sp=config.sp, zero=config.zero,
                    micro_batches=config.microbatches)
    m = memory_per_gpu(model, layout, micro_batch=1, precision="fp32", dropout=False)
    return int(m.params + m.grads + m.optimizer)


def zero3_state(config: Config) -> int:
    """Per-unit ZeRO-3's model-state peak on the most loaded rank, each kind at its own peak, a unit per layer."""
    model = tiny_transformer(seed=config.seed, vocab_size=config.vocab, d_model=config.d_model,
                             n_heads=config.heads, n_layers=config.layers, max_seq_len=config.seq_len)
    modules = dict(model.named_modules())
    sizes = [sum(p.numel() for p in modules[name].parameters()) for name in layer_units(model)]
    root = sum(p.numel() for p in model.parameters()) - sum(sizes)
    return max(sum(unit_peak_held_bytes(sizes, root, config.dp, r).values()) for r in range(config.dp))


def at_scale(config: Config, gpus: int = 1024, global_batch: int = 1024) -> tuple[float, float] | None:
    """Modeled step seconds and tokens/s per GPU of the same tp, pp, sp degrees on ``gpus`` A100s (GPT-2 small),
    priced by shape (:meth:`Hardware.a100`)."""
    inner = config.tp * config.pp * config.sp
    gpt2, micro = ModelConfig.gpt2_small(), max(config.microbatches, 1)
    layout = Layout(dp=gpus // inner, tp=config.tp, pp=config.pp, sp=config.sp, zero=config.zero,
                    micro_batches=micro)
    if global_batch % (layout.dp * micro):
        return None
    t = step_time(gpt2, layout, Hardware.a100(), global_batch=global_batch).total
    return t, global_batch * gpt2.seq_len / t / gpus


def main(argv: list[str]) -> list[tuple[str, str, bool]]:
    parser = argparse.ArgumentParser(prog="python -m coursekit.bench capstone", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    options = parser.parse_args(argv)
    base = dict(steps=options.steps, batch=options.batch, quiet=True)
    want = one_process_losses(Config(**base))
    print(f"the course transformer (4 blocks, d_model 64, fp32, Adam), {options.batch} sequences of 31 tokens a "
          f"step, {options.steps} steps; {os.cpu_count()} CPU cores\n")
    print("| layout | ranks | tokens/s | model state / rank (measured) | cost model | peak / rank | "
          "1,024 A100s, GPT-2 small: step, tokens/s/GPU |\n|---|---|---|---|---|---|---|")
    targets, worst = [], 0.0
    tensors = len(list(tiny_transformer(seed=0, n_layers=Config().layers).parameters()))  # Adam's counters at most
    for label, degrees in LAYOUTS:
        config = Config(**base, **degrees)
        got = measure(config)
        worst = max(worst, max(abs(a - b) / abs(b) for a, b in zip(got["losses"], want)))
        modeled = modeled_state(config)
        scale = at_scale(config)
        where = f"{scale[0] * 1e3:.0f} ms, {scale[1]:,.0f}" if scale else "—"
        print(f"| {label} | {config.world_size} | {got['tokens_per_s']:,.0f} | {got['state']:,} B | {modeled:,} B | "
              f"{got['total'] / 2**20:.2f} MiB | {where} |", flush=True)
        extra = got["state"] - modeled
        if config.zero == 3:  # its peak holds gathered layers and full gradients too: its own formula counts them
            counted = zero3_state(config)
            targets.append((f"{label}: measured model state = per-unit ZeRO-3's count (unit_peak_held_bytes)",
                            f"{got['state']:,} = {counted:,}", got["state"] == counted))
            continue
        targets.append((f"{label}: measured model state = the cost model's + Adam's step counters",
                        f"{got['state']:,} = {modeled:,} + {extra:,}", 0 <= extra <= 4 * tensors and extra % 4 == 0))
    targets.insert(0, ("every layout's loss curve equals one process's (relative 1e-5)",
                       f"largest relative difference {worst:.1e}", worst <= 1e-5))
    return targets
