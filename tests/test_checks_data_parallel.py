"""Exercise 02's grader: the solution gets full marks, the stub zero, typical mistakes what they deserve.
(More wrong attempts, each with its expected score: tests/test_grading_submissions.py.)"""

import torch
from grading_support import load

from coursekit import comm
from coursekit.collectives import ring_all_reduce
from coursekit.grading import check_data_parallel

attach_gradient_averaging = load("data_parallel", "_dp_solution").attach_gradient_averaging
reduce_scatter_gradients = load("data_parallel", "_dp_solution").reduce_scatter_gradients
summing_hooks = load("data_parallel", "sum_not_mean").attach_gradient_averaging  # forgets to divide


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


def test_right_variants_are_not_failed_by_the_property_checks():
    """Hooks that keep one handle per bucket and wait for them last one first, dividing each gradient after the copy,
    and a ZeRO-2 that returns a copy of its segment: right, so full marks. Planted bug, seen failing: the watch
    (data_parallel_watch._Handle.wait) delivering a sum only once every all-reduce started before it was waited for
    (a grader that assumed in-order waits) -> these hooks fail hooks_average_gradients (1 / 8 points)."""
    rule_buckets = load("data_parallel", "_dp_solution").rule_buckets

    def waits_last_first(model, bucket_elements, group=None):
        buckets = rule_buckets(model, bucket_elements)
        seen, handles = set(), {}

        def mark(param):                               # any bucket whose gradients are all in starts its sum
            seen.add(id(param))
            for b, bucket in enumerate(buckets):
                if b not in handles and all(id(p) in seen for p in bucket):
                    flat = torch.cat([p.grad.reshape(-1) for p in bucket])
                    handles[b] = (flat, comm.all_reduce(flat, group=group, async_op=True))

        for bucket in buckets:
            for p in bucket:
                p.register_post_accumulate_grad_hook(mark)

        def finish():
            for b in sorted(handles, reverse=True):
                flat, handle = handles.pop(b)
                if handle is not None:
                    handle.wait()
                offset = 0
                for p in buckets[b]:
                    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p)).div_(comm.get_world_size(group))
                    offset += p.numel()
            seen.clear()

        return finish

    def copied_segment(model, group=None):
        from coursekit.collectives import ring_reduce_scatter
        params = [p for p in model.parameters() if p.requires_grad]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        for p in params:
            p.grad = None
        return ring_reduce_scatter(flat, group=group).clone().div_(comm.get_world_size(group))

    report = check_data_parallel(waits_last_first, copied_segment, verbose=False,
                                 only=["hooks_average_gradients", "hooks_buckets", "hooks_overlap",
                                       "zero2_frees_gradients"])
    assert report.full_marks, report.table()
