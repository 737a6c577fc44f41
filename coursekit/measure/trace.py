"""Timelines: what each rank did, and when, on one clock shared by all ranks.

A :class:`Tracer` records *spans* -- ``(rank, kind, name, start, end)`` -- of
the kinds ``forward``, ``backward``, ``weight`` (a split backward's weight-gradient
half, W in a zero-bubble pipeline), ``comm`` (issued -> completed), ``optimizer``
and ``idle`` (waiting for communication). Times are seconds since an origin
that every rank agrees on, so the spans of different ranks can be drawn on one
Gantt chart (:mod:`coursekit.viz.timeline`).

    >>> tracer = Tracer().start()                 # inside a rank: a barrier, then the shared origin
    >>> with tracer.span("forward"):
    ...     output = model(inputs)
    >>> work = dist.all_reduce(grad, async_op=True)
    >>> tracer.comm(work, "bucket 0")             # issued now; completed when gloo finishes it
    >>> with tracer.span("idle", "wait"):
    ...     work.wait()
    ...     tracer.waited(work)                   # so the comm span ends by the time the wait does
    >>> spans = tracer.gather()                   # every rank's spans, on every rank

The shared clock
----------------
``time.perf_counter_ns`` is ``CLOCK_MONOTONIC`` on Linux: one clock for all
processes of a machine. ``start()`` runs a barrier and takes the *earliest*
post-barrier reading of any rank as time zero, so spans line up exactly
between ranks of one machine. (Ranks on different machines would need their
offsets estimated, e.g. by exchanging timestamps; this course runs on one.)

Asynchronous communication
--------------------------
An ``async_op=True`` collective returns at once; gloo runs it on its own
threads. ``comm(work)`` notes the issue time and asks the work's future to
note the completion time *when gloo finishes it* -- not when the rank gets
around to ``wait()``. That is what makes "how much communication hid behind
the backward pass" (:func:`hidden_fraction`) a measurement, not a guess.
"""

from __future__ import annotations

import threading
import time
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist

__all__ = ["Span", "Tracer", "span", "KINDS", "COMPUTE_KINDS", "union_length", "overlap_length", "subtract", "hidden_fraction", "busy_time", "intersection",
           "computing_together"]

KINDS = ("forward", "backward", "weight", "comm", "optimizer", "idle")
COMPUTE_KINDS = ("forward", "backward", "weight")  # a rank computing (W is backward work too)


@dataclass(frozen=True)
class Span:
    """One interval of one rank's time, in seconds since the shared origin."""

    rank: int
    kind: str
    name: str
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


class _Token:
    __slots__ = ("__weakref__",)


class _OnCompletion:
    """The Python that gloo's thread runs when a traced collective completes (see :meth:`Tracer.waited`)."""

    __slots__ = ("tracer", "key", "token", "__weakref__")

    def __init__(self, tracer: "Tracer", key: int):
        self.tracer, self.key, self.token = tracer, key, _Token()

    def __call__(self, future) -> "_Token":
        self.tracer._completed(self.key)
        return self.token  # held by the future then() returned, as long as the callback holds it


class Tracer:
    """Records spans for one rank. Cheap when ``enabled=False`` (every call is a no-op)."""

    def __init__(self, rank: int | None = None, enabled: bool = True):
        self.rank = rank if rank is not None else (dist.get_rank() if dist.is_initialized() else 0)
        self.enabled = enabled
        self.origin_ns = time.perf_counter_ns()
        self.spans: list[Span] = []
        self._lock = threading.Lock()  # completion callbacks run on gloo's threads
        self._pending: dict[int, tuple[str, float]] = {}  # async collectives issued, not yet seen complete
        self._callbacks: dict[int, Any] = {}  # their completion callbacks' futures, until waited() (see there)

    def start(self, group=None) -> "Tracer":
        """Barrier, then agree on time zero (the earliest rank's reading); forget earlier spans."""
        if dist.is_initialized():
            dist.barrier(group=group)
            stamp = torch.tensor([time.perf_counter_ns()], dtype=torch.int64)
            dist.all_reduce(stamp, op=dist.ReduceOp.MIN, group=group)
            self.origin_ns = int(stamp.item())
        else:
            self.origin_ns = time.perf_counter_ns()
        self.spans, self._pending, self._callbacks = [], {}, {}
        return self

    def now(self) -> float:
        """Seconds since the shared origin."""
        return (time.perf_counter_ns() - self.origin_ns) * 1e-9

    def add(self, kind: str, name: str, start: float, end: float) -> None:
        if not self.enabled:
            return
        if kind not in KINDS:
            raise ValueError(f"unknown span kind {kind!r}; use one of {KINDS}.")
        with self._lock:
            self.spans.append(Span(self.rank, kind, name, start, end))

    def collectives(self, records) -> None:
        """Each collective ``comm`` recorded (:class:`~coursekit.comm.traffic.Collective`) as a ``comm`` span and an
        ``idle`` one (the rank waits on it), named e.g. ``"all_reduce forward"``."""
        for c in records:
            start, end = (c.start_ns - self.origin_ns) * 1e-9, (c.end_ns - self.origin_ns) * 1e-9
            for kind in ("comm", "idle"):
                self.add(kind, f"{c.op} {c.direction}", start, end)

    @contextmanager
    def span(self, kind: str, name: str = "") -> Iterator[None]:
        """Record the time spent inside the ``with`` block as one span."""
        start = self.now()
        try:
            yield
        finally:
            self.add(kind, name, start, self.now())

    @contextmanager
    def blocking(self, name: str = "") -> Iterator[None]:
        """A *blocking* collective: a ``comm`` span, and the same interval as ``idle`` (the rank waits on it)."""
        start = self.now()
        try:
            yield
        finally:
            end = self.now()
            self.add("comm", name, start, end)
            self.add("idle", name, start, end)

    def comm(self, work, name: str = ""):
        """Record an async collective from now (issued) until gloo/NCCL completes it. Returns ``work``.

        The end is the earlier of two readings: gloo's completion callback, and
        :meth:`waited` right after ``work.wait()`` returns. The callback alone is
        not enough: it runs on gloo's thread and may run *after* ``wait()`` has
        returned, which would draw communication ending after the wait for it.
        """
        if not self.enabled or work is None:
            return work
        key, issued = id(work), self.now()  # the key: never keep work alive
        callback, released = _OnCompletion(self, key), threading.Event()
        watch = weakref.ref(callback.token, lambda _: released.set())  # see waited()
        callback_done = work.get_future().then(callback)
        del callback
        with self._lock:
            self._pending[key] = (name, issued)
            self._callbacks[key] = (callback_done, watch, released)
        return work

    def waited(self, work) -> None:
        """Say that ``work.wait()`` just returned: the collective is over by now, whenever its callback runs.

        Then wait until gloo's thread has let go of every Python object of ours. A rank that goes on to
        ``destroy_process_group()`` and exit while gloo's thread still needs the GIL -- for our callback, or
        only to free it -- dies: Python 3.11 ends a thread that asks for the GIL of an interpreter shutting
        down in a way gloo's C++ turns into ``terminate called without an active exception`` (SIGABRT; in
        fresh clones' ``make test``, tests/test_parallel_data_exit.py). Waiting for the callback to *run*
        is not enough: torch frees it afterwards, on gloo's thread, under the GIL, and the future ``then()``
        returned holds its result, which is freed under the GIL wherever that future's last reference
        goes. The callback returns its token, which it also holds, so the token dies with the later of
        the two; its weak reference's callback then sets ``released``, still under that GIL. After
        ``released.wait()`` gloo's thread has nothing of ours left to free.
        """
        if self.enabled and work is not None:
            self._completed(id(work))
            with self._lock:
                entry = self._callbacks.pop(id(work), None)
            if entry is not None:
                callback_done, watch, released = entry  # watch: a weak reference fires only while it lives
                del entry, callback_done  # ours of the future then() returned: it may be freed here or on gloo's thread
                released.wait()
                del watch

    def _completed(self, key: int) -> None:
        end = self.now()
        with self._lock:
            pending = self._pending.pop(key, None)  # the first of the two readings wins
            if pending is not None:
                self.spans.append(Span(self.rank, "comm", pending[0], pending[1], end))

    def gather(self, group=None) -> list[Span]:
        """All ranks' spans (a collective: every rank must call it), sorted by start time."""
        if not dist.is_initialized():
            return sorted(self.spans, key=lambda s: s.start)
        world = dist.get_world_size(group)
        everyone: list = [None] * world
        with self._lock:
            mine = list(self.spans)
        dist.all_gather_object(everyone, mine, group=group)
        return sorted((s for spans in everyone for s in spans), key=lambda s: s.start)


def span(tracer: Tracer | None, kind: str, name: str = "", waits: bool = False):
    """The one way an algorithm's wrapper draws a span: nothing without a ``tracer``; with ``waits`` the rank
    blocks in it (``comm`` and ``idle`` both, :meth:`Tracer.blocking`), else one span of ``kind``."""
    if tracer is None:
        return nullcontext()
    return tracer.blocking(name) if waits else tracer.span(kind, name)


# ----------------------------------------------------------------------- analysis
def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    return sum(b - a for a, b in _merge(intervals))


def overlap_length(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of time covered by both sets of intervals."""
    total = 0.0
    for s1, e1 in _merge(a):
        for s2, e2 in _merge(b):
            total += max(0.0, min(e1, e2) - max(s1, s2))
    return total


def subtract(intervals: list[tuple[float, float]], holes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of ``intervals`` not covered by ``holes``."""
    out = []
    holes = _merge(holes)
    for start, end in _merge(intervals):
        cursor = start
        for h_start, h_end in holes:
            if h_end <= cursor or h_start >= end:
                continue
            if h_start > cursor:
                out.append((cursor, h_start))
            cursor = max(cursor, h_end)
        if cursor < end:
            out.append((cursor, end))
    return out


def busy_time(spans: list[Span], kind: str, rank: int | None = None) -> float:
    """Time covered by spans of ``kind`` (on ``rank``, or summed over ranks)."""
    ranks = sorted({s.rank for s in spans}) if rank is None else [rank]
    return sum(union_length([(s.start, s.end) for s in spans if s.kind == kind and s.rank == r]) for r in ranks)


def hidden_fraction(spans: list[Span], rank: int | None = None,
                    behind: tuple[str, ...] = ("backward", "weight")) -> float:
    """Fraction of communication time that ran while the rank was computing (``behind`` kinds).

    0 means every byte moved while the rank waited; 1 means communication was
    entirely hidden behind the backward pass. Time inside a ``behind`` span
    during which the rank itself waited (``idle``, e.g. a blocking collective
    called from a backward hook) does not count as hiding anything. Averaged
    over ranks when ``rank`` is None. Returns NaN if there was no communication.
    """
    ranks = sorted({s.rank for s in spans}) if rank is None else [rank]
    fractions = []
    for r in ranks:
        comm = [(s.start, s.end) for s in spans if s.rank == r and s.kind == "comm"]
        compute = subtract([(s.start, s.end) for s in spans if s.rank == r and s.kind in behind],
                            [(s.start, s.end) for s in spans if s.rank == r and s.kind == "idle"])
        total = union_length(comm)
        if total > 0:
            fractions.append(overlap_length(comm, compute) / total)
    return sum(fractions) / len(fractions) if fractions else float("nan")


def intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The time covered by both sets of intervals, as merged intervals."""
    out = []
    for s1, e1 in _merge(a):
        for s2, e2 in _merge(b):
            if min(e1, e2) > max(s1, s2):
                out.append((max(s1, s2), min(e1, e2)))
    return _merge(out)


def computing_together(spans: list[Span], kinds: tuple[str, ...] = COMPUTE_KINDS) -> float:
    """Share of the passes during which *every* rank computes at once (P10's "GPUs work simultaneously").

    The window runs from the first ``kinds`` span's start to the last one's end, over all ranks. A rank
    computes while it is inside a ``kinds`` span and not inside an ``idle`` one: a wait counts as a wait
    whether it was booked inside a forward (a tensor-parallel all-reduce) or between spans (a model-parallel
    receive), so two strategies that book their waits differently compare fairly. NaN without such spans.
    """
    work = [s for s in spans if s.kind in kinds]
    if not work:
        return float("nan")
    start, end = min(s.start for s in work), max(s.end for s in work)
    together = None
    for r in sorted({s.rank for s in spans}):
        mine = subtract([(s.start, s.end) for s in work if s.rank == r],
                         [(s.start, s.end) for s in spans if s.rank == r and s.kind == "idle"])
        together = mine if together is None else intersection(together, mine)
    return union_length(together) / (end - start) if end > start else float("nan")
