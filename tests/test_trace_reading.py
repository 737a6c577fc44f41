"""Reading where a step waited from a merged trace (coursekit/measure/trace_reading.py): by hand, and on real runs.

Hand-made traces of rank 0 (µs; main thread tid 1, gloo's thread tid 9) check each reading exactly; two real
runs (2 ranks, 4 steps under the profiler) check what no scheduler can turn around: a 1F1B pipeline at m = 1
leaves each rank waiting while the other computes, and a tensor-parallel rank computes nothing while gloo runs
its blocking all-reduces.

Seen failing, each planted in trace_reading.py and taken out:

* every main-thread event counted as computing (``startswith("aten::")`` dropped in ``computing``):
  test_idle_is_the_time_without_an_op fails ("idle 0.000, by hand 0.5": the ``evaluate_function`` wrapper that
  covers the all-reduce's wait, and gloo's ``gloo:recv`` drawn on the main thread, counted as work), and
  test_a_blocking_all_reduce_is_exposed (``(1000, 600, 250.0) == (1000, 600, 50)``: the receive computing beside
  itself);
* step windows from the optimizer's start, not its end (``e["ts"]`` for ``e["ts"] + e["dur"]``):
  test_steps_run_from_one_optimizer_step_to_the_next fails (``[(1000, 2000)] != [(1100, 2100)]``);
* collectives on gloo's threads only (``e["tid"] != main`` added to ``in_flight``): the point-to-point
  ``gloo:recv`` on the main thread is lost, test_a_blocking_all_reduce_is_exposed fails.
"""

import pytest

import coursekit
from coursekit.experiments.pipeline_sweep import balanced_mlp
from coursekit.measure.profile import merge_traces, profiled
from coursekit.measure.trace_reading import (OPTIMIZER, computing, exposed_collectives, idle_share, in_flight,
                                             step_windows)
from coursekit.models import TeacherData
from coursekit.train import train


def _event(name, ts, dur, tid=1):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid}


def _trace(*events):
    return {"traceEvents": list(events), "coursekit": {"main_tid": {"0": 1}}}


STEPPED = (_event(f"{OPTIMIZER}SGD.step", 1000, 100), _event(f"{OPTIMIZER}SGD.step", 2000, 100))


def test_steps_run_from_one_optimizer_step_to_the_next():
    """Two optimizer steps, 1000-1100 and 2000-2100: one whole step, 1100-2100 (before the first: not whole)."""
    assert step_windows(_trace(*STEPPED), 0) == [(1100, 2100)]
    assert step_windows(_trace(STEPPED[0]), 0) == []


def test_idle_is_the_time_without_an_op():
    """In the step 1100-2100 (1000 µs): ops at 1100-1300 and 1800-2100 (500 µs computing). Around the gap, a
    tensor-parallel backward node 1300-1800 whose wait is no op, and a receive in flight 1250-1800 drawn on the
    main thread: neither is computing. Idle 500 / 1000."""
    trace = _trace(*STEPPED, _event("aten::mm", 1100, 200), _event("autograd::engine::evaluate_function: X", 1300, 500),
                   _event("gloo:recv", 1250, 550), _event("aten::addmm", 1800, 200), _event("aten::add", 2000, 100))
    assert idle_share(trace, 0) == pytest.approx(0.5), f"idle {idle_share(trace, 0):.3f}, by hand 0.5"
    assert sorted(computing(trace, 0)) == [(1100, 1300), (1800, 2000), (2000, 2100)]


def test_a_blocking_all_reduce_is_exposed():
    """Gloo runs an all-reduce 1300-1700 on its thread and a receive is in flight 1650-1900 on the main thread:
    in flight 1300-1900, 600 µs; an op 1800-1850 computes beside 50 µs of it."""
    trace = _trace(*STEPPED, _event("gloo:all_reduce", 1300, 400, tid=9), _event("gloo:recv", 1650, 250),
                   _event("aten::mm", 1800, 50), _event("aten::mm", 1100, 200))
    assert exposed_collectives(trace, 0) == (1000, 600, 50)
    assert sorted(in_flight(trace, 0)) == [(1300, 1700), (1650, 1900)]


def _traced(rank, world_size, strategy, **options):
    with profiled() as recording:
        train(rank, world_size, strategy, steps=4, record=False, **options)
    return recording.trace


def test_a_pipeline_at_one_micro_batch_waits_while_the_other_stage_computes():
    """1F1B, p = 2, m = 1, two stages of equal cost: a rank can only compute its own half of each micro-batch's
    forward and backward, so it waits about half the step (the bubble: 50%; quiet, 0.50 and 0.48).

    Asserted is what no scheduler can change: with one micro-batch the two stages never compute at once (each
    waits for the other's result), so their waits add up to about a whole step. Asserted: more than 0.8 of one.
    Each rank's own share is not: a rank the machine takes off its core *while computing* draws a longer
    compute, and the other rank, waiting for it, a longer wait -- beside the test suite at load 15 one rank
    read 0.13 and the other 0.91 (the sum, 1.04, held). Planted, seen failing: both ranks computing at once
    (bucketed data parallelism traced instead; its all-reduces still wait) -> "the ranks waited [0.32..., 0.28...]
    of their steps, together expected about one step"."""
    trace = merge_traces(coursekit.launch(_traced, 2, "pipeline", micro_batches=1, model=balanced_mlp,
                                          data=TeacherData(1536, 1024), global_batch=64, optimizer="sgd"))
    shares = [idle_share(trace, rank) for rank in (0, 1)]
    assert sum(shares) > 0.8, f"the ranks waited {shares} of their steps, together expected about one step"


def test_tensor_parallel_all_reduces_are_on_the_critical_path():
    """The course transformer, tp = 2: its all-reduces block the layer that issues them, so the main thread
    computes beside less than a tenth of their time (the rest: timestamps of neighbouring ops)."""
    trace = merge_traces(coursekit.launch(_traced, 2, "tensor", model="transformer"))
    for rank in (0, 1):
        steps, flying, beside = exposed_collectives(trace, rank)
        assert flying > 0, f"rank {rank}: no collective in flight in {steps:.0f} µs of steps"
        assert beside < 0.1 * flying, f"rank {rank}: computed beside {beside:.0f} of {flying:.0f} µs in flight"
