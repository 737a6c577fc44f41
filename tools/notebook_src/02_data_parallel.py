# %% [markdown]
# BEGIN SOLUTION
# # Solution 02 · Data parallelism: average with hooks, then shard with ZeRO-2
# EXERCISE: # # Exercise 02 · Data parallelism: average with hooks, then shard with ZeRO-2
# END SOLUTION
#
# In `notebooks/02_data_parallelism.ipynb` you saw that averaging the ranks' gradients makes data
# parallelism exactly equal to one device (**P4**, **R2**), that communication started *during* backward
# and run asynchronously can hide behind it, and that ZeRO-2 replaces the all-reduce by a
# **reduce-scatter** so that each rank keeps only its own slice of the gradient. Now you write both
# mechanisms, from their contracts. How is yours to decide.
#
# **The tools**: `from coursekit import comm`: `comm.all_reduce(tensor, group=group, async_op=True)` sums `tensor`
# over the group's ranks in place and returns at once a handle whose `.wait()` returns when the sum is there
# (on one rank it returns `None`: nothing to sum); `comm.get_world_size(group)`, `comm.get_rank(group)`.
# `param.register_post_accumulate_grad_hook(hook)` calls `hook(param)` in backward, right after `param.grad`
# is complete. `from coursekit.collectives import ring_reduce_scatter` (chapter 01: in place, it *sums*, and
# returns rank `r`'s segment `owned_segment(r, G)` as a view). While grading, every other collective of
# `torch.distributed` is switched off, and everything sent is counted.
#
# **Grading** compares each part with single-process training on the same global batch with the course's
# equivalence harness (outputs, loss, every gradient, every parameter after each step, for several world sizes,
# a batch that does not divide evenly, a tied and a frozen weight), then measures the part's property. A
# property earns its points only when the training it measures is right.
# From a terminal: `make grade NB=exercises/02_data_parallel.ipynb` (it grades a copy of your file).

# %% tags=["parameters"]
# Parameters: seconds each check may run before it counts as a deadlock (raise it on a slow machine).
CHECK_TIMEOUT = 60.0

# %%
import torch

import coursekit
from coursekit import comm
from coursekit.grading import check_data_parallel
from coursekit.collectives import owned_segment, ring_reduce_scatter
from coursekit.models import TeacherData, loss_fn, tiny_mlp
from coursekit.parallel.data import shard_batch
from coursekit.measure.verify import compare, record_step, reference_run

# %% [markdown]
# ## Part 1: bucketed gradient averaging, overlapped with backward
#
# **`attach_gradient_averaging(model, bucket_elements, group=None) -> finish`**, called once, before training.
#
# * **In**: `model`, whose trainable parameters are those with `requires_grad` (a frozen one never gets a
#   gradient; a tied weight is one parameter); `bucket_elements`, the most gradient elements a bucket holds;
#   `group`, the ranks to average over (`None`: all of them; or a mesh axis, `mesh["dp"]`).
# * **Out**: `finish`, a function of no arguments. The training loop calls it after every `loss.backward()`, before
#   `optimizer.step()`. When it returns, every trainable `p.grad` is the mean over the group's ranks of what they
#   accumulated, also after several `loss.backward()` calls (gradient accumulation, `finish()` after each).
# * **The buckets**: the trainable parameters in *backward* order (the reverse of `model.parameters()`), grouped
#   in turn: a bucket is closed when the next parameter would take it past `bucket_elements`. A parameter is never
#   split: one larger than the cap is a bucket of its own.
# * **The property**: each backward all-reduces each bucket once, in one call of `bucket_elements` at most (but for
#   a parameter larger than that), started asynchronously *inside backward*, as soon as the bucket's last gradient
#   is ready; nothing waits for it before backward has returned.

# %%
def attach_gradient_averaging(model, bucket_elements, group=None):
    """Buckets of gradients all-reduced during backward; returns finish(), which leaves every gradient the mean."""
    world_size = comm.get_world_size(group)
# BEGIN SOLUTION
    params = [p for p in model.parameters() if p.requires_grad]
    buckets, current, size = [], [], 0
    for p in reversed(params):                       # backward order: the last layer's gradients come first
        if current and size + p.numel() > bucket_elements:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += p.numel()
    buckets.append(current)
    bucket_of = {id(p): b for b, bucket in enumerate(buckets) for p in bucket}
    ready = [0] * len(buckets)
    in_flight = []                                   # (bucket, its flat gradients, the all-reduce's handle)

    def gradient_ready(param):
        b = bucket_of[id(param)]
        ready[b] += 1
        if ready[b] == len(buckets[b]):              # full: start its sum now, while backward goes on
            flat = torch.cat([p.grad.reshape(-1) for p in buckets[b]])
            in_flight.append((b, flat, comm.all_reduce(flat, group=group, async_op=True)))

    for p in params:
        p.register_post_accumulate_grad_hook(gradient_ready)

    def finish():
        for b, flat, handle in in_flight:
            if handle is not None:                   # None on one rank: nothing was sent
                handle.wait()
            pieces = flat.div_(world_size).split([p.numel() for p in buckets[b]])
            for p, piece in zip(buckets[b], pieces):
                p.grad.copy_(piece.view_as(p))
            ready[b] = 0
        in_flight.clear()

    return finish
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("buckets, hooks that start their all-reduce, and finish()")
# END SOLUTION

# %% [markdown]
# Try it: 3 ranks, 2 SGD steps with buckets of 2,000 elements, compared with one process by the harness (it
# names the first step, tensor and rank that differ).

# %%
def try_hooks(rank, world_size, steps=2, global_batch=12):
    model, data = tiny_mlp(seed=0), TeacherData()
    finish = attach_gradient_averaging(model, 2000)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    records = []
    for step in range(steps):
        x, y, weight = shard_batch(*data.batch(step, global_batch), rank, world_size)
        optimizer.zero_grad()
        output = model(x)
        loss = loss_fn(output, y) * weight          # weight: this rank's share of the global batch
        loss.backward()                             # your hooks start the all-reduces in here
        finish()                                    # ... and here the gradients become the mean
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        records.append(record_step(output, loss.item() / world_size, grads, model))  # my share of the loss
    return records


try:
    runs = coursekit.launch(try_hooks, 3)
    for step in range(2):                    # the global batch's loss is the sum of the ranks' shares
        total = sum(records[step]["loss"] for records in runs)
        for records in runs:
            records[step]["loss"] = total
    model = tiny_mlp(seed=0)
    reference = reference_run(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                              [TeacherData().batch(s, 12) for s in range(2)], loss_fn)
    print(compare(reference, runs, check_output=True).first or "gradients and parameters equal to one process")
except Exception as error:                  # an unfinished exercise lands here
    print(type(error).__name__, str(error).strip().splitlines()[-1])

# %% [markdown]
# Then the grader: the same comparison for 1, 2 and 3 ranks, the buckets each backward all-reduced, when each
# all-reduce started and was waited for, and gradient accumulation (two backward calls per step on 2 and 3 ranks).

# %%
check_data_parallel(attach_gradient_averaging, None,
                    only=["hooks_average_gradients", "hooks_buckets", "hooks_overlap", "hooks_gradient_accumulation"],
                    timeout=CHECK_TIMEOUT);

# %% [markdown]
# ## Part 2: ZeRO-2's gradient reduce-scatter
#
# With ZeRO-2, rank `r` keeps the optimiser state of one segment of the parameters, flattened, and only ever needs
# the averaged gradient of that segment.
#
# **`reduce_scatter_gradients(model, group=None) -> Tensor`**, called after `loss.backward()`.
#
# * **In**: `model`, whose trainable parameters hold this rank's gradients; `group` as in part 1.
# * **Out**: this rank's segment, `owned_segment(r, G)` of the gradients of the trainable parameters flattened in
#   `model.parameters()` order, *averaged* over the ranks: a tensor that owns its memory.
# * **The property**: one ring reduce-scatter, (G−1)·Ψ elements in all for Ψ gradient elements, half an all-reduce;
#   and afterwards nothing else of the gradients stays allocated: no `p.grad`, no buffer of all Ψ elements kept
#   alive by what you return. That memory is what ZeRO-2 saves.

# %%
def reduce_scatter_gradients(model, group=None):
    """ZeRO-2: this rank's segment of the averaged, flattened gradients; frees the full gradients."""
    world_size = comm.get_world_size(group)
# BEGIN SOLUTION
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None                                # keep only my segment from now on
    mine = ring_reduce_scatter(flat, group=group)    # sum over ranks of segment (r + 1) % G: a view into flat
    return mine / world_size                         # a new tensor: flat (all Ψ elements) can be freed
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("this rank's segment of the averaged gradients; free the rest")
# END SOLUTION

# %%
check_data_parallel(None, reduce_scatter_gradients, only=["zero2_segment", "zero2_traffic", "zero2_frees_gradients"],
                    timeout=CHECK_TIMEOUT);

# %% [markdown]
# ## Everything, hidden checks included

# %%
report = check_data_parallel(attach_gradient_averaging, reduce_scatter_gradients, timeout=CHECK_TIMEOUT)
