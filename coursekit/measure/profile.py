"""torch.profiler on every rank, merged into one trace that Perfetto (ui.perfetto.dev) or chrome://tracing opens.

    >>> def run(rank, world_size):
    ...     with profiled() as recording:                  # inside a rank: every rank profiles the same steps
    ...         train(rank, world_size, "bucketed", steps=4, record=False)
    ...     return recording.trace
    >>> trace = merge_traces(coursekit.launch(run, 2))     # one process per rank, on one clock
    >>> write_trace(trace, "steps.json.gz")                # drag it onto ui.perfetto.dev

What a trace answers is read by :mod:`coursekit.measure.trace_reading` (the share of the all-reduces hidden
behind backward, a pipeline's idle time, the collectives on the critical path).

What one rank's trace holds (torch 2.x, CPU, gloo) -- read off a real one
--------------------------------------------------------------------------
* The main thread (its ``tid`` is the process id): every op (``aten::linear`` ...), each backward node as
  ``autograd::engine::evaluate_function: <Node>``, the optimiser as ``Optimizer.step#Adam.step``, and each
  collective *issued* as ``c10d::allreduce_`` (a few tens of µs: it only queues the work; a bucket's hook
  issues it from inside ``evaluate_function: torch::autograd::AccumulateGrad``).
* gloo's worker threads (``pt_gloo_runloop``, two per process group): each collective *executed*, as
  ``gloo:all_reduce`` (``gloo:broadcast``, ``gloo:barrier`` ...), from when a worker takes it off gloo's queue
  to when it is done. gloo hands work out first in, first out, so the k-th ``c10d::allreduce_`` issued is the
  k-th ``gloo:all_reduce`` started.
* kineto's own bookkeeping, with string pids (``"Spans"``, ``"Traces"``): dropped when merging.

The clock
---------
torch's chrome export writes ``ts`` in µs since ``baseTimeNanoseconds`` (a field of the file), and that sum is
Unix time: each process converts its own op clock to CLOCK_REALTIME, one clock for every process of a
machine (HTA reads ``ts`` the same way: ``baseTimeNanoseconds + 1000 * ts``). So merging adds each rank's
``baseTimeNanoseconds`` back -- no estimate, no marker needed -- and then takes the earliest event as zero.
:func:`profiled` still puts every rank through a barrier and marks ``coursekit/start`` right after it, so a
reader sees where the ranks left it together; the tests check the alignment itself, by the fact that both
halves of one all-reduce overlap in time (neither rank can finish before the other has started).
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function


__all__ = ["MARKER", "Recording", "profiled", "merge_traces", "write_trace", "check_trace_events"]

MARKER = "coursekit/start"  # recorded on every rank right after a barrier: where the ranks left it together

# The phases of the trace-event format and the fields each one needs besides "ph" and "pid".
REQUIRED = {"X": ("name", "ts", "dur", "tid"), "B": ("name", "ts", "tid"), "E": ("ts", "tid"),
            "i": ("name", "ts"), "I": ("name", "ts"), "C": ("name", "ts", "args"), "M": ("name", "args"),
            "s": ("name", "ts", "id", "tid"), "t": ("name", "ts", "id", "tid"), "f": ("name", "ts", "id", "tid"),
            "b": ("name", "ts", "id"), "n": ("name", "ts", "id"), "e": ("name", "ts", "id")}


@dataclass
class Recording:
    """What :func:`profiled` hands out: ``trace`` (a JSON-able dict) is there once the ``with`` block has ended."""

    rank: int
    world_size: int
    trace: dict = field(default_factory=dict)


@contextmanager
def profiled(group=None, record_shapes: bool = False) -> Iterator[Recording]:
    """Profile the ``with`` block on this rank (``torch.profiler``, CPU ops); every rank of ``group`` must enter it.

    On exit ``recording.trace`` holds torch's chrome export, read back, with ``trace["coursekit"]``: this rank,
    the world size and the main thread's id (where the rank's own work runs, as opposed to gloo's threads).
    """
    rank, world = (dist.get_rank(group), dist.get_world_size(group)) if dist.is_initialized() else (0, 1)
    recording = Recording(rank, world)
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes)
    with _quiet_stderr():
        prof.__enter__()
    try:
        if dist.is_initialized():
            dist.barrier(group=group)
        with record_function(MARKER):
            pass
        yield recording
    finally:
        with _quiet_stderr():
            prof.__exit__(None, None, None)
    recording.trace = read_chrome_trace(prof)
    recording.trace["coursekit"] = {"rank": rank, "world_size": world, "main_tid": threading.get_native_id()}


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 while the profiler starts and stops: its C++ library logs a line for each
    (``USDT: ... profiler_start``), and in a forked rank an ``ERROR: External init callback ...`` that is harmless
    (the trace is complete): noise in a notebook's output, where each rank's lines are echoed."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def read_chrome_trace(prof: profile) -> dict:
    """torch writes its chrome trace only to a file: write it to a temporary one and read it back."""
    handle, path = tempfile.mkstemp(suffix=".json")
    os.close(handle)
    try:
        prof.export_chrome_trace(path)
        return json.loads(Path(path).read_text())
    finally:
        os.unlink(path)


# ----------------------------------------------------------------------- merge
def merge_traces(per_rank: list[dict]) -> dict:
    """One trace of every rank's: ``pid`` = rank (named ``"rank r"``), threads kept, one clock (see the module).

    Flow arrows (forward -> backward links) keep their ends within their rank: their ids are made unique per rank.
    """
    bases = [int(t.get("baseTimeNanoseconds", 0)) for t in per_rank]
    base = min(bases)
    events, main_tids = [], {}
    for index, (trace, rank_base) in enumerate(zip(per_rank, bases)):
        info = trace.get("coursekit", {})
        rank = int(info.get("rank", trace.get("distributedInfo", {}).get("rank", index)))
        main_tids[str(rank)] = info.get("main_tid")
        shift = (rank_base - base) / 1000  # µs: this rank's events on the earliest base
        events += [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
                   {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}}]
        for event in trace.get("traceEvents", []):
            moved = _onto_rank(event, rank, shift)
            if moved is not None:
                events.append(moved)
    origin = min((e["ts"] for e in events if "ts" in e), default=0.0)
    for e in events:
        if "ts" in e:
            e["ts"] = round(e["ts"] - origin, 3)  # µs since the first event of any rank; ns kept
    return {"traceEvents": events, "displayTimeUnit": "ms", "baseTimeNanoseconds": base + round(origin * 1000),
            "coursekit": {"ranks": sorted(int(r) for r in main_tids), "main_tid": main_tids,
                          "clock": "ts = unix time µs - baseTimeNanoseconds/1000, from each rank's own base"}}


def _onto_rank(event: dict, rank: int, shift: float) -> dict | None:
    """``event`` moved onto process ``rank`` and the shared base; None for what the merged trace leaves out."""
    if not isinstance(event.get("pid"), int) or isinstance(event.get("pid"), bool):
        return None  # kineto's bookkeeping ("Spans", "Traces", the record window): one per file, not per rank
    if event.get("ph") == "M" and event.get("name", "").startswith("process_"):
        return None  # the OS process's name and order: replaced by "rank r"
    moved = dict(event, pid=rank)
    if "ts" in moved:
        moved["ts"] = float(moved["ts"]) + shift
    if event.get("ph") in ("s", "t", "f") and isinstance(event.get("id"), int):
        moved["id"] = event["id"] + (rank << 32)  # each rank numbers its flows from 0
    return moved


def write_trace(trace: dict, path: str | os.PathLike) -> Path:
    """Write ``trace`` as JSON, gzipped when ``path`` ends in ``.gz`` (Perfetto and chrome://tracing open both)."""
    path = Path(path)
    text = json.dumps(trace)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as out:
            out.write(text)
    else:
        path.write_text(text)
    return path


# ----------------------------------------------------------------------- check
def check_trace_events(trace: dict) -> list[str]:
    """The problems of ``trace`` against the trace-event format, one sentence each (an empty list: none found).

    Checked: a ``traceEvents`` list of objects; a known ``ph``; the fields its phase needs; ``ts`` and ``dur``
    numbers >= 0 (µs); ``pid`` and ``tid`` integers (what one process per rank needs); ``process_name`` and
    ``thread_name`` metadata with ``args.name``.
    """
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        return ["the trace has no 'traceEvents' list"]
    problems = []
    for i, event in enumerate(events):
        label = event.get("name", "?") if isinstance(event, dict) else repr(event)
        problems += [f"event {i} ({label}): {p}" for p in _event_problems(event)]
    return problems


def _event_problems(event) -> list[str]:
    if not isinstance(event, dict):
        return ["not an object"]
    ph = event.get("ph")
    if ph is None:
        return ["no 'ph' (phase)"]
    if ph not in REQUIRED:
        return [f"unknown phase ph={ph!r} (known: {''.join(REQUIRED)})"]
    problems = [f"ph={ph!r} needs {name!r}" for name in ("pid", *REQUIRED[ph]) if name not in event]
    for name in ("ts", "dur"):
        value = event.get(name)
        if name in event and (not _is_number(value) or value < 0):
            problems.append(f"{name}={value!r} is not a number >= 0 (µs)")
    for name in ("pid", "tid"):
        if name in event and (not isinstance(event[name], int) or isinstance(event[name], bool)):
            problems.append(f"{name}={event[name]!r} is not an integer")
    if ph == "M" and event.get("name") in ("process_name", "thread_name") and "name" not in event.get("args", {}):
        problems.append(f"{event['name']} metadata needs args.name")
    return problems


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN
