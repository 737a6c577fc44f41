"""P7's m-sweep (coursekit.experiments.pipeline_sweep) at a tiny size: the baseline does the pipeline's work, the
formulas are the papers', the activation counts are the schedules'. No timing is asserted: only what was run.

Each test names the bug planted by hand (in coursekit/experiments/pipeline_sweep.py) to see it fail.
"""

from __future__ import annotations

import pytest

from coursekit.experiments import SWEEP_VARIANTS, SweepResult, in_flight_waits, paired, pipeline_sweep
from coursekit.measure.trace import Span

P, MS, BATCH, WIDTH, LAYERS = 2, (1, 2, 4), 8, 16, 4


@pytest.fixture(scope="module")
def result() -> SweepResult:
    return pipeline_sweep(MS, batch=BATCH, width=WIDTH, n_layers=LAYERS, iterations=2)


def test_the_same_work_baseline_runs_the_pipelines_micro_batches(result):
    """Its forwards are counted (m per step) and its gradients are 1F1B's.

    Planted bugs, seen failing: the baseline given the whole batch (``same_work`` ran ``[(inputs, targets)]``):
    'm=2: 1 forwards'; ``same_work_step`` zeroing the gradients before each micro-batch: 'gradient difference
    0.102 at m=2'."""
    for row in result.rows:
        assert row["baseline_forwards"] == row["m"], f"m={row['m']}: {row['baseline_forwards']} forwards"
        assert row["gradient_difference"] < 1e-6, f"gradient difference {row['gradient_difference']} at m={row['m']}"


def test_formulas_and_shapes(result):
    """One row per m; the ideal p·m/(m+p−1) and the bubble (p−1)/(m+p−1); every variant timed; ratios as
    (median, lowest, highest). Planted bug, seen failing: the bubble formula as (p−1)/m: 'm=1: 1.0 != 0.5'."""
    assert [row["m"] for row in result.rows] == list(MS)
    for row in result.rows:
        m = row["m"]
        assert row["bubble_formula"] == pytest.approx((P - 1) / (m + P - 1)), f"m={m}: {row['bubble_formula']}"
        assert row["ideal"] == pytest.approx(P * m / (m + P - 1)), f"m={m}: {row['ideal']}"
        assert sorted(row["step"]) == sorted(SWEEP_VARIANTS) and all(t > 0 for t in row["step"].values())
        for key in ("speedup_1f1b", "speedup_gpipe", "accumulation_cost"):
            median, low, high = row[key]
            assert 0 < low <= median <= high, (key, row[key])
        assert 0 <= row["bubble"] < 1, row["bubble"]
    assert result.p == P and result.config["width"] == WIDTH


def test_the_quietest_iteration_is_the_one_where_two_ranks_lost_least(result):
    """Its two-at-once ratio is the lowest of the iterations', its speed-up one of the paired ratios. Planted bug,
    seen failing: the busiest iteration picked (``max``): 'quietest 1.26 above the lowest 0.91'."""
    for row in result.rows:
        quiet, (_, low, high) = row["quietest"], row["speedup_1f1b"]
        assert quiet["both_cores"] == pytest.approx(row["both_cores"][1]), \
            f"quietest {quiet['both_cores']:.2f} above the lowest {row['both_cores'][1]:.2f}"
        assert low - 1e-12 <= quiet["speedup_1f1b"] <= high + 1e-12, (quiet, row["speedup_1f1b"])


def test_peak_activations_are_the_schedules(result):
    """Rank 0 (stage 0: layers 0 and 1, each Linear + GELU) saves 3 tensors of (batch/m) × width floats per
    micro-batch -- GELU 0's input, layer 1's input, GELU 1's input; layer 0's input is the batch, not counted.
    GPipe holds all m micro-batches, 1F1B at most p, recomputation none (it keeps only the input: the batch).

    Planted bug, seen failing: ``Recomputed`` returning ``self.stage(x)`` (no checkpoint): 'm=1: recomputed 1536 != 0'."""
    for row in result.rows:
        m = row["m"]
        per_micro_batch = (2 * (LAYERS // 2) - 1) * (BATCH // m) * WIDTH * 4
        peak = row["peak_activation_bytes"]
        assert peak["gpipe"][0] == m * per_micro_batch, f"m={m}: gpipe {peak['gpipe'][0]}"
        assert peak["1f1b"][0] == min(P, m) * per_micro_batch, f"m={m}: 1f1b {peak['1f1b'][0]}"
        assert peak["gpipe_recompute"][0] == 0, f"m={m}: recomputed {peak['gpipe_recompute'][0]} != 0"
        assert len(peak["1f1b"]) == P


def test_paired_ratios():
    """Per-iteration ratios, their median, lowest and highest. Planted bug, seen failing: the ratios not sorted
    (lowest and highest read from the first and last iteration): 'lowest 3.0, highest 2.0'."""
    median, low, high = paired([9.0, 2.0, 4.0], [3.0, 1.0, 2.0])  # ratios 3, 2, 2
    assert (median, low, high) == (2.0, 2.0, 3.0), f"lowest {low}, highest {high}"


def test_in_flight_waits_count_only_the_wait_after_the_send_began():
    """Rank 1 waits for activation 0 from t = 0 to 5, rank 0 sends it at t = 3: 2 in flight (3 waiting for the
    sender). Rank 0 waits for gradient 0 from 9 to 10, sent at 8 (before the wait): 1. A receive whose send is
    not in the trace counts nothing. Planted bug, seen failing: the whole wait counted ('6.0 != 3.0')."""
    spans = [Span(0, "comm", "SEND_F0@s0", 3.0, 3.1), Span(1, "idle", "RECV_F0@s1", 0.0, 5.0),
             Span(1, "comm", "RECV_F0@s1", 0.0, 5.0), Span(1, "comm", "SEND_B0@s1", 8.0, 8.1),
             Span(0, "idle", "RECV_B0@s0", 9.0, 10.0), Span(0, "idle", "RECV_B1@s0", 11.0, 12.0)]
    assert in_flight_waits(spans) == pytest.approx(3.0), f"{in_flight_waits(spans)} != 3.0"


def test_the_balanced_mlps_two_stages_do_the_same_arithmetic():
    """Counted, not timed: the FLOPs of forward + backward of each half (torch's FlopCounterMode), the first half
    from the data (no input gradient), the second from an activation that needs one. Planted bug, seen failing:
    the first layer as wide as the others (``d_in=width``): 'stage 0 does 0.833 of stage 1's' (5/6: 3k − 1 against 3k units, k = 2)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from coursekit.experiments import balanced_mlp
    from coursekit.parallel.pipeline import split

    width, rows = 32, 4
    model = balanced_mlp(width, n_layers=4)
    first, second = split(model, 2, layers_per_stage=[2, 2])
    flops = []
    for stage, x in ((first, torch.randn(rows, model.layers[0].in_features)),
                     (second, torch.randn(rows, width, requires_grad=True))):
        with FlopCounterMode(display=False) as counter:
            stage(x).sum().backward()
        flops.append(counter.get_total_flops())
    assert flops[0] == flops[1], f"stage 0 does {flops[0] / flops[1]:.3f} of stage 1's"
