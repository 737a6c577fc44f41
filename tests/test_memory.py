"""Memory formulas and the storage counter."""

import pytest
import torch

from coursekit.measure.memory import (PeakMemory, comm_elements, expected_held_bytes, formula_bytes, held_bytes,
                              max_parameters, shard_elements)


def test_held_bytes_counts_storage_once_and_freed_storage_as_zero():
    flat = torch.zeros(100)
    assert held_bytes([flat, flat[:10], flat[50:].view(5, 10)]) == 400
    seen: set = set()
    assert held_bytes([flat], seen) == 400 and held_bytes([flat[3:]], seen) == 0  # already counted elsewhere
    assert held_bytes([torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.bfloat16)]) == 24 + 6
    flat.untyped_storage().resize_(0)
    assert held_bytes([flat]) == 0


def test_formulas_of_the_zero_paper():
    psi, n = 7_500_000_000, 64  # the paper's 7.5B model on 64 GPUs, mixed precision
    dp = formula_bytes(psi, n, 0, "mixed")
    assert sum(dp.values()) == 16 * psi == 120e9
    assert sum(formula_bytes(psi, n, 1, "mixed").values()) == pytest.approx(31.4e9, rel=1e-2)
    assert sum(formula_bytes(psi, n, 2, "mixed").values()) == pytest.approx(16.6e9, rel=1e-2)
    assert sum(formula_bytes(psi, n, 3, "mixed").values()) == pytest.approx(1.88e9, rel=1e-2)
    assert formula_bytes(1000, 4, 2) == {"params": 4000, "grads": 1000, "optimizer": 2000}


def test_exact_expectations_and_traffic():
    assert expected_held_bytes(10, 2, 1, 0, 0) == {"params": 40, "grads": 40, "optimizer": 88}
    # 10 elements on 4 ranks: segments 3, 3, 2, 2; rank 0 owns segment 1
    assert expected_held_bytes(10, 2, 4, 0, 3) == {"params": 12, "grads": 12, "optimizer": 28}
    assert expected_held_bytes(10, 2, 4, 2, 1) == {"params": 40, "grads": 40, "optimizer": 20}
    assert comm_elements(100, 4, 0) == comm_elements(100, 4, 2) == 600 and comm_elements(100, 4, 3) == 900


def test_largest_model_that_fits():
    assert max_parameters(80e9, 1, 0, "mixed") == 5e9
    assert max_parameters(80e9, 8, 3, "mixed") == pytest.approx(40e9)
    with pytest.raises(ValueError, match="stage"):
        max_parameters(1e9, 2, 5)
    with pytest.raises(ValueError, match="precision"):
        formula_bytes(10, 2, 1, "fp8")


def test_a_shard_is_one_ring_segment_per_bucket():
    """10 elements in buckets of 6 and 4 on 4 ranks: rank r keeps segment (r + 1) % 4 of each.

    Seen failing with the planted bug "one segment of the whole buffer, whatever the buckets"
    (``sizes = [numel]`` always): [3] != [2, 1].
    """
    # segment_bounds(6, 4) = 2, 2, 1, 1 elements; (4, 4) = 1 each; rank 0 owns segment 1, rank 2 segment 3
    assert shard_elements(10, 4, 0, [6, 4]) == [2, 1]
    assert shard_elements(10, 4, 2, [6, 4]) == [1, 1]
    assert expected_held_bytes(10, 2, 4, 2, 2, [6, 4]) == {"params": 40, "grads": 8, "optimizer": 16 + 8}
    with pytest.raises(ValueError, match="add up to 9"):
        shard_elements(10, 4, 0, [5, 4])


def test_peak_memory_keeps_the_largest_moment():
    """Seen failing with the planted bug "the last moment, not the largest" (``by_kind[kind] = nbytes``)."""
    peak = PeakMemory()
    big, small = torch.zeros(100), torch.zeros(10)
    peak.note({"grads": [big], "params": [small]})
    peak.note({"grads": [], "params": [small, big[:5]]})  # a view of big: its whole storage counts
    assert peak.by_kind == {"grads": 400, "params": 440} and peak.total == 440
