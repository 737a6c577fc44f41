"""Benchmark pipeline schedules: step time and measured bubble against the formula; coursekit against PyTorch.

    python -m coursekit.bench pipeline [--p 2 4] [--m 1 2 4 8] [--hidden 1024] [--batch 256] [--steps 6] [--pairs 16]
                                       [--check]
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

After each world size's table, the winner by step time (what a run pays for) beside the smallest measured bubble.

Targets: coursekit's executor ≤ 1.2× torch.distributed.pipelining's step time (p = 2, same schedule). Where the
run has p = 2 and m = 8 (compute-dominated: this MLP, hidden 1024): ZB-H1's step ≤ 1F1B's, as the median of
paired per-step ratios -- the two schedules alternate step by step in ``--pairs`` rounds, so a slow spell of the
machine hits both -- and ZB-H1's B + W ≤ 1.1× 1F1B's unsplit B (measured mean times over the stages): the split costs one
backward, not two (:mod:`coursekit.parallel.pipeline.split_backward`).
Four ranks on two cores: each rank gets half a core while all four compute, and a whole one while the others
wait, so a rank's idle time in the bubble is partly given back to its neighbours. Step times at p = 4 measure
the scheduler as much as the schedule; the measured bubble is the rank's own view (its waits), not the cores'.

**P7, the m-sweep** (:mod:`coursekit.bench.pipeline_sweep`, :func:`coursekit.parallel.pipeline.pipeline_sweep`):
on an MLP of ``--sweep-layers`` layers ``--hidden`` wide, p = 2, ``--batch`` samples at every m in ``--sweep-m``,
1F1B and GPipe against one process running the same micro-batches (paired per iteration). Targets: 1F1B ≥ 85%
of the ideal 2m/(m+1) at m = 4 and 8; the measured bubble falls with m and is within 10 points of
(p−1)/(m+p−1) at m ≥ 4.
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
from .pipeline_sweep import add_sweep_arguments, sweep_section

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
        result = train(rank, world_size, strategy, model=lambda n=world_size * v: _model(options, n), data=TeacherData(options.hidden, options.hidden),
                       steps=options.warmup + options.steps, global_batch=options.batch, micro_batches=m,
                       schedule=name, stages_per_rank=v, optimizer="sgd", lr=1e-3, record=False,
                       trace=strategy == "pipeline")
        out.append({"step_times": result["step_times"][options.warmup:],
                    "spans": result["spans"] if rank == 0 else None})
    return out


ZB_PAIR = (2, 8)  # (p, m) of the ZB-H1 against 1F1B targets


def _model(options, n_layers):
    return tiny_mlp(d_in=options.hidden, d_hidden=options.hidden, d_out=options.hidden, n_layers=n_layers)


PER_ROUND = 1  # measured steps of each schedule in a round: one, so that the two steps of a pair are neighbours


def _alternate(rank, world_size, options, m: int, names=("1f1b", "zb_h1"), per_round: int = PER_ROUND):
    """Step times of ``names`` in ``options.pairs`` rounds, one after the other in each (one warm-up step each)."""
    times = {name: [] for name in names}
    for k in range(options.pairs):
        for name in (names if k % 2 == 0 else names[::-1]):  # neither always first
            result = train(rank, world_size, "pipeline", model=lambda: _model(options, world_size),
                           data=TeacherData(options.hidden, options.hidden), steps=1 + per_round,
                           global_batch=options.batch, micro_batches=m, schedule=name, optimizer="sgd", lr=1e-3,
                           record=False)
            times[name] += result["step_times"][1:]
    return times


def zb_targets(options, measured: dict) -> list[tuple[str, str, bool]]:
    """ZB-H1 against 1F1B at p = 2, m = 8: paired step times, and B + W against one backward (table's means)."""
    p, m = ZB_PAIR
    results = launch(_alternate, p, options, m, timeout=600)
    slowest = {name: [max(r[name][k] for r in results) for k in range(len(results[0][name]))]
               for name in results[0]}
    ratios = sorted(zb / base for zb, base in zip(slowest["zb_h1"], slowest["1f1b"]))
    median = statistics.median(ratios)
    zb, base = measured[(p, "zb_h1", m)]["times"], measured[(p, "1f1b", m)]["times"]
    split = (zb["B"] + zb["W"]) / base["B"]
    print(f"\nZB-H1 against 1F1B, p = {p}, m = {m}: {options.pairs} rounds of {PER_ROUND} step each, the two "
          f"alternating (after a warm-up step each); "
          f"step time (slowest rank, median) 1F1B {statistics.median(slowest['1f1b']) * 1e3:.1f} ms, ZB-H1 "
          f"{statistics.median(slowest['zb_h1']) * 1e3:.1f} ms; paired ratio ZB-H1 / 1F1B {median:.2f}× "
          f"[{ratios[0]:.2f}, {ratios[-1]:.2f}] over {len(ratios)} steps.\nZB-H1's T_B + T_W = "
          f"{zb['B'] * 1e3:.2f} + {zb['W'] * 1e3:.2f} ms against 1F1B's T_B {base['B'] * 1e3:.2f} ms "
          f"({split:.2f}×; means over the stages: stage 0's B has no input gradient to compute, its W is its "
          f"whole backward).")
    return [(f"ZB-H1's step ≤ 1F1B's (p = {p}, m = {m}, paired)",
             f"{median:.2f}× [{ratios[0]:.2f}, {ratios[-1]:.2f}]", median <= 1.0),
            (f"ZB-H1's B + W ≤ 1.1× 1F1B's backward (p = {p}, m = {m})", f"{split:.2f}×", split <= 1.1)]


def winners(table: dict) -> None:
    """Per (p, m): the fastest step beside the smallest measured bubble (they need not agree)."""
    for (p, m), rows in table.items():
        if len(rows) < 2:
            continue
        order = sorted(rows, key=lambda name: rows[name][0])
        fastest = ", ".join(f"{name} {rows[name][0] * 1e3:.1f} ms" for name in order)
        smallest = min(rows, key=lambda name: rows[name][1])
        print(f"p = {p}, m = {m}: winner by step time {order[0]} (fastest first: {fastest}); smallest measured "
              f"bubble {smallest} ({rows[smallest][1]:.0%})")


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
                       (s.kind in ("forward", "backward", "weight", "idle") or s.name.startswith("SEND"))),
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


def schedule_table(options) -> tuple[dict, dict, dict]:
    """Every schedule's step time beside its measured bubble, then the winner by step time, per (p, m).

    Returns coursekit's and torch's step times of the runs side by side, and each table row's :func:`analyse`.
    """
    print("| p | schedule | v | m | step time | measured bubble | plan (measured F/B/W) | formula | "
          "T_F / T_B / T_W | SEND (mean) | overhead / action |\n|---|---|---|---|---|---|---|---|---|---|---|")
    ours, theirs, analysed, table = {}, {}, {}, {}
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
            a = analysed[(p, name, m)] = analyse(results[0][i]["spans"], schedule, 0)
            table.setdefault((p, m), {})[name] = (step, a["bubble"])
            t = a["times"]
            fbw = " / ".join(f"{t[op] * 1e3:.1f}" if op in t else "—" for op in "FBW")
            print(f"| {p} | {name} | {v} | {m} | {step * 1e3:.1f} ms | {a['bubble']:.0%} | {a['plan']:.0%} | "
                  f"{float(bubble_formula(name, p, m, v)):.0%} | {fbw} ms | {a['send'] * 1e3:.2f} ms | "
                  f"{a['overhead'] * 1e6:.0f} µs |",
                  flush=True)
    print()
    winners(table)
    return ours, theirs, analysed


def main(argv: list[str]) -> list[tuple[str, str, bool]]:
    parser = argparse.ArgumentParser(prog="python -m coursekit.bench pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--p", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=16, help="rounds of ZB-H1 against 1F1B (p = 2, m = 8)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: p = 2, m = 2, hidden 64, 2 steps")
    options = add_sweep_arguments(parser).parse_args(argv)
    if options.quick:
        options.p, options.m, options.hidden, options.batch, options.steps, options.warmup = [2], [2], 64, 16, 2, 1
    print(f"MLP of p·v layers {options.hidden} × {options.hidden}, {options.batch} samples per step, SGD; "
          f"medians of {options.steps} steps after {options.warmup} warm-up\n")
    ours, theirs, analysed = schedule_table(options)
    print("\n| p | schedule | m | coursekit | torch.distributed.pipelining | ratio |\n|---|---|---|---|---|---|")
    targets = []
    for key, mine in ours.items():
        p, name, m = key
        ratio = mine / theirs[key]
        print(f"| {p} | {name} | {m} | {mine * 1e3:.1f} ms | {theirs[key] * 1e3:.1f} ms | {ratio:.2f}× |")
        if p == 2:
            targets.append((f"coursekit {name} ≤ 1.2× torch (p = 2, m = {m})", f"{ratio:.2f}×", ratio <= 1.2))
    if (ZB_PAIR[0], "zb_h1", ZB_PAIR[1]) in analysed:
        targets += zb_targets(options, analysed)
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
