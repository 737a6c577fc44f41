"""Benchmark the cost model: its predictions against this machine's runs, and the planner against brute force.

    python -m coursekit.bench costmodel [--steps 24] [--gpus 1024] [--quick] [--check]

1. **Predicted vs measured step time, 2 ranks of one thread** (:mod:`.steptime_runs`, one launch): a probe
   fitted once -- α and β of torch's all-reduce, the matmul rate, the copy bandwidth, the seconds of a
   dispatched op (:func:`~coursekit.measure.op_cost.op_overhead`: a stack of width-8 blocks, nothing else)
   -- then every run predicted from it alone and measured (median step, slowest rank):

   * the course transformer (``tiny_transformer()``: 104,832 parameters, fp32 Adam, ``--global-batch``
     sequences of 31 tokens): data (``"naive"``, torch's all-reduce, a call per parameter tensor), pipeline
     (1F1B, m = 4), tensor -- what chapter 08 compares; its bytes per rank against
     :func:`coursekit.costmodel.memory_per_gpu` too (Adam's 4-byte step counter per tensor is the only
     difference; tests/test_costmodel_memory_measured.py); time by :func:`coursekit.costmodel.step_time`;
   * the wide MLP of ``bench tensor`` (:mod:`coursekit.experiments.tensor_versus_model`: 4 blocks 1024 → 4096 →
     1024, 256 tokens): one process, tensor and model parallelism, by :func:`coursekit.costmodel.mlp_work`;
   * the MLP of ``bench pipeline`` (2 layers 1,024 wide, 256 samples, SGD) at p = 2: 1F1B at m = 1, 2, 4, 8
     and GPipe at m = 4.

   Target: every predicted / measured in [0.75, 1.25].

2. **plan against brute force** for a ``--gpus`` space (GPT-3 175 B, batch 1,536, A100s; ``--quick``: GPT-2
   small, its vocabulary padded so that tp can divide it, on 64 in Megatron-LM 2021's space): the same ranking, and both times.

``--quick`` (what tests/test_bench_costmodel.py runs): 4 steps, 3 message sizes, small probes and MLPs, the
64-GPU space.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from ..costmodel import (Collective, Hardware, Layout, ModelConfig, Space, Work, brute_force, bubble_fraction,
                         collective_seconds, memory_per_gpu, mlp_work, ops_of, optimizer_ops, parameter_tensors, plan,
                         streamed_and_accumulated,
                         step_time)
from ..launch import launch
from ..netsim import Network, calibrate
from .steptime_runs import COURSE_RUNS, NARROW, PIPELINE_RUNS, rank_runs

LAYOUTS = {"data": Layout(dp=2), "pipeline": Layout(pp=2, micro_batches=4), "tensor": Layout(tp=2)}
WARMUP = 2
TOLERANCE = 0.25
COURSE = ModelConfig.course()                               # the model's 64 positions: its bytes
GPT2_PADDED = ModelConfig(50304, 1024, 768, 12, 12, name="GPT-2 small, vocabulary padded to 50,304")
TOKENS = 31                                                 # each training sequence: 32 tokens, shifted by one
TIMED = ModelConfig(COURSE.vocab, TOKENS, COURSE.hidden, COURSE.layers, COURSE.heads, COURSE.tied, COURSE.qkv_bias,
                    "course transformer, 31 tokens")


def fitted_hardware(ranks: list[dict]) -> Hardware:
    """This machine as the cost model sees it, from the probe alone: 2 ranks on one "node", α and β of its
    all-reduce (the slower rank's time at each size), the medians of the two ranks' matmul rate, copy bandwidth
    and seconds per op; ``efficiency`` 1 (the rate is what a matmul reaches here)."""
    samples = [(n, max(r["samples"][i][1] for r in ranks)) for i, (n, _) in enumerate(ranks[0]["samples"])]
    network = calibrate(samples, "ring", world_size=2)
    median = lambda key: statistics.median(r[key] for r in ranks)  # noqa: E731
    return Hardware(memory=float("inf"), flops=median("flops"), efficiency=1.0, gpus_per_node=2,
                    intra_bandwidth=network.bandwidth, intra_latency=network.latency, bandwidth=network.bandwidth,
                    latency=network.latency, name="this machine, 2 ranks of one thread",
                    op_overhead=median("op_overhead"), memory_bandwidth=median("bandwidth"))


def alone(hardware: Hardware, ranks: list[dict]) -> Hardware:
    """The same machine when one rank computes at a time (the other waits): the probe's matmul rate alone."""
    return replace(hardware, flops=statistics.median(r["flops_alone"] for r in ranks),
                   name="this machine, one rank computing at a time")


def _slowest(per_rank: list[list[float]], skip: int) -> float:
    """The median step, each step's time the slower rank's."""
    return statistics.median(max(times[s] for times in per_rank) for s in range(skip, len(per_rank[0])))


def course_predictions(hardware: Hardware, global_batch: int) -> dict[str, tuple[float, str]]:
    """step_time of each course run: (seconds, its parts). Data's gradients go one tensor a call (``"naive"``)."""
    out = {}
    for label, layout in LAYOUTS.items():
        calls = parameter_tensors(TIMED) if label == "data" else 1
        t = step_time(TIMED, layout, hardware, global_batch, bytes_per_element=4, dp_calls=calls)
        out[label] = (t.total, f"{t.compute * 1e3:.1f} + {t.bubble * 1e3:.1f} + {t.exposed_communication * 1e3:.1f}")
    return out


def wide_predictions(hardware: Hardware, one_at_a_time: Hardware, options) -> dict[str, tuple[float, str]]:
    """The wide MLP's three variants (:func:`~coursekit.costmodel.mlp_work`; no optimizer, no loss to speak of):
    one process all of it; tensor parallelism half of the widths and 2 all-reduces a block, both ranks at once;
    model parallelism all of it in turn (each half waits for the other) and the activation sent forward, its
    gradient back. One process and model parallelism compute one rank at a time (``one_at_a_time``'s rate)."""
    w, rows, blocks = options.wide_width, options.wide_tokens, 4
    network = Network(hardware.bandwidth, hardware.latency)
    whole = mlp_work(rows, w, 4 * w, blocks).seconds(one_at_a_time)
    half = mlp_work(rows, w, 4 * w, blocks, tp=2).seconds(hardware)
    reduces = collective_seconds(Collective("tp", "all_reduce", 2, rows * w, 2 * blocks), network, 4)
    sends = collective_seconds(Collective("pp", "send", 2, rows * w, 2), network, 4)
    return {"one process": (whole, f"{whole * 1e3:.0f} + 0 + 0"),
            "tensor parallel": (half + reduces, f"{half * 1e3:.0f} + 0 + {reduces * 1e3:.1f}"),
            "model parallel": (whole + sends, f"{whole / 2 * 1e3:.0f} + {whole / 2 * 1e3:.0f} + {sends * 1e3:.1f}")}


def pipeline_predictions(hardware: Hardware, one_at_a_time: Hardware, options) -> dict[tuple[str, int], tuple[float, str]]:
    """bench pipeline's MLP at p = 2 (2 layers ``h × h``, GELU between, cross-entropy over ``h`` classes, SGD): the
    busier stage (the last: its input's gradient too, and the loss) per micro-batch, stretched by the schedule's
    bubble, its SGD step, and a send of each micro-batch's activation (or gradient). At m = 1 the two stages
    take turns: one rank computes at a time (``one_at_a_time``'s rate); from m = 2 on both at once, but for
    the bubble."""
    h, batch, network = options.pipeline_hidden, options.pipeline_batch, Network(hardware.bandwidth, hardware.latency)
    out = {}
    for schedule, m in PIPELINE_RUNS:
        rows = batch / m
        micro = Work(flops=6 * h * h * rows, ops=ops_of({"linear_2d": 1, "loss": 1}),
                     bytes=3 * 2 * h * rows * 4 + streamed_and_accumulated(h * h, 0, 1))
        accumulated = Work(bytes=streamed_and_accumulated(0, h * h + h, m)).seconds(hardware)
        sgd = Work(ops=optimizer_ops(2, "sgd"), bytes=(h * h + h) * 8 * 4).seconds(hardware)
        f = bubble_fraction(Layout(pp=2, micro_batches=m, schedule=schedule))
        compute = m * micro.seconds(one_at_a_time if m == 1 else hardware) + accumulated
        sends = collective_seconds(Collective("pp", "send", 2, rows * h, m), network, 4)
        bubble = compute * f / (1 - f)
        out[(schedule, m)] = (compute + sgd + bubble + sends,
                              f"{(compute + sgd) * 1e3:.1f} + {bubble * 1e3:.1f} + {sends * 1e3:.1f}")
    return out


def compute_dominated(run: str) -> bool:
    """Whether the model's ±25% is a target for ``run``: the wide MLPs' steps and the pipeline at m = 1, where
    compute is most of the step. The others carry the course's harness and gloo's stalls, which the model does not
    price: their ratio is reported beside the stalls, not checked (issue 46's restatement, issue 59)."""
    return run.startswith("wide MLP") or run == "pipeline MLP, 1f1b, m = 1"


def measured_vs_predicted(options) -> list[tuple[str, str, bool]]:
    sizes = [4 << 10, 256 << 10, 4 << 20] if options.quick else [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
    ranks = launch(rank_runs, 2, options, sizes, 5 if options.quick else 20, timeout=900)
    hardware = fitted_hardware(ranks)
    print(f"## 1. Predicted vs measured step time, 2 ranks of one thread\n\nLoad average (1, 5, 15 min) before "
          f"{_load(ranks[0]['load'][0])}, after {_load(ranks[0]['load'][1])}. Fitted once, by the probe alone: "
          f"α = {hardware.latency * 1e6:.0f} µs, B = {hardware.bandwidth / 1e9:.2f} GB/s (torch's all-reduce, "
          f"{len(sizes)} sizes), matmul {hardware.flops / 1e9:.1f} GFLOP/s with both ranks at once "
          f"({alone(hardware, ranks).flops / 1e9:.1f} alone), copy {hardware.memory_bandwidth / 1e9:.1f} "
          f"GB/s, {hardware.op_overhead * 1e6:.2f} µs an op ({ranks[0]['probe_ops']} ops a probe step)\n")
    course_bytes(ranks, options)
    rows = []
    for i, (label, _, _) in enumerate(COURSE_RUNS):
        measured = _slowest([r["course"][i]["step_times"] for r in ranks], WARMUP)
        rows.append((f"course transformer, {label}", measured, *course_predictions(hardware, options.global_batch)[label]))
    wide = wide_predictions(hardware, alone(hardware, ranks), options)
    for name, (seconds, parts) in wide.items():
        rows.append((f"wide MLP, {name}", _slowest([r["wide"][name] for r in ranks], 0), seconds, parts))
    piped = pipeline_predictions(hardware, alone(hardware, ranks), options)
    for i, key in enumerate(PIPELINE_RUNS):
        rows.append((f"pipeline MLP, {key[0]}, m = {key[1]}", _slowest([r["pipeline"][i] for r in ranks], WARMUP),
                     *piped[key]))
    print("\n| run | measured step | predicted (compute + bubble + exposed comm) | predicted / measured | "
          "measured − predicted |\n|---|---|---|---|---|")
    targets, reported = [], []
    for name, measured, predicted, parts in rows:
        ratio = predicted / measured
        print(f"| {name} | {measured * 1e3:.1f} ms | {predicted * 1e3:.1f} ms ({parts}) | {ratio:.2f} | "
              f"{(measured - predicted) * 1e3:+.1f} ms |")
        if compute_dominated(name):
            targets.append((f"{name}: step within ±{TOLERANCE:.0%} of measured",
                            f"predicted / measured = {ratio:.2f}", abs(ratio - 1) <= TOLERANCE))
        else:
            reported.append(f"{name} {ratio:.2f}")
    print(f"\nTargets only where compute dominates (the wide MLPs, the pipeline at m = 1; issues 46 and 59). "
          f"Reported, not targets: {'; '.join(reported)}: the course transformer on 2 ranks and the pipeline at "
          f"m >= 2 are made of what the model does not price (below).")
    narrow_table(ranks, hardware, options.global_batch)
    print("\nNot priced, where a run misses: the course's own harness around the model (train's loop, the "
          "strategies' hooks and records, the pipeline executor), and gloo's stalls while both ranks compute (a "
          "send that waits for the scheduler's next tick, 4 ms here: coursekit/comm/gloo_threads.py), which keep "
          "a pipeline's ranks waiting longer than (p − 1)/(m + p − 1) of the step. The probe is not refitted to "
          "the runs: a miss is reported, not tuned away (docs/benchmarks.md: three runs, and why).")
    return targets


def narrow_table(ranks: list[dict], hardware: Hardware, global_batch: int) -> None:
    """A diagnostic, not a target: each course run again at width 8. What the model prices shrinks with the
    widths; a step that does not is made of what it does not price."""
    narrow = replace(TIMED, hidden=NARROW, heads=2, name="course transformer, width 8")
    print(f"\n| course run (diagnostic) | measured, width 64 | measured, width {NARROW} | predicted, width 64 | "
          f"predicted, width {NARROW} |\n|---|---|---|---|---|")
    for i, (label, _, _) in enumerate(COURSE_RUNS):
        wide = _slowest([r["course"][i]["step_times"] for r in ranks], WARMUP)
        small = _slowest([r["course"][i]["narrow"] for r in ranks], WARMUP)
        calls = parameter_tensors(TIMED) if label == "data" else 1
        predicted = [step_time(c, LAYOUTS[label], hardware, global_batch, bytes_per_element=4, dp_calls=calls).total
                     for c in (TIMED, narrow)]
        print(f"| {label} | {wide * 1e3:.1f} ms | {small * 1e3:.1f} ms | {predicted[0] * 1e3:.1f} ms | "
              f"{predicted[1] * 1e3:.1f} ms |")


def _load(load) -> str:
    return " / ".join(f"{x:.2f}" for x in load)


def course_bytes(ranks: list[dict], options) -> None:
    """Parameters + gradients + optimizer state of rank 0, measured against memory_per_gpu (the course runs)."""
    print("| strategy | rank 0 params + grads + optimizer, measured | predicted |\n|---|---|---|")
    for i, (label, _, _) in enumerate(COURSE_RUNS):
        held = ranks[0]["course"][i]["memory"]
        states = held["params"] + held["grads"] + held["optimizer"]
        layout = LAYOUTS[label]
        micro = options.global_batch // (layout.dp * layout.micro_batches)
        model = memory_per_gpu(COURSE, layout, micro, precision="fp32", dropout=False)
        predicted = model.params + model.grads + model.optimizer
        print(f"| {label} | {states:,} B | {predicted:,} B ({predicted / states:.4f}) |")


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
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--wide-iters", type=int, default=5, help="iterations of the wide MLP's three variants")
    parser.add_argument("--wide-width", type=int, default=1024, help="the wide MLP's width (its hidden: 4×)")
    parser.add_argument("--wide-tokens", type=int, default=256)
    parser.add_argument("--pipeline-hidden", type=int, default=1024, help="bench pipeline's MLP: 2 layers this wide")
    parser.add_argument("--pipeline-batch", type=int, default=256)
    parser.add_argument("--quick", action="store_true",
                        help="CI-sized: 4 steps, 3 sizes, small probes and MLPs (width 128), a 64-GPU space")
    options = parser.parse_args(argv)
    if options.quick:
        options.steps, options.wide_iters = min(options.steps, 4), 2
        options.wide_width, options.pipeline_hidden, options.pipeline_batch = 128, 128, 64
    options.steps = max(options.steps, WARMUP + 1)
    return measured_vs_predicted(options) + planner_vs_brute_force(options)
