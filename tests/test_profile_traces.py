"""Profiler traces of every rank, merged into one (coursekit.measure.profile) and read (.trace_reading), on 2 real ranks.

One launch (module fixture): 2 ranks train chapter 02's ``"bucketed"`` strategy with ``overlap=True`` on the
course transformer (backward a few ms) for 6 steps inside :func:`profiled`, with the course's own Tracer on.

Each check was seen to fail, with a bug planted in ``coursekit/measure/profile.py`` or ``trace_reading.py``:

* every rank on pid 0 (``moved = dict(event, pid=0)`` in ``_onto_rank``): ``test_one_process_per_rank`` fails
  with ``rank 0 has 2 coursekit/start markers, expected 1`` (and the two tests after it: ``rank 0: 43
  c10d::allreduce_ issued but 86 gloo:all_reduce run on gloo's threads``);
* one rank shifted by 1 s (``shift = ... + 1e6 * rank``): ``test_ranks_share_one_clock`` fails with
  ``all-reduce 0: rank 0 ran 17001.2..17149.5 µs, rank 1 ran 1017120.2..1017158.9 µs: they do not overlap``;
* overlap read over the whole step, not backward (``backward_windows`` returning one window from the first to
  the last event of the main thread): ``test_overlap_is_read_from_backward_and_the_gradient_all_reduces`` fails
  with ``assert [(100, 605)] == [(100, 400)]`` (the window ran to the last event of the step).

The 5-point band: both read the same phases (backward less the wait at its end; gradient all-reduces from issue
to completion), but the Tracer stamps an all-reduce's issue and completion from Python (after
``dist.all_reduce`` returns; in a callback on gloo's thread, which needs the GIL and a core), the profiler from
C++. Measured on one clock (2026-12-07): the Tracer's completion is usually within 0.1 ms of gloo's end, now
and then 1-6 ms late, up to 8 ms beside two busy loops. Averaged over the ranks (chapter 02's figure) the two
agree within 3 points in 32 runs on a quiet machine and drift up to 12 points on a loaded one, so the
agreement is a benchmark target (``python -m coursekit.bench trace --check``: within 5 points in each of 8
runs), not a test; here the trace's reading is checked exactly on a hand-made trace.
"""

from __future__ import annotations

import gzip
import json

import pytest

import coursekit
from coursekit.measure.profile import MARKER, check_trace_events, merge_traces, profiled, write_trace
from coursekit.measure.trace_reading import (BACKWARD, EXECUTE, ISSUE, OPTIMIZER, all_reduces, backward_windows,
                                             overlap_from_trace)
from coursekit.measure.trace import hidden_fraction
from coursekit.train import train

STEPS = 6


def _profiled_steps(rank, world_size):
    with profiled() as recording:
        result = train(rank, world_size, "bucketed", model="transformer", steps=STEPS, record=False, trace=True,
                       overlap=True)
    return recording.trace, result["spans"]


@pytest.fixture(scope="module")
def run():
    per_rank = coursekit.launch(_profiled_steps, 2)
    return merge_traces([trace for trace, _ in per_rank]), per_rank[0][1]


def test_merged_trace_is_valid_and_round_trips(run, tmp_path):
    trace, _ = run
    assert check_trace_events(trace) == []
    assert json.loads(json.dumps(trace)) == trace
    write_trace(trace, tmp_path / "t.json.gz")
    with gzip.open(tmp_path / "t.json.gz", "rt") as f:
        assert json.load(f) == trace


def test_one_process_per_rank(run):
    trace, _ = run
    events = trace["traceEvents"]
    pids = sorted({e["pid"] for e in events})
    assert pids == [0, 1], f"processes {pids} in the trace, expected [0, 1]"
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    assert [sum(e["pid"] == r and e["ph"] == "M" and e["name"] == "process_name" for e in events)
            for r in (0, 1)] == [1, 1], "one process_name per rank"
    for rank in (0, 1):
        mine = [e for e in events if e["pid"] == rank and e["ph"] == "X"]
        markers = sum(e["name"] == MARKER for e in mine)
        assert markers == 1, f"rank {rank} has {markers} {MARKER} markers, expected 1"
        gloo_threads = {e["tid"] for e in mine if e["name"].startswith("gloo:")}
        assert gloo_threads and trace["coursekit"]["main_tid"][str(rank)] not in gloo_threads, \
            f"rank {rank}: gloo's work should sit on its own threads"


def test_ranks_share_one_clock(run):
    """Both halves of one all-reduce overlap in time: neither rank can finish before the other has started."""
    trace, _ = run
    mine, theirs = all_reduces(trace, 0), all_reduces(trace, 1)
    assert len(mine) == len(theirs) > STEPS
    tolerance = 50.0  # µs: each process converts its op clock to Unix time on its own
    for k, ((_, s0, e0), (_, s1, e1)) in enumerate(zip(mine, theirs)):
        assert max(s0, s1) < min(e0, e1) + tolerance, (
            f"all-reduce {k}: rank 0 ran {s0:.1f}..{e0:.1f} µs, rank 1 ran {s1:.1f}..{e1:.1f} µs: "
            "they do not overlap")


def _event(name, ts, dur, tid=1):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid}


def test_overlap_is_read_from_backward_and_the_gradient_all_reduces():
    """A hand-made trace of one step on rank 0 (µs): backward nodes 100-300 and 300-400 on the main thread (tid 1);
    two gradient all-reduces issued at 200 and 350, run by gloo (tid 9) until 380 and 500; the optimiser at 520;
    then the loss's all-reduce at 600-650, which is not a gradient's. Communication from issue to end: 200-380
    and 350-500, together 200-500, 300 µs (time with two in flight counts once); inside backward (100-400):
    200-400, so 200 / 300 hidden."""
    events = [_event(f"{BACKWARD}: MmBackward0", 100, 200), _event(f"{BACKWARD}: AddBackward0", 300, 100),
              _event(ISSUE, 200, 5), _event(ISSUE, 350, 5), _event(EXECUTE, 210, 170, tid=9),
              _event(EXECUTE, 360, 140, tid=9), _event(f"{OPTIMIZER}Adam.step", 520, 30),
              _event(ISSUE, 600, 5), _event(EXECUTE, 605, 45, tid=9)]
    trace = {"traceEvents": events, "coursekit": {"main_tid": {"0": 1}}}
    assert backward_windows(trace, 0) == [(100, 400)]
    assert overlap_from_trace(trace, 0) == pytest.approx(200 / 300), \
        f"read {overlap_from_trace(trace, 0):.3f} hidden, by hand 200 / 300 = {200 / 300:.3f}"


def test_the_real_run_reads_a_share_and_agrees_with_the_tracer_on_its_sign(run):
    """On the real run the share is a fraction, and where the course's Tracer sees communication hidden so does
    the trace. (Within 5 points is ``python -m coursekit.bench trace``'s target, not a test: the Tracer's
    completion callback waits for the GIL and a core, so on a loaded machine the two drift apart; see the
    module's docstring.)"""
    trace, spans = run
    for rank in (0, 1):
        share = overlap_from_trace(trace, rank)
        assert 0.0 <= share <= 1.0, f"rank {rank}: {share}"
        assert (share > 0) == (hidden_fraction(spans, rank=rank) > 0), (rank, share, hidden_fraction(spans, rank=rank))


def test_a_bad_trace_names_its_problems():
    bad = {"traceEvents": [
        {"name": "no phase", "ts": 1, "pid": 0, "tid": 0},
        {"ph": "X", "name": "negative", "ts": 5, "dur": -2, "pid": 0, "tid": 0},
        {"ph": "X", "name": "string pid", "ts": 5, "dur": 2, "pid": "rank 0", "tid": 0},
        {"ph": "Q", "name": "unknown phase", "ts": 5, "pid": 0, "tid": 0},
        {"ph": "X", "name": "no dur", "ts": 5, "pid": 0, "tid": 0},
        {"ph": "M", "name": "process_name", "pid": 0, "args": {}},
    ]}
    problems = check_trace_events(bad)
    assert problems == ["event 0 (no phase): no 'ph' (phase)",
                        "event 1 (negative): dur=-2 is not a number >= 0 (µs)",
                        "event 2 (string pid): pid='rank 0' is not an integer",
                        "event 3 (unknown phase): unknown phase ph='Q' (known: XBEiICMstfbne)",
                        "event 4 (no dur): ph='X' needs 'dur'",
                        "event 5 (process_name): process_name metadata needs args.name"]
    assert check_trace_events({"events": []}) == ["the trace has no 'traceEvents' list"]
