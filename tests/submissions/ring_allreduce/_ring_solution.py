"""The solution of exercise 01, as in tools/notebook_src, written as templates of the typical mistakes.

``ring_reduce_scatter()`` with no arguments builds the notebook's solution; each keyword swaps in one
mistake a learner makes (a wrong segment index, a step too few, a copy for an add, a blocking send
first, the neighbours named by their ranks within the group as global ranks), so that every attempt in this
folder states its mistake and nothing else.
"""

import torch

from coursekit import comm


def _peers(group_unaware: bool):
    """How a step names its neighbours: ``group_dst=``/``group_src=`` (ranks within the group), or, the mistake,
    the same numbers as ``dst``/``src``, which are global ranks."""
    if group_unaware:
        return (lambda right: {"dst": right}), (lambda left: {"src": left})
    return (lambda right: {"group_dst": right}), (lambda left: {"group_src": left})


def ring_reduce_scatter(received_into=lambda r, s, G: (r - s - 1) % G, steps=lambda G: G - 1,
                        returned=lambda r, G: (r + 1) % G, add=True, send_first_blocking=False,
                        sends_running_sum=True, skips_empty=False, group_unaware=False):
    """The solution's reduce-scatter; ``received_into`` (the segment step s adds into), ``steps``, ``returned``
    (the segment returned), ``add`` (False: receive straight into the segment), ``send_first_blocking``
    (comm.send, then comm.recv; ``skips_empty``: neither for an empty segment), ``sends_running_sum`` (False:
    send the rank's own input, from a copy taken before any add) and ``group_unaware`` (group-local ranks as
    global ones) are the places learners go wrong."""
    to, frm = _peers(group_unaware)

    def reduce_scatter(tensor, group=None):
        G, r = comm.get_world_size(group), comm.get_rank(group)
        segments = tensor.view(-1).tensor_split(G)
        if G == 1:
            return tensor.view(-1)
        sent = segments if sends_running_sum else tensor.view(-1).clone().tensor_split(G)
        right, left = (r + 1) % G, (r - 1) % G
        buffer = torch.empty_like(segments[0])  # the largest segment: reused every step
        for s in range(steps(G)):
            send_k, recv_k = (r - s) % G, received_into(r, s, G)
            incoming = buffer[:segments[recv_k].numel()] if add else segments[recv_k]
            if send_first_blocking:
                if sent[send_k].numel() or not skips_empty:
                    comm.send(sent[send_k], group=group, **to(right))
                if incoming.numel() or not skips_empty:
                    comm.recv(incoming, group=group, **frm(left))
            else:
                works = [comm.isend(sent[send_k], group=group, **to(right))] if sent[send_k].numel() else []
                if incoming.numel():
                    comm.irecv(incoming, group=group, **frm(left)).wait()
                for work in works:
                    work.wait()
            if add:
                segments[recv_k].add_(incoming)  # "added to b1"
        return segments[returned(r, G)]
    return reduce_scatter


reduce_scatter = ring_reduce_scatter()


def ring_all_gather_as_written(steps=lambda G: G - 1, add=False, puts_own=True, group_unaware=False):
    """The notebook's all-gather solution; ``steps``, ``add`` (True: receive into a buffer and add it, the
    reduce-scatter's code reused), ``puts_own`` (False: assume ``segment`` already is the view of ``out``) and
    ``group_unaware`` (as the reduce-scatter's) are the places learners go wrong."""
    to, frm = _peers(group_unaware)

    def all_gather(segment, out, group=None):
        G, r = comm.get_world_size(group), comm.get_rank(group)
        segments = out.view(-1).tensor_split(G)
        mine = segments[(r + 1) % G]
        if puts_own and mine.numel() and segment.data_ptr() != mine.data_ptr():
            mine.copy_(segment.view(-1))
        right, left = (r + 1) % G, (r - 1) % G
        buffer = torch.empty_like(segments[0])
        for s in range(steps(G)):
            send_k, recv_k = (r + 1 - s) % G, (r - s) % G
            incoming = buffer[:segments[recv_k].numel()] if add else segments[recv_k]
            works = []
            if segments[send_k].numel():
                works.append(comm.isend(segments[send_k], group=group, **to(right)))
            if incoming.numel():
                works.append(comm.irecv(incoming, group=group, **frm(left)))   # straight into place (or a buffer)
            for work in works:
                work.wait()
            if add and incoming.numel():
                segments[recv_k].add_(incoming)
        return out
    return all_gather


# The right all-gather, as the notebook's solution writes it (coursekit's own ring_all_gather is held back while
# exercise 01 is graded: wrapping it earns nothing).
all_gather = ring_all_gather_as_written()
