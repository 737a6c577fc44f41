"""The solution of exercise 02, as in tools/notebook_src: the attempts here reuse the part they get right.

Part 1 is written as a template of the typical mistakes: ``averaging_with()`` with no arguments builds the solution;
each keyword swaps in one mistake, so that every attempt at the hooks states its mistake and nothing else.
"""

import torch

from coursekit import comm
from coursekit.collectives import ring_reduce_scatter as _chapter_reduce_scatter


def rule_buckets(model, bucket_elements, forward_order=False):
    """The trainable parameters in buckets: backward order, a new bucket past bucket_elements, none split."""
    params = [p for p in model.parameters() if p.requires_grad]
    buckets, current, size = [], [], 0
    for p in (params if forward_order else reversed(params)):
        if current and size + p.numel() > bucket_elements:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += p.numel()
    return buckets + [current]


def averaging_with(forward_order=False, divide=True, weights=False, fresh_only=False, start_in_finish=False,
                   wait_in_hook=False, never_wait=False):
    """``forward_order``: buckets filled in model.parameters() order; ``divide=False``: the sum, not the mean;
    ``weights``: the parameters averaged, not their gradients; ``fresh_only``: only this backward's gradients
    all-reduced, written over what p.grad had accumulated; ``start_in_finish``: every all-reduce started in finish(),
    after backward; ``wait_in_hook``: each waited for in the hook that started it; ``never_wait``: finish() uses the
    buffers without waiting."""
    def attach_gradient_averaging(model, bucket_elements, group=None):
        world_size = comm.get_world_size(group)
        buckets = rule_buckets(model, bucket_elements, forward_order)
        bucket_of = {id(p): b for b, bucket in enumerate(buckets) for p in bucket}
        ready, in_flight, fresh = [0] * len(buckets), [], {}

        def start(b):
            tensors = [fresh.pop(id(p)) if fresh_only else p.detach() if weights else p.grad for p in buckets[b]]
            flat = torch.cat([t.reshape(-1) for t in tensors])
            in_flight.append((b, flat, comm.all_reduce(flat, group=group, async_op=True)))
            if wait_in_hook:
                land(*in_flight.pop())

        def land(b, flat, handle):
            if handle is not None and not never_wait:
                handle.wait()
            pieces = (flat.div_(world_size) if divide else flat).split([p.numel() for p in buckets[b]])
            with torch.no_grad():
                for p, piece in zip(buckets[b], pieces):
                    (p if weights else p.grad).copy_(piece.view_as(p))

        def gradient_ready(param):
            b = bucket_of[id(param)]
            ready[b] += 1
            if ready[b] == len(buckets[b]):
                ready[b] = 0
                start(b)

        def keep(param):
            def fresh_gradient(grad):  # this backward's own gradient, before it is added into p.grad
                fresh[id(param)] = grad.detach().clone()
            return fresh_gradient

        for p in (p for bucket in buckets for p in bucket):
            if fresh_only:
                p.register_hook(keep(p))
            if not start_in_finish:
                p.register_post_accumulate_grad_hook(gradient_ready)

        def finish():
            if start_in_finish:
                for b in range(len(buckets)):
                    start(b)
            for flight in in_flight:
                land(*flight)
            in_flight.clear()

        return finish

    return attach_gradient_averaging


attach_gradient_averaging = averaging_with()


def reduce_scatter_gradients(model, group=None):
    world_size = comm.get_world_size(group)
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    return _chapter_reduce_scatter(flat, group=group) / world_size  # a tensor of its own: flat can be freed
