"""Exercise 02's grader: the solution gets full marks, the stub zero, typical mistakes partial credit."""

import torch

from coursekit import comm
from coursekit.checks.data_parallel import check_data_parallel
from coursekit.collectives import ring_all_reduce, ring_reduce_scatter


def attach_gradient_averaging(model, group=None):
    world_size = comm.get_world_size(group)

    def average(param):
        ring_all_reduce(param.grad, group=group)
        param.grad.div_(world_size)

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(average)


def reduce_scatter_gradients(model, group=None):
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    return ring_reduce_scatter(flat, group=group).div_(comm.get_world_size(group))


def summing_hooks(model, group=None):  # forgets to divide
    def add_up(param):
        ring_all_reduce(param.grad, group=group)

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(add_up)


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


def test_typical_mistakes_get_partial_credit_and_say_why():
    report = check_data_parallel(summing_hooks, all_reduce_then_slice, verbose=False,
                                 only=["hooks_average_gradients", "zero2_segment", "zero2_traffic",
                                       "zero2_frees_gradients"])
    by_name = {r.name: r for r in report.results}
    hooks = by_name["hooks_average_gradients"]
    assert 0 < hooks.earned < hooks.points  # world size 1 is right, 2 and 3 are not
    assert "divide by the world size" in hooks.feedback
    assert by_name["zero2_segment"].status == "pass"
    assert by_name["zero2_traffic"].earned == 0 and "2×" in by_name["zero2_traffic"].feedback
    assert by_name["zero2_frees_gradients"].earned == 0 and "p.grad = None" in by_name["zero2_frees_gradients"].feedback
