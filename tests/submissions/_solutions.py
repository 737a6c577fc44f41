"""The solutions of exercises 01 and 02, as in tools/notebook_src, written as templates of the typical mistakes.

``ring_reduce_scatter()`` with no arguments builds the notebook's solution; each keyword swaps in one
mistake a learner makes (a wrong segment index, a step too few, a copy for an add, a blocking send
first), so that every attempt in this folder states its mistake and nothing else.
"""

import torch

from coursekit import comm
from coursekit.collectives import ring_all_gather, ring_all_reduce
from coursekit.collectives import ring_reduce_scatter as _chapter_reduce_scatter


def ring_reduce_scatter(received_into=lambda r, s, G: (r - s - 1) % G, steps=lambda G: G - 1,
                        returned=lambda r, G: (r + 1) % G, add=True, send_first_blocking=False):
    """The solution's reduce-scatter; ``received_into`` (the segment step s adds into), ``steps``, ``returned``
    (the segment returned), ``add`` (False: receive straight into the segment) and ``send_first_blocking``
    (comm.send, then comm.recv) are the places learners go wrong."""
    def reduce_scatter(tensor, group=None):
        G, r = comm.get_world_size(group), comm.get_rank(group)
        segments = tensor.view(-1).tensor_split(G)
        if G == 1:
            return tensor.view(-1)
        right, left = (r + 1) % G, (r - 1) % G
        buffer = torch.empty_like(segments[0])  # the largest segment: reused every step
        for s in range(steps(G)):
            send_k, recv_k = (r - s) % G, received_into(r, s, G)
            incoming = buffer[:segments[recv_k].numel()] if add else segments[recv_k]
            if send_first_blocking:
                comm.send(segments[send_k], right, group)
                comm.recv(incoming, left, group)
            else:
                works = [comm.isend(segments[send_k], right, group)] if segments[send_k].numel() else []
                if incoming.numel():
                    comm.irecv(incoming, left, group).wait()
                for work in works:
                    work.wait()
            if add:
                segments[recv_k].add_(incoming)  # "added to b1"
        return segments[returned(r, G)]
    return reduce_scatter


def all_gather(segment, out, group=None):
    """The right all-gather: the chapter's own (the notebook's solution is tested by its own notebook)."""
    return ring_all_gather(segment, out, group)


reduce_scatter = ring_reduce_scatter()


def attach_gradient_averaging(model, group=None):
    world_size = comm.get_world_size(group)

    def average(param):
        ring_all_reduce(param.grad, group=group)
        param.grad.div_(world_size)

    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(average)


def reduce_scatter_gradients(model, group=None):
    world_size = comm.get_world_size(group)
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    return _chapter_reduce_scatter(flat, group=group).div_(world_size)
