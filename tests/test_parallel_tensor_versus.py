"""P10's comparison (coursekit.experiments.tensor_versus_model): the three variants do the same work on the same model."""

import pytest

import coursekit
from coursekit.experiments import VARIANTS, step_times


def test_one_process_tensor_and_model_parallelism_compute_the_same_loss():
    """2 ranks, a small wide_mlp (4 blocks 16 -> 64 -> 16, 8 tokens): the loss of one process (rank 0), of tensor
    parallelism (both ranks) and of model parallelism (rank 1, after the activation crossed) agree to 1e-6, and
    every variant reports one time per iteration. Planted bug, seen failing: model parallelism running the first
    half of the blocks on both ranks (rank 1's loss differs)."""
    results = coursekit.launch(step_times, 2, 3, 8, 4, 16, 64)
    reference = results[0]["losses"]["one process"]
    assert results[1]["losses"]["one process"] is None
    for rank in (0, 1):
        assert results[rank]["losses"]["tensor parallel"] == pytest.approx(reference, rel=1e-6)
        assert all(len(results[rank][name]) == 3 for name in VARIANTS)
    assert results[0]["losses"]["model parallel"] is None
    assert results[1]["losses"]["model parallel"] == pytest.approx(reference, rel=1e-6)


def test_the_comparison_is_for_two_ranks():
    with pytest.raises(coursekit.RankError, match="runs on 2 ranks"):
        coursekit.launch(step_times, 3, 1, 8, 4, 16, 64)
