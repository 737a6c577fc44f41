"""Benchmark pipeline schedules: step time and measured bubble against the formula; coursekit against PyTorch.

    python -m coursekit.bench pipeline [--p 2 4] [--m 1 2 4 8] [--hidden 1024] [--batch 256] [--steps 6] [--check]
    python -m coursekit.bench pipeline --quick        # a smoke run: p = 2, m = 2, a small model

The model is an MLP of p·v equal ``hidden × hidden`` layers (one per stage, so the stages are balanced and the
formula's equal-stage assumption holds), trained by :func:`coursekit.train.train` with strategy ``"pipeline"``
and, on the same stages and micro-batches, ``"torch_pipeline"`` (``torch.distributed.pipelining``).

* **step time**: median over the measured steps (the first ``--warmup`` are not), slowest rank.
* **measured bubble**: from the executor's spans of each measured step: 1 − (time in F, B and W, summed over
  ranks) / (p × the window from the first compute action to the last on any rank), the plan's own window
  (:func:`coursekit.parallel.pipeline.measured_bubble`); median over steps.
* **plan**: the same schedule on the planner's clock (:func:`coursekit.parallel.pipeline.plan`) with the
  measured mean F, B and W times; **formula**: the papers' (GPipe and 1F1B (p−1)/(m+p−1), interleaved
  (p−1)/(v·m+p−1), ZB-H1's with T_F = T_B = T_W).
* **overhead / action**: per rank, the step's time not inside any action's span (the executor's own work
  between actions), divided by the number of actions; median.

Target: coursekit's executor ≤ 1.2× torch.distributed.pipelining's step time (p = 2, same schedule).
Four ranks on two cores: each rank gets half a core while all four compute, and a whole one while the others
wait, so a rank's idle time in the bubble is partly given back to its neighbours. Step times at p = 4 measure
the scheduler as much as the schedule; the measured bubble is the rank's own view (its waits), not the cores'.

**P7, the m-sweep** (:func:`sweep_section`, :func:`coursekit.parallel.pipeline.pipeline_sweep`): on an MLP of
``--sweep-layers`` layers ``--hidden`` wide, p = 2, ``--batch`` samples at every m in ``--sweep-m``, 1F1B and GPipe
against one process running the same micro-batches (paired per iteration). Targets: 1F1B ≥ 85% of the ideal
2m/(m+1) at m = 4 and 8; the measured bubble falls with m and is within 10 points of (p−1)/(m+p−1) at m ≥ 4.
A second table says where the rest of the ideal goes; a missed target prints why, in numbers.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from .. import comm
from ..launch import launch
from ..models import TeacherData, tiny_mlp
from ..parallel.pipeline import ACTION_NAME, bubble_formula, compute_op, make_schedule, measured_bubble, plan
from ..train import train

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb_h1", 1))
TORCH = ("gpipe", "1f1b", "interleaved")


def _rows(options) -> dict[int, list[tuple[str, str, int, int]]]:
    """Per world size, the runs: (strategy, schedule, m, v); schedules a generator refuses are left out."""
    rows: dict[int, list] = {}
    for p in options.p:
        for name, v in SCHEDULES:
            for m in options.m:
                try:
                    make_schedule(name, p, m, v)
                except ValueError:
                    continue  # e.g. ZB-H1 and interleaved need m >= p
                rows.setdefault(p, []).append(("pipeline", name, m, v))
        for name in TORCH:
            m = max(m for m in options.m if m >= p)  # torch's 1F1B needs m >= p
            v = 2 if name == "interleaved" else 1
            rows[p] += [("torch_pipeline", name, m, v), ("pipeline", name, m, v)]
    return rows


def _rank(rank, world_size, rows, options):
    out = []
    for strategy, name, m, v in rows:
        def model(n_layers=world_size * v):
            return tiny_mlp(d_in=options.hidden, d_hidden=options.hidden, d_out=options.hidden, n_layers=n_layers)
        result = train(rank, world_size, strategy, model=model, data=TeacherData(options.hidden, options.hidden),
                       steps=options.warmup + options.steps, global_batch=options.batch, micro_batches=m,
                       schedule=name, stages_per_rank=v, optimizer="sgd", lr=1e-3, record=False,
                       trace=strategy == "pipeline")
        out.append({"step_times": result["step_times"][options.warmup:],
                    "spans": result["spans"] if rank == 0 else None})
    return out


def _isend_probe(rank, world_size, numel: int, receiver_first: bool, repeats: int = 20) -> float | None:
    """Median time inside ``comm.isend`` on rank 0, with rank 1's receive posted before it (waiting) or after."""
    tensor, times = torch.zeros(numel), []
    for _ in range(repeats):
        dist.barrier()
        if rank == 0:
            time.sleep(0.005 if receiver_first else 0)
            begin = time.perf_counter()
            work = comm.isend(tensor, dst=1)
            times.append(time.perf_counter() - begin)
            work.wait()
        else:
            time.sleep(0 if receiver_first else 0.005)
            comm.recv(torch.empty(numel), src=0)
    return statistics.median(times) if rank == 0 else None


def _steps(spans, schedule, warmup: int):
    """The measured steps' action spans, per step, per rank (each rank runs its action list once a step)."""
    per_rank = {}
    for r, actions in enumerate(schedule.actions):
        mine = sorted((s for s in spans if s.rank == r and ACTION_NAME.match(s.name) and
                       (s.kind in ("forward", "backward", "idle") or s.name.startswith("SEND"))),
                      key=lambda s: s.start)
        n = len(actions)
        per_rank[r] = [mine[k * n:(k + 1) * n] for k in range(len(mine) // n)][warmup:]
    return [[per_rank[r][k] for r in per_rank] for k in range(min(len(v) for v in per_rank.values()))]


def analyse(spans, schedule, warmup: int) -> dict:
    """Measured bubble, mean F/B/W times, the plan's bubble with those times, executor overhead per action."""
    bubbles, overheads, sends, times = [], [], [], {"F": [], "B": [], "W": []}
    for step in _steps(spans, schedule, warmup):
        bubbles.append(measured_bubble([s for rank in step for s in rank]).bubble)
        for s in (s for rank in step for s in rank if compute_op(s)):
            times[compute_op(s)].append(s.duration)
        sends += [s.duration for rank in step for s in rank if s.name.startswith("SEND")]
        for rank in step:
            inside = sum(s.duration for s in rank)
            overheads.append((rank[-1].end - rank[0].start - inside) / len(rank))
    mean = {op: statistics.fmean(t) for op, t in times.items() if t}
    unit = mean["F"]  # the planner's clock in units of T_F; an unsplit B already holds the weight gradient
    planned = plan(schedule, {"W": 0, **{op: round(t / unit, 2) for op, t in mean.items()}})
    return {"bubble": statistics.median(bubbles), "plan": float(planned.bubble_fraction),
            "overhead": statistics.median(overheads), "times": mean, "send": statistics.fmean(sends) if sends else 0.0}


def main(argv: list[str]) -> list[tuple[str, str, bool]]:
    parser = argparse.ArgumentParser(prog="python -m coursekit.bench pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--p", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a smoke run: p = 2, m = 2, hidden 64, 2 steps")
    options = add_sweep_arguments(parser).parse_args(argv)
    if options.quick:
        options.p, options.m, options.hidden, options.batch, options.steps, options.warmup = [2], [2], 64, 16, 2, 1
    print(f"MLP of p·v layers {options.hidden} × {options.hidden}, {options.batch} samples per step, SGD; "
          f"medians of {options.steps} steps after {options.warmup} warm-up\n")
    print("| p | schedule | v | m | step time | measured bubble | plan (measured F/B/W) | formula | "
          "T_F / T_B / T_W | SEND (mean) | overhead / action |\n|---|---|---|---|---|---|---|---|---|---|---|")
    ours, theirs = {}, {}
    for p, rows in _rows(options).items():
        results = launch(_rank, p, rows, options, timeout=600)
        for i, (strategy, name, m, v) in enumerate(rows):
            step = statistics.median(max(r[i]["step_times"][k] for r in results) for k in range(options.steps))
            if strategy == "torch_pipeline":
                theirs[(p, name, m)] = step
                continue
            if (p, name, m) in theirs:  # the run beside torch's: same numbers as the table's row, measured again
                ours[(p, name, m)] = step
                continue
            schedule = make_schedule(name, p, m, v)
            a = analyse(results[0][i]["spans"], schedule, 0)
            t = a["times"]
            fbw = " / ".join(f"{t[op] * 1e3:.1f}" if op in t else "—" for op in "FBW")
            print(f"| {p} | {name} | {v} | {m} | {step * 1e3:.1f} ms | {a['bubble']:.0%} | {a['plan']:.0%} | "
                  f"{float(bubble_formula(name, p, m, v)):.0%} | {fbw} ms | {a['send'] * 1e3:.2f} ms | "
                  f"{a['overhead'] * 1e6:.0f} µs |",
                  flush=True)
    print("\n| p | schedule | m | coursekit | torch.distributed.pipelining | ratio |\n|---|---|---|---|---|---|")
    targets = []
    for key, mine in ours.items():
        p, name, m = key
        ratio = mine / theirs[key]
        print(f"| {p} | {name} | {m} | {mine * 1e3:.1f} ms | {theirs[key] * 1e3:.1f} ms | {ratio:.2f}× |")
        if p == 2:
            targets.append((f"coursekit {name} ≤ 1.2× torch (p = 2, m = {m})", f"{ratio:.2f}×", ratio <= 1.2))
    probe = {(numel, first): launch(_isend_probe, 2, numel, first, timeout=120)[0]
             for numel in (512, options.hidden * options.batch // 8) for first in (False, True)}
    print("\nThe formula counts compute only; the measured bubble also holds every wait for a message. One isend "
          "measured alone, 2 ranks, the receive posted after it or already waiting:\n\n| message | receiver not "
          "waiting yet | receiver already waiting |\n|---|---|---|")
    for numel in sorted({n for n, _ in probe}):
        alone, waiting = probe[(numel, False)], probe[(numel, True)]
        print(f"| {numel * 4 / 1024:g} KiB | {alone * 1e3:.2f} ms | {waiting * 1e3:.2f} ms |")
    print("\nThe SEND column above is the same call inside a step, where receivers wait by design and gloo's threads "
          "share 2 cores with the computing ranks. Where that is not small beside a micro-batch's compute, "
          "pipelining gains little: costly transfers, small model (seed claims P7, P10).")
    if any(p > 2 for p in options.p):
        print("\nOn 2 cores, p = 4 puts two ranks on each core: while all four compute each runs at half speed, "
              "and a rank waiting in the bubble gives its core to the others. Step times there measure the "
              "scheduler as much as the schedule; only p = 2 gives each rank a core.")
    return targets + sweep_section(options)


# --------------------------------------------------------------------------- P7: the m-sweep
SWEEP_TARGET_MS = (4, 8)   # speed-up ≥ 85% of the ideal at these m
SWEEP_BUBBLE_FROM = 4      # measured bubble within 10 points of the formula from this m on
SWEEP_WIDTH = 1024         # the targets hold where compute dominates: layers at least this wide


def add_sweep_arguments(parser):
    """The m-sweep's options (see :func:`sweep_section`); returns ``parser``."""
    parser.add_argument("--sweep-m", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="the m-sweep's m (P7)")
    parser.add_argument("--sweep-layers", type=int, default=8, help="layers of the m-sweep's MLP (--hidden wide)")
    parser.add_argument("--sweep-iters", type=int, default=7, help="paired iterations of the m-sweep")
    return parser


def sweep_table(result) -> str:
    """The sweep of :func:`~coursekit.parallel.pipeline.pipeline_sweep` as a markdown table, one row per m."""
    ms = lambda t: f"{t * 1e3:.0f} ms"  # noqa: E731
    x = lambda t: f"{t[0]:.2f}× [{t[1]:.2f}, {t[2]:.2f}]"  # noqa: E731
    mib = lambda b: "/".join(f"{v / 2**20:.1f}" for v in b)  # noqa: E731
    lines = ["| m | 1F1B | GPipe | one process, same m | one process, whole batch | accumulation cost | "
             "1F1B speed-up | GPipe speed-up | ideal 2m/(m+1) | 1F1B / ideal | bubble measured | formula | "
             "peak activations per rank (MiB): 1F1B | GPipe | GPipe recomputed (time) |",
             "|" + "---|" * 16]
    for row in result.rows:
        step, peak = row["step"], row["peak_activation_bytes"]
        recomputed = (f"{mib(peak['gpipe_recompute'])} ({ms(step['gpipe_recompute'])})"
                      if "gpipe_recompute" in peak else "—")
        lines.append(f"| {row['m']} | {ms(step['1f1b'])} | {ms(step['gpipe'])} | {ms(step['same_work'])} | "
                     f"{ms(step['whole_batch'])} | {x(row['accumulation_cost'])} | {x(row['speedup_1f1b'])} | "
                     f"{x(row['speedup_gpipe'])} | {row['ideal']:.2f}× | {row['speedup_1f1b'][0] / row['ideal']:.0%} | "
                     f"{row['bubble']:.1%} | {row['bubble_formula']:.1%} | {mib(peak['1f1b'])} | {mib(peak['gpipe'])} | "
                     f"{recomputed} |")
    return "\n".join(lines)


def sweep_gap_table(result) -> str:
    """Where 1F1B's speed-up goes, per m: speed-up = p · (1 − bubble) · (window / step) / (compute inflation)."""
    x = lambda t: f"{t[0]:.2f}× [{t[1]:.2f}, {t[2]:.2f}]"  # noqa: E731
    lines = ["| m | 1F1B speed-up | ideal | bubble − formula | of which messages in flight | compute inflation "
             "(F + B spans / one process) | window / step | two ranks computing at once / one alone | "
             "receives posted late / ahead | quietest iteration: 1F1B speed-up (two at once / one alone) |",
             "|" + "---|" * 10]
    for row in result.rows:
        lines.append(f"| {row['m']} | {x(row['speedup_1f1b'])} | {row['ideal']:.2f}× | "
                     f"{(row['bubble'] - row['bubble_formula']) * 100:+.1f} points | {row['in_flight'] * 100:.1f} points | "
                     f"{x(row['compute_inflation'])} | "
                     f"{row['window_share'][0]:.1%} | {x(row['both_cores'])} | {x(row['post_ahead_gain'])} | "
                     f"{row['quietest']['speedup_1f1b']:.2f}× ({row['quietest']['both_cores']:.2f}×) |")
    return "\n".join(lines)


def sweep_targets(result) -> list[tuple[str, str, bool]]:
    """The m-sweep's targets: 1F1B ≥ 85% of the ideal at m = 4 and 8 (those swept), the measured bubble falling
    with m, and within 10 percentage points of the formula from m = 4 on."""
    rows = {row["m"]: row for row in result.rows}
    targets = []
    for m in (m for m in SWEEP_TARGET_MS if m in rows):
        speedup, ideal = rows[m]["speedup_1f1b"], rows[m]["ideal"]
        targets.append((f"1F1B ≥ 85% of the ideal {ideal:.2f}× over one process with the same micro-batches "
                        f"(p = 2, m = {m})", f"{speedup[0]:.2f}× = {speedup[0] / ideal:.0%} [{speedup[1]:.2f}, "
                        f"{speedup[2]:.2f}]", speedup[0] >= 0.85 * ideal))
    bubbles = [rows[m]["bubble"] for m in sorted(rows)]
    targets.append(("measured bubble falls with m (p = 2, 1F1B)", " > ".join(f"{b:.1%}" for b in bubbles),
                    all(a > b for a, b in zip(bubbles, bubbles[1:]))))
    far = {m: rows[m]["bubble"] - rows[m]["bubble_formula"] for m in sorted(rows) if m >= SWEEP_BUBBLE_FROM}
    if far:
        targets.append((f"measured bubble within 10 points of (p−1)/(m+p−1) at m ≥ {SWEEP_BUBBLE_FROM}",
                        ", ".join(f"m = {m}: {d * 100:+.1f}" for m, d in far.items()),
                        all(abs(d) <= 0.10 for d in far.values())))
    return targets


def sweep_section(options) -> list[tuple[str, str, bool]]:
    """P7 measured (issue 29 §1): the m-sweep on the wide MLP, p = 2, its table, and its targets."""
    from ..parallel.pipeline import pipeline_sweep

    if options.quick:  # a smoke run: a 4-layer MLP of --hidden 64, m up to 4, 2 iterations
        options.sweep_m, options.sweep_layers, options.sweep_iters = [1, 2, 4], 4, 2
    result = pipeline_sweep(options.sweep_m, batch=options.batch, width=options.hidden,
                            n_layers=options.sweep_layers, iterations=options.sweep_iters)
    print(f"\nP7 measured: MLP of {options.sweep_layers} layers {options.hidden} wide (the first takes "
          f"{options.hidden * 3 // 2} features, so that both stages cost the same: balanced_mlp), "
          f"{options.batch} samples per step at every m, 2 ranks of one thread, forward + backward; median of "
          f"{options.sweep_iters} iterations, every variant back to back in each (speed-ups: paired ratios, "
          f"median [lowest, highest]); the one-process baseline on each rank's core in turn:\n")
    print(sweep_table(result))
    print("\nThe fair baseline runs the same micro-batches: the accumulation cost column is what smaller "
          "matrix products and m accumulations cost on one process, pipelining or not.\n\nWhere the rest of "
          "the ideal goes: speed-up = p · (1 − bubble) · (window / step) / (compute inflation). Compute "
          "inflation is the time the pipeline's F and B spans take, both ranks summed, over the same work on one "
          "process alone; two ranks computing at once (the same work on each) over one alone is what the "
          "machine's cores lose to each other, pipelining or not -- the ceiling is the ideal over it:\n")
    print(sweep_gap_table(result))
    if options.hidden < SWEEP_WIDTH:
        print(f"\n(The m-sweep's targets are measured on layers at least {SWEEP_WIDTH} wide, where compute "
              f"dominates; at {options.hidden} they would measure the transport, not the schedule.)")
        return []
    targets = sweep_targets(result)
    why_missed(result)
    return targets


def why_missed(result) -> None:
    """For each missed m-sweep target, what this machine measured that explains it."""
    rows = {row["m"]: row for row in result.rows}
    for m in (m for m in SWEEP_TARGET_MS if m in rows and rows[m]["speedup_1f1b"][0] < 0.85 * rows[m]["ideal"]):
        row = rows[m]
        print(f"\nm = {m}, 1F1B below 85% of its ideal: two ranks computing at once took {row['both_cores'][0]:.2f}× "
              f"the time of one alone (median), so this machine allowed at most {row['ideal']:.2f} / "
              f"{row['both_cores'][0]:.2f} = {row['ideal'] / row['both_cores'][0]:.2f}×; in the iteration where the "
              f"two lost least to each other ({row['quietest']['both_cores']:.2f}×) 1F1B measured "
              f"{row['quietest']['speedup_1f1b']:.2f}× = {row['quietest']['speedup_1f1b'] / row['ideal']:.0%} of "
              f"the ideal. Messages in flight cost {row['in_flight'] * 100:.1f} of the bubble's points.")
    for m in (m for m in rows if m >= SWEEP_BUBBLE_FROM and abs(rows[m]["bubble"] - rows[m]["bubble_formula"]) > 0.1):
        row = rows[m]
        print(f"\nm = {m}, bubble {row['bubble']:.1%} against the formula's {row['bubble_formula']:.1%}: "
              f"{row['in_flight'] * 100:.1f} points waiting for messages already sent (a gloo thread needs a core "
              f"while both ranks compute); the other {(row['bubble'] - row['bubble_formula'] - row['in_flight']) * 100:.1f} "
              f"waiting for a neighbour slower than planned (any other load on the machine slows one rank and "
              f"stalls the other; the stages are balanced only to a few percent).")
