"""Reading a merged profiler trace (:mod:`coursekit.measure.profile`): what a step's time went to, per rank.

Three questions, each answered from the events of one rank (times in µs, on the trace's clock):

* **Did the gradient all-reduces hide behind backward?** :func:`overlap_from_trace`: the share of their time,
  from issue on the main thread to the end of ``gloo:all_reduce`` on gloo's thread, that ran while the main
  thread was in backward (:func:`backward_windows`) -- chapter 02's overlap, stamped in C++.
* **How long did a rank wait?** :func:`idle_share`: the share of each step (:func:`step_windows`, from one
  optimizer step to the next) in which the main thread computed nothing (:func:`computing`, its ``aten::``
  ops): a pipeline's bubble and its waits for messages (a blocked receive is no op: it is a gap).
* **Which collectives sat on the critical path?** :func:`exposed_collectives`: the time gloo's threads ran
  collectives, and how much of it the main thread spent computing (its ``aten::`` ops). A tensor-parallel
  layer waits for its all-reduce: nearly none of it.

What the events are, and the clock: :mod:`coursekit.measure.profile`'s docstring.
"""

from __future__ import annotations

from .trace import intersection, overlap_length, union_length

__all__ = ["BACKWARD", "ISSUE", "EXECUTE", "OPTIMIZER", "main_thread", "backward_windows", "all_reduces",
           "gradient_all_reduces", "overlap_from_trace", "step_windows", "computing", "in_flight", "idle_share",
           "exposed_collectives"]

BACKWARD = "autograd::engine::evaluate_function"  # autograd's name for each backward node it runs
ISSUE, EXECUTE, OPTIMIZER = "c10d::allreduce_", "gloo:all_reduce", "Optimizer.step#"
GLOO = "gloo:"                                     # every collective gloo's threads run: gloo:all_reduce, ...


def _complete(trace: dict, rank: int) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("pid") == rank and e.get("ph") == "X"]


def main_thread(trace: dict, rank: int) -> int:
    """The thread where ``rank`` ran its steps: recorded by :func:`profiled`, else the one that ran backward."""
    tid = trace.get("coursekit", {}).get("main_tid", {}).get(str(rank))
    if tid is not None:
        return tid
    counts: dict[int, int] = {}
    for e in _complete(trace, rank):
        if e["name"].startswith(BACKWARD):
            counts[e["tid"]] = counts.get(e["tid"], 0) + 1
    if not counts:
        raise ValueError(f"rank {rank} has no backward event ({BACKWARD}...) in this trace.")
    return max(counts, key=counts.get)


def _top_level(events: list[dict]) -> list[dict]:
    """The events of one thread not nested inside another, in time order."""
    out, end = [], float("-inf")
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def backward_windows(trace: dict, rank: int) -> list[tuple[float, float]]:
    """Each backward pass of ``rank`` as (start, end) in µs: from the first backward node autograd ran to the
    end of the last one before the main thread did anything else.

    This is the course Tracer's ``backward`` span less its ``idle`` wait: the wait for the last buckets runs in
    a callback queued for the end of backward, after autograd's last node, so it falls outside the window.
    """
    main = main_thread(trace, rank)
    windows: list[list[float]] = []
    inside = False
    for e in _top_level([e for e in _complete(trace, rank) if e["tid"] == main]):
        if e["name"].startswith(BACKWARD):
            if inside:
                windows[-1][1] = e["ts"] + e["dur"]
            else:
                windows.append([e["ts"], e["ts"] + e["dur"]])
            inside = True
        else:
            inside = False
    return [(a, b) for a, b in windows]


def all_reduces(trace: dict, rank: int) -> list[tuple[float, float, float]]:
    """``rank``'s all-reduces as (issued, started, ended) in µs: issue on the main thread, the work on gloo's.

    The k-th issued is the k-th started (gloo's queue is first in, first out); a trace begun while one was in
    flight has them out of step, and is refused.
    """
    main = main_thread(trace, rank)
    events = _complete(trace, rank)
    issued = sorted(e["ts"] for e in events if e["name"] == ISSUE and e["tid"] == main)
    done = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == EXECUTE and e["tid"] != main)
    if len(issued) != len(done):
        raise ValueError(f"rank {rank}: {len(issued)} {ISSUE} issued but {len(done)} {EXECUTE} run on gloo's "
                         "threads; profile whole steps (profiled() starts after a barrier).")
    return [(i, start, end) for i, (start, end) in zip(issued, done)]


def gradient_all_reduces(trace: dict, rank: int) -> list[tuple[float, float, float]]:
    """The all-reduces issued from a backward pass on: from its first node until the optimiser's step (torch.optim
    marks it ``Optimizer.step#<Class>.step``) or the next backward. Buckets started in backward's hooks and those
    started after it (``overlap=False``) count; the loss's all-reduce after the step, and the Tracer's, do not."""
    main = main_thread(trace, rank)
    steps = sorted(e["ts"] for e in _complete(trace, rank) if e["tid"] == main and e["name"].startswith(OPTIMIZER))
    starts = [a for a, _ in backward_windows(trace, rank)]
    phases = []
    for k, start in enumerate(starts):
        limits = [t for t in steps if t > start] + starts[k + 1:k + 2]
        phases.append((start, min(limits, default=float("inf"))))
    return [r for r in all_reduces(trace, rank) if any(a <= r[0] < b for a, b in phases)]


def overlap_from_trace(trace: dict, rank: int, from_issue: bool = True) -> float:
    """Share of ``rank``'s gradient all-reduce time that ran while its main thread was in backward (0..1).

    An all-reduce is in flight from its issue to the end of its ``gloo:all_reduce`` (as the course's
    :meth:`~coursekit.measure.trace.Tracer.comm` draws it, so this agrees with
    :func:`~coursekit.measure.trace.hidden_fraction`); ``from_issue=False`` counts only the time a gloo thread
    worked on it. Backward: :func:`backward_windows`. NaN without gradient all-reduces.

    Where the two differ: the Tracer stamps issue and completion from Python, the completion in a callback on
    gloo's thread that needs the GIL and a core -- now and then milliseconds after gloo's own end. The profiler
    stamps both in C++, so this reading is the one without that lag (``python -m coursekit.bench trace``: within
    5 points of the Tracer's on a quiet machine).
    """
    flights = [(issued if from_issue else start, end) for issued, start, end in gradient_all_reduces(trace, rank)]
    total = union_length(flights)
    return overlap_length(flights, backward_windows(trace, rank)) / total if total > 0 else float("nan")


def step_windows(trace: dict, rank: int) -> list[tuple[float, float]]:
    """Each whole step of ``rank`` as (start, end) in µs: from the end of one optimizer step to the end of the next
    (torch.optim marks it ``Optimizer.step#<Class>.step``). The part before the first optimizer step is not a
    whole step (it began before the trace did, or with a warm-up): left out."""
    main = main_thread(trace, rank)
    ends = sorted(e["ts"] + e["dur"] for e in _complete(trace, rank)
                  if e["tid"] == main and e["name"].startswith(OPTIMIZER))
    return list(zip(ends, ends[1:]))


def computing(trace: dict, rank: int) -> list[tuple[float, float]]:
    """When ``rank``'s main thread computed (µs intervals): its ``aten::`` ops. Not the events around them --
    autograd's ``evaluate_function`` of a tensor-parallel layer's backward, or a Python autograd function's
    forward, also covers the wait for the all-reduce it issues -- and not ``gloo:send``/``gloo:recv``, which
    gloo draws on the main thread from post to completion."""
    main = main_thread(trace, rank)
    return [(e["ts"], e["ts"] + e["dur"]) for e in _complete(trace, rank)
            if e["tid"] == main and e["name"].startswith("aten::")]


def in_flight(trace: dict, rank: int) -> list[tuple[float, float]]:
    """When gloo had ``rank``'s collectives or messages in flight: every ``gloo:...`` event, on gloo's threads
    (collectives) or on the main thread (point-to-point)."""
    return [(e["ts"], e["ts"] + e["dur"]) for e in _complete(trace, rank) if e["name"].startswith(GLOO)]


def idle_share(trace: dict, rank: int) -> float:
    """Share of ``rank``'s whole steps (:func:`step_windows`) in which its main thread computed nothing
    (:func:`computing`): the time it waited, and the Python between its ops. On a pipeline's stage the waiting
    is the bubble and the waits for messages; on a tensor-parallel rank, its all-reduces. NaN without a whole
    step."""
    steps = step_windows(trace, rank)
    total = sum(b - a for a, b in steps)
    return 1 - overlap_length(computing(trace, rank), steps) / total if total > 0 else float("nan")


def exposed_collectives(trace: dict, rank: int) -> tuple[float, float, float]:
    """Over ``rank``'s whole steps: (µs of the steps, µs in which gloo had a collective or a message in flight
    -- a ``gloo:...`` event, on its threads or, for point-to-point, on the main thread --, µs of those in which
    the main thread also computed, ran an ``aten::`` op). The second less the third is communication on the
    critical path: nothing was computed while it ran."""
    steps = step_windows(trace, rank)
    inside = intersection(in_flight(trace, rank), steps)
    return sum(b - a for a, b in steps), union_length(inside), overlap_length(inside, computing(trace, rank))
