# %% [markdown]
# BEGIN SOLUTION
# # Solution 01 · The ring all-reduce, written out
# EXERCISE: # # Exercise 01 · Write the ring all-reduce
# END SOLUTION
#
# In `notebooks/01_gradient_sync.ipynb` you watched the ring all-reduce move gradients around four GPUs
# (claims **R5**, **R6**). Now you write its two phases yourself, with nothing but point-to-point messages.
#
# **The schedule** (the seed's, with ranks numbered from 0; `G` ranks, tensor split like
# `torch.tensor_split(tensor.view(-1), G)`, so the first `N % G` segments are one element longer):
#
# In each step `s = 0 … G−2` of each phase:
#
# | phase | rank `r` sends to rank `(r+1) % G` | rank `r` receives from rank `(r−1) % G` |
# |---|---|---|
# | reduce-scatter ("share-reduce") | its running sum of segment `(r − s) % G` | segment `(r − s − 1) % G`, **added** to its own |
# | all-gather ("share-only") | the complete segment `(r + 1 − s) % G` | segment `(r − s) % G`, **kept** as is |
#
# After reduce-scatter, rank `r` holds the complete sum of segment `(r + 1) % G` (GPU1 ends with
# `b₂+c₂+d₂+a₂`). `reduce_scatter` returns that segment (a view into the tensor); `all_gather` starts from it.
#
# **The tools**: `comm.get_rank(group)`, `comm.get_world_size(group)`, `comm.isend(tensor, dst, group)`,
# `comm.irecv(tensor, src, group)` (both return a work object: call `.wait()`), and the blocking
# `comm.send` / `comm.recv`. Both functions take `group=`: the ring runs over that group's ranks (the whole
# world when `None`; a mesh axis such as `mesh["tp"]` in the hidden checks). `comm.get_rank(group)` is your
# rank *within* the group, but `dst`/`src` are *global* ranks, as in `torch.distributed`: name a neighbour
# within the group with `group_dst=` / `group_src=` instead. Every transfer through `comm` is counted; `torch.distributed`'s own
# collectives and raw send/recv, and coursekit's own ring (`coursekit.ring_reduce_scatter`,
# `ring_all_gather`, `ring_all_reduce`), are switched off while grading: both phases are yours to write.
#
# **Grading**: the cells below grade each part as you go; the last cell grades everything, including
# hidden world sizes and lengths. Or from a terminal, in the course's folder:
# `make grade NB=exercises/01_ring_allreduce.ipynb` (it runs a copy; your file is never touched). Points: correctness of each phase for G = 2, 3, 4 and
# lengths that do and do not divide by G; bit-identical results on every rank; traffic exactly
# 2·(G−1)·N, neighbours only, one segment per message; no built-in collectives; hidden variants (a sub-group
# among them). Every point is for the ring: right values computed another way (everything through one rank) earn
# nothing, and the points for bits, traffic, edge cases and hidden variants count only once both phases are right.

# %% tags=["parameters"]
# Parameters: seconds each check may run before it counts as a deadlock (raise it on a slow machine).
CHECK_TIMEOUT = 60.0

# %%
import torch

import coursekit
from coursekit import comm, grading

# %% [markdown]
# ## Phase 1: reduce-scatter ("share-reduce", R5)
#
# Write `reduce_scatter(tensor, group=None)`: in place on `tensor` (contiguous), `G − 1` steps, and return
# the view of segment `(r + 1) % G`, now the sum over all ranks. Hints: `tensor.view(-1).tensor_split(G)`
# gives views of the segments; receive into a separate buffer and add it (`segment.add_(buffer)`); skip
# empty segments (when N < G) on both sides; with `G == 1` return the whole tensor.

# %%
def reduce_scatter(tensor, group=None):
    """Ring reduce-scatter: returns this rank's fully reduced segment (r + 1) % G."""
    G, r = comm.get_world_size(group), comm.get_rank(group)
# BEGIN SOLUTION
    segments = tensor.view(-1).tensor_split(G)
    if G == 1:
        return tensor.view(-1)
    right, left = (r + 1) % G, (r - 1) % G
    buffer = torch.empty_like(segments[0])              # the largest segment: reused every step
    for s in range(G - 1):
        send_k, recv_k = (r - s) % G, (r - s - 1) % G
        incoming = buffer[:segments[recv_k].numel()]
        works = []
        if segments[send_k].numel():
            works.append(comm.isend(segments[send_k], group=group, group_dst=right))
        if incoming.numel():
            comm.irecv(incoming, group=group, group_src=left).wait()
            segments[recv_k].add_(incoming)             # "added to b1"
        for work in works:
            work.wait()                                 # before the next step touches that segment
    return segments[(r + 1) % G]
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("write the reduce-scatter phase")
# END SOLUTION

# %% [markdown]
# Try it on 3 simulated ranks first (instant, and a deadlock is reported rather than hanging),
# then let the grader run it on real ranks. The grader tells you which world size, length and
# segment is wrong.

# %%
def try_reduce_scatter(rank, world_size):
    x = torch.arange(10.0) * (rank + 1)
    return reduce_scatter(x).tolist()

try:
    results, traffic = comm.simulate(try_reduce_scatter, 3)
    print("owned segments:", results)     # expect [[24.0, 30.0, 36.0], [42.0, 48.0, 54.0], [0.0, 6.0, 12.0, 18.0]]
    print(traffic.summary())
except Exception as error:                # an unfinished exercise lands here
    print(type(error).__name__, str(error).strip().splitlines()[-1])

# %%
grading.grade("01_ring_allreduce", only="reduce_scatter_correct", timeout=CHECK_TIMEOUT,
              reduce_scatter=reduce_scatter);

# %% [markdown]
# ## Phase 2: all-gather ("share-only", R6)
#
# `all_gather(segment, out)`: `segment` is this rank's complete segment `(r + 1) % G` of `out`. Put it in
# place (unless it already is that view), then pass complete segments around the ring for `G − 1`
# steps, receiving each straight into its place in `out`. Return `out`.

# %%
def all_gather(segment, out, group=None):
    """Ring all-gather: every rank ends with every complete segment in out."""
    G, r = comm.get_world_size(group), comm.get_rank(group)
# BEGIN SOLUTION
    segments = out.view(-1).tensor_split(G)
    mine = segments[(r + 1) % G]
    if mine.numel() and segment.data_ptr() != mine.data_ptr():
        mine.copy_(segment.view(-1))
    right, left = (r + 1) % G, (r - 1) % G
    for s in range(G - 1):
        send_k, recv_k = (r + 1 - s) % G, (r - s) % G
        works = []
        if segments[send_k].numel():
            works.append(comm.isend(segments[send_k], group=group, group_dst=right))
        if segments[recv_k].numel():
            works.append(comm.irecv(segments[recv_k], group=group, group_src=left))   # straight into place
        for work in works:
            work.wait()
    return out
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("write the all-gather phase")
# END SOLUTION

# %%
grading.grade("01_ring_allreduce", only="all_gather_correct", timeout=CHECK_TIMEOUT,
              all_gather=all_gather);

# %% [markdown]
# ## Everything, hidden checks included

# %%
report = grading.check_ring_all_reduce(reduce_scatter, all_gather, timeout=CHECK_TIMEOUT)
