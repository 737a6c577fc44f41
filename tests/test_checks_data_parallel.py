"""Exercise 02's grader: the solution gets full marks, the stub zero, typical mistakes what they deserve.
(More wrong attempts, each with its expected score: tests/test_grading_submissions.py.)"""

import sys
from pathlib import Path

import torch

from coursekit import comm
from coursekit.checks.data_parallel import check_data_parallel
from coursekit.collectives import ring_all_reduce

sys.path.insert(0, str(Path(__file__).resolve().parent / "submissions"))
from _solutions import attach_gradient_averaging, reduce_scatter_gradients  # noqa: E402
from dp_sum_not_mean import attach_gradient_averaging as summing_hooks  # noqa: E402  (forgets to divide)


def all_reduce_then_slice(model, group=None):  # right values, twice the traffic, keeps the gradients
    from coursekit.collectives import owned_segment, segment_bounds
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.requires_grad])
    ring_all_reduce(flat, group=group)
    size, rank = comm.get_world_size(group), comm.get_rank(group)
    start, stop = segment_bounds(flat.numel(), size)[owned_segment(rank, size)]
    return flat[start:stop] / size


def test_solution_full_marks_and_stub_zero():
    report = check_data_parallel(attach_gradient_averaging, reduce_scatter_gradients, verbose=False)
    assert report.full_marks, report.table()
    stub = check_data_parallel(verbose=False)
    assert stub.score == 0 and all(r.status == "not done" for r in stub.results)


def test_typical_mistakes_lose_what_they_get_wrong_and_say_why():
    report = check_data_parallel(summing_hooks, all_reduce_then_slice, verbose=False,
                                 only=["hooks_average_gradients", "zero2_segment", "zero2_traffic",
                                       "zero2_frees_gradients"])
    by_name = {r.name: r for r in report.results}
    hooks = by_name["hooks_average_gradients"]
    assert hooks.earned == 0  # world size 1 is right, but a sum and a mean agree there: it earns nothing
    assert "divide by the world size" in hooks.feedback
    assert by_name["zero2_segment"].status == "pass"
    assert by_name["zero2_traffic"].earned == 0 and "2×" in by_name["zero2_traffic"].feedback
    assert by_name["zero2_frees_gradients"].earned == 0 and "p.grad = None" in by_name["zero2_frees_gradients"].feedback
