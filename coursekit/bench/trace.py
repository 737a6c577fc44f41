"""Benchmark the two ways the course reads overlap: the profiler's trace against the course's own timeline.

    python -m coursekit.bench trace [--runs 8] [--steps 12] [--check]

Each run: 2 ranks train chapter 02's ``"bucketed"`` strategy with ``overlap=True`` on the course transformer
for ``--steps`` steps inside :func:`coursekit.measure.profile.profiled`, with the course's
:class:`~coursekit.measure.trace.Tracer` on. The same steps are then read twice:

* from the trace (:func:`~coursekit.measure.trace_reading.overlap_from_trace`): each gradient all-reduce from
  ``c10d::allreduce_`` on the main thread to the end of ``gloo:all_reduce`` on gloo's thread, both stamped in
  C++, against the backward passes;
* from the Tracer (:func:`~coursekit.measure.trace.hidden_fraction`, chapter 02's figure): the same from
  Python -- issue after ``dist.all_reduce`` returns, completion in a callback on gloo's thread.

Target (issue 46, item 1): in every run, the share hidden averaged over the two ranks (as chapter 02
averages it) agrees within 5 points. This is a benchmark, not a test, because the gap is timing: the
Tracer's callback needs the interpreter's lock *and* a core, so on a loaded 2-core machine it can stamp a
completion milliseconds after gloo's end (seen up to 8 ms beside two busy loops), and the two readings then
drift apart by up to 12 points. The trace is the reference; the Tracer is what a learner can afford in every
chapter.
"""

from __future__ import annotations

import argparse
import os

from ..launch import launch
from ..measure.profile import merge_traces, profiled
from ..measure.trace_reading import overlap_from_trace
from ..measure.trace import hidden_fraction
from ..train import train

POINTS = 5.0        # the agreement asked for, in percentage points


def traced_steps(rank, world_size, steps):
    """One rank's profiled steps: its trace and every rank's Tracer spans."""
    with profiled() as recording:
        result = train(rank, world_size, "bucketed", model="transformer", steps=steps, record=False, trace=True,
                       overlap=True)
    return recording.trace, result["spans"]


def one_run(steps: int) -> dict:
    """Both readings of one launch, per rank and averaged (fractions 0..1)."""
    per_rank = launch(traced_steps, 2, steps, timeout=300)
    trace, spans = merge_traces([t for t, _ in per_rank]), per_rank[0][1]
    read = {"trace": [overlap_from_trace(trace, r) for r in (0, 1)],
            "tracer": [hidden_fraction(spans, rank=r) for r in (0, 1)]}
    return {**read, "difference": 100 * (sum(read["tracer"]) - sum(read["trace"])) / 2}


def main(argv: list[str]) -> list[tuple[str, str, bool]]:
    parser = argparse.ArgumentParser(prog="python -m coursekit.bench trace")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.steps < 2:
        parser.error("--runs must be >= 1 and --steps >= 2 (the first step is a warm-up for neither reading)")
    print(f"load average before: {os.getloadavg()[0]:.2f}\n")
    print("| run | trace: rank 0, rank 1 | Tracer: rank 0, rank 1 | Tracer − trace, averaged |\n|---|---|---|---|")
    runs = []
    for k in range(args.runs):
        run = one_run(args.steps)
        runs.append(run)
        print(f"| {k + 1} | {run['trace'][0]:.0%}, {run['trace'][1]:.0%} | {run['tracer'][0]:.0%}, "
              f"{run['tracer'][1]:.0%} | {run['difference']:+.1f} points |", flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    worst = max((r["difference"] for r in runs), key=abs)
    return [(f"share hidden, trace against Tracer, within {POINTS:.0f} points in each of {args.runs} runs",
             f"largest {worst:+.1f} points", abs(worst) <= POINTS)]
