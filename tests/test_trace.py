"""Spans on a shared clock, async completions, and the overlap arithmetic."""

import math

import pytest
import torch
import torch.distributed as dist

import coursekit
from coursekit.measure.trace import Span, Tracer, busy_time, hidden_fraction, overlap_length, union_length


def test_span_records_and_rejects_unknown_kinds():
    tracer = Tracer(rank=0).start()
    with tracer.span("forward", "f"):
        torch.ones(10).sum()
    (span,) = tracer.spans
    assert (span.rank, span.kind, span.name) == (0, "forward", "f") and span.end >= span.start >= 0
    with pytest.raises(ValueError, match="unknown span kind"):
        tracer.add("lunch", "", 0.0, 1.0)
    quiet = Tracer(rank=0, enabled=False)
    with quiet.span("forward"):
        pass
    assert quiet.spans == []


def test_interval_arithmetic():
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert overlap_length([(0, 2), (4, 6)], [(1, 5)]) == 2
    spans = [Span(0, "backward", "", 0.0, 10.0), Span(0, "comm", "b0", 4.0, 8.0), Span(0, "comm", "b1", 9.0, 13.0),
             Span(1, "backward", "", 0.0, 10.0), Span(1, "comm", "all", 10.0, 14.0)]
    # rank 0: comm covers [4, 8] and [9, 13] = 8 s, of which 5 s inside backward
    assert hidden_fraction(spans, rank=0) == pytest.approx(5 / 8)
    assert hidden_fraction(spans, rank=1) == 0.0
    assert hidden_fraction(spans) == pytest.approx((5 / 8 + 0) / 2)
    assert busy_time(spans, "comm", 0) == 8 and busy_time(spans, "backward") == 20


def _ranks(rank, world_size):
    tracer = Tracer().start()
    origin = tracer.origin_ns
    with tracer.span("backward"):
        work = tracer.comm(dist.all_reduce(torch.ones(100_000), async_op=True), "grad")
        torch.randn(200, 200) @ torch.randn(200, 200)
    with tracer.span("idle", "wait"):
        work.wait()
        tracer.waited(work)
    dist.barrier()
    return origin, tracer.gather()


def test_ranks_share_one_origin_and_async_completion_is_recorded():
    results = coursekit.launch(_ranks, 2, timeout=120)
    origins = {origin for origin, _ in results}
    assert len(origins) == 1, "every rank must measure from the same time zero"
    spans = results[0][1]
    assert spans == results[1][1], "gather gives every rank the same picture"
    for rank in (0, 1):
        kinds = {s.kind: s for s in spans if s.rank == rank}
        assert set(kinds) == {"backward", "comm", "idle"}
        comm, backward, idle = kinds["comm"], kinds["backward"], kinds["idle"]
        # issued inside backward; completed no later than the wait returned
        assert backward.start <= comm.start <= backward.end
        assert comm.end <= idle.end


def test_waiting_inside_backward_hides_nothing():
    # a blocking collective called from a backward hook: comm and idle cover the same interval
    spans = [Span(0, "backward", "", 0.0, 10.0), Span(0, "comm", "gather", 2.0, 4.0), Span(0, "idle", "gather", 2.0, 4.0),
             Span(0, "comm", "async", 5.0, 7.0)]
    assert hidden_fraction(spans) == pytest.approx(2 / 4)
    tracer = Tracer(rank=0).start()
    with tracer.blocking("ring"):
        pass
    assert [s.kind for s in tracer.spans] == ["comm", "idle"]


class _LateCallbackWork:
    """A collective as gloo's thread completes it, late: it runs the completion callback only once the tracer has
    a span ended by ``waited()`` (or ``run_after`` s after ``then()``, if none comes), stores the result in the future
    ``then()`` returned (as torch's does), and lets go of the callback ``free_after`` s later (torch frees it after
    running it, on gloo's thread). Late by construction, not by a sleep: with a fixed 10 ms, a loaded machine
    (``make test`` at load 15) ran the main thread's ``waited()`` after the callback, and the test failed."""

    def __init__(self, tracer, run_after=2.0, free_after=0.02):
        self.tracer, self.run_after, self.free_after = tracer, run_after, free_after

    def get_future(self):
        return self

    def then(self, callback):
        import threading
        import time
        import weakref

        child = _Result()
        held = [callback, child]
        self.callback, self.child = weakref.ref(callback), weakref.ref(child)

        def gloo_thread():
            deadline = time.monotonic() + self.run_after
            while not self.tracer.spans and time.monotonic() < deadline:
                time.sleep(0.001)
            self.ran_at = self.tracer.now()
            held[1].set(held[0](None))
            time.sleep(self.free_after)
            held.clear()

        threading.Thread(target=gloo_thread, daemon=True).start()
        return child

    def wait(self):
        pass


class _Result:
    def __init__(self):
        import threading

        self.done, self.value = threading.Event(), None

    def set(self, value):
        self.value = value
        self.done.set()

    def wait(self):
        self.done.wait()
        return self.value


def test_a_late_completion_callback_cannot_end_comm_after_the_wait():
    """Planted bug: the comm span ends when gloo's callback runs, which can be after wait() returned."""
    tracer = Tracer(0)
    work = tracer.comm(_LateCallbackWork(tracer), "bucket 0")
    with tracer.span("idle", "wait"):
        tracer.waited(work)  # wait() returned; gloo's thread gets round to the callback only after
    comm, idle = sorted(tracer.spans, key=lambda s: s.kind)
    assert (comm.kind, idle.kind) == ("comm", "idle") and len(tracer.spans) == 2, "one comm span, not two"
    assert comm.end < work.ran_at, f"comm ends at {comm.end:.4f} s, when the callback ran, not when wait() returned"


def test_waited_returns_only_once_gloos_thread_has_let_go_of_the_callback():
    """After waited(), gloo's thread holds no Python object of the tracer's, so the rank may exit at once.

    A gloo thread that still has to free one (under the GIL) while the interpreter shuts down kills the rank:
    ``terminate called without an active exception`` (tests/test_parallel_data_exit.py, in fresh clones). Torch
    runs the callback, completes the future ``then()`` returned, and only then frees the callback: planted bug,
    seen failing, waiting for that future alone (the callback still held for 20 ms after waited() returned).
    """
    tracer = Tracer(0)
    work = tracer.comm(_LateCallbackWork(tracer), "bucket 0")
    tracer.waited(work)
    assert work.callback() is None, "waited() returned while gloo's thread still held the completion callback"
    assert work.child() is None, "the future then() returned outlives waited(): its result is freed under the GIL"


def test_waited_on_real_gloo_work_leaves_nothing_of_ours_on_its_thread(monkeypatch):
    """The same on gloo itself (a group of one in this process, 200 all-reduces): every completion callback
    freed by the time waited() returns, every completion recorded once."""
    import datetime
    import tempfile
    import weakref

    from coursekit.measure import trace

    callbacks = []

    class Recorded(trace._OnCompletion):
        __slots__ = ()

        def __init__(self, *args):
            super().__init__(*args)
            callbacks.append(weakref.ref(self))

    monkeypatch.setattr(trace, "_OnCompletion", Recorded)
    group = dist.ProcessGroupGloo(dist.FileStore(tempfile.mktemp(), 1), 0, 1, datetime.timedelta(seconds=30))
    tracer, alive = Tracer(0), 0
    for _ in range(200):
        work = tracer.comm(group.allreduce([torch.ones(1000)]), "all-reduce")
        work.wait()
        tracer.waited(work)
        alive += callbacks[-1]() is not None
    assert len(callbacks) == 200 and alive == 0, f"{alive} of 200 callbacks still held after waited() returned"
    assert len(tracer.spans) == 200 and all(s.kind == "comm" for s in tracer.spans)


def test_computing_together_counts_a_wait_as_a_wait_however_it_is_booked():
    """Two ranks, a window of 10: rank 0 computes 0-10, rank 1 computes 0-4 and 6-10 and waits 4-6. Booked as an
    idle span inside one forward span, or as a gap between two forward spans, the share both compute at once is
    0.8 either way (issue 26 §2: chapter 05's comparison must not depend on where a strategy books its waits).
    Planted bug, seen failing: idle spans inside a forward counted as computing (1.0 for the first booking)."""
    from coursekit.measure.trace import computing_together

    rank0 = [Span(0, "forward", "", 0.0, 10.0)]
    inside = rank0 + [Span(1, "forward", "", 0.0, 10.0), Span(1, "idle", "all-reduce", 4.0, 6.0)]
    between = rank0 + [Span(1, "forward", "", 0.0, 4.0), Span(1, "idle", "recv", 4.0, 6.0),
                       Span(1, "forward", "", 6.0, 10.0)]
    assert computing_together(inside) == pytest.approx(0.8)
    assert computing_together(between) == pytest.approx(0.8)
    chain = [Span(0, "forward", "", 0.0, 5.0), Span(1, "forward", "", 5.0, 10.0)]  # model parallelism's
    assert computing_together(chain) == 0.0
    assert math.isnan(computing_together([Span(0, "optimizer", "", 0.0, 1.0)]))


def test_a_weight_gradient_is_compute_and_can_hide_communication():
    """A zero-bubble pipeline's W is its own span kind, ``weight``, and it is backward work: rank 0 in a forward
    while rank 1 computes its W, both compute (share 1.0); a send under rank 1's W is hidden (1.0).

    Planted bug, seen failing: ``weight`` left out of the compute kinds (``computing_together``: 0.0 for 1.0)."""
    from coursekit.measure.trace import COMPUTE_KINDS, KINDS, computing_together

    assert "weight" in KINDS and "weight" in COMPUTE_KINDS
    spans = [Span(0, "forward", "F1@s0", 0.0, 2.0), Span(1, "weight", "W0@s1", 0.0, 2.0),
             Span(1, "comm", "SEND_B1@s1", 0.5, 1.5)]
    assert computing_together(spans) == pytest.approx(1.0)
    assert hidden_fraction(spans, rank=1) == pytest.approx(1.0)
