# %% [markdown]
# BEGIN SOLUTION
# # Solution 02 · Data parallelism: average with hooks, then shard with ZeRO-2
# EXERCISE: # # Exercise 02 · Data parallelism: average with hooks, then shard with ZeRO-2
# END SOLUTION
#
# In `notebooks/02_data_parallelism.ipynb` you saw that averaging the ranks' gradients makes data
# parallelism exactly equal to one device (**P4**, **R2**), that communication started *during* backward
# and run asynchronously can hide behind it, and that ZeRO-2 replaces the all-reduce by a
# **reduce-scatter** so that each rank keeps only its own slice of the gradient. Now you write both.
#
# **Part 1** `attach_gradient_averaging(model, group=None)`: register hooks so that, by the time
# `loss.backward()` returns, every trainable parameter's `.grad` is the **average** over all ranks —
# also with gradient accumulation (several `loss.backward()` calls before `optimizer.step()`).
# Each hook runs as soon as that parameter's gradient is ready, so its communication *starts* before
# backward has reached the earlier layers. But chapter 01's `ring_all_reduce` is **blocking**: backward
# waits inside the hook until the ring is done, so here communication does not overlap computation.
# Overlap needs asynchronous work, as chapter 02's `DataParallel` does with gloo's
# `dist.all_reduce(..., async_op=True)`, waited for at the end of backward.
#
# **Part 2** `reduce_scatter_gradients(model, group=None) -> Tensor`: ZeRO-2's gradient step, called
# after `loss.backward()`. Flatten the gradients of the trainable parameters (in `model.parameters()`
# order) into one tensor, reduce-scatter it with chapter 01's ring, and return this rank's segment of
# the **averaged** gradient. Then free the full gradients: that memory is what ZeRO-2 saves.
#
# **The tools**: `from coursekit.collectives import ring_all_reduce, ring_reduce_scatter` (chapter 01,
# in place, they *sum*; `ring_reduce_scatter` returns rank `r`'s segment `(r + 1) % G`, a view);
# `comm.get_world_size(group)`, `comm.get_rank(group)`. While grading, `torch.distributed`'s own
# collectives are switched off and every element sent through `coursekit.comm` is counted.
#
# **Grading**: each part is checked against single-process training on the same global batch with the
# course's equivalence harness (outputs, loss, every gradient, every parameter after each step, for
# several world sizes, a batch that does not divide evenly, a tied and a frozen weight), and the
# traffic is counted against its formula: 2·(G−1)·Ψ elements per step for part 1, (G−1)·Ψ for part 2,
# and per rank: in a ring each rank sends its share (a master, `master_all_reduce`, moves the same total
# but all of it through one rank).
# Part 1 is also trained with gradient accumulation: two micro-batches per rank, two `loss.backward()`
# calls per step, compared with one process on the whole batch.
# From a terminal: `make grade NB=exercises/02_data_parallel.ipynb` (it grades a copy of your file).

# %% tags=["parameters"]
# Parameters: seconds each check may run before it counts as a deadlock (raise it on a slow machine).
CHECK_TIMEOUT = 60.0

# %%
import torch

import coursekit
from coursekit import comm
from coursekit.grading import check_data_parallel
from coursekit.collectives import ring_all_reduce, ring_reduce_scatter
from coursekit.models import TeacherData, loss_fn, tiny_mlp
from coursekit.parallel.data import shard_batch
from coursekit.measure.verify import compare, record_step, reference_run

# %% [markdown]
# ## Part 1: gradient averaging with hooks
#
# `param.register_post_accumulate_grad_hook(hook)` calls `hook(param)` right after `param.grad` has
# been computed in backward (`hook` must return `None`). In the hook: all-reduce `param.grad` in place
# with the ring, then divide by the world size. Skip parameters that do not require a gradient (frozen
# ones never get one). A tied weight is *one* parameter, so it gets one hook — nothing special to do.
#
# **Gradient accumulation** (a large batch as several micro-batches, one `loss.backward()` each, then
# one `optimizer.step()`): each backward *adds* its gradient into `param.grad`, then your hook runs.
# Average the accumulated `param.grad` in place on **every** backward: after the first, `param.grad` is
# the average of the first micro-batch, the same on every rank, so averaging it again on the second
# backward leaves it unchanged, and the result is the average of the sum — exactly one process on the
# whole batch. (It costs one all-reduce per backward; DDP's `no_sync()` skips all but the last.) Do not
# replace `param.grad` by the average of only this backward's gradient: that throws away what the
# earlier micro-batches accumulated.

# %%
def attach_gradient_averaging(model, group=None):
    """Register hooks so that after loss.backward() every trainable gradient is the mean over ranks."""
    world_size = comm.get_world_size(group)
# BEGIN SOLUTION

    def average(param):
        ring_all_reduce(param.grad, group=group)     # in place: the sum over ranks ...
        param.grad.div_(world_size)                  # ... divided: the mean

    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(average)
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("register a hook on every trainable parameter")
# END SOLUTION

# %% [markdown]
# Try it: 3 ranks, 2 SGD steps with your hooks, compared with one process by the harness (it names the
# first step, tensor and rank that differ).

# %%
def try_hooks(rank, world_size, steps=2, global_batch=12):
    model, data = tiny_mlp(seed=0), TeacherData()
    attach_gradient_averaging(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    records = []
    for step in range(steps):
        x, y, weight = shard_batch(*data.batch(step, global_batch), rank, world_size)
        optimizer.zero_grad()
        output = model(x)
        loss = loss_fn(output, y) * weight          # weight: this rank's share of the global batch
        loss.backward()                             # your hooks average the gradients in here
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
# Then the grader: the same comparison for 1, 2 and 3 ranks, the traffic counted during backward, and
# gradient accumulation (two backward calls per step on 2 and 3 ranks).

# %%
check_data_parallel(attach_gradient_averaging, None,
                    only=["hooks_average_gradients", "hooks_traffic", "hooks_gradient_accumulation"],
                    timeout=CHECK_TIMEOUT);

# %% [markdown]
# ## Part 2: ZeRO-2's gradient reduce-scatter
#
# After `loss.backward()` every rank holds the full gradient of its micro-batch. With ZeRO-2, rank `r`
# only ever needs the averaged gradient of *its* segment — the part of the flattened parameters whose
# optimiser state it owns — so a reduce-scatter is enough (half the traffic of an all-reduce), and the
# full gradients can go. Steps:
#
# 1. `flat = torch.cat([p.grad.reshape(-1) for p in trainable parameters])`;
# 2. free the full gradients: `p.grad = None` for each of them;
# 3. `mine = ring_reduce_scatter(flat)`: the *sum* over ranks of segment `(r + 1) % G`;
# 4. return `mine / world_size`: a new tensor. `mine` is a view into `flat`, and so would be
#    `mine.div_(world_size)`: returning a view keeps all of `flat` allocated, the memory ZeRO-2 saves.

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
# EXERCISE:     raise NotImplementedError("flatten, free, reduce-scatter, average")
# END SOLUTION

# %%
check_data_parallel(None, reduce_scatter_gradients, only=["zero2_segment", "zero2_traffic", "zero2_frees_gradients"],
                    timeout=CHECK_TIMEOUT);

# %% [markdown]
# ## Everything, hidden checks included

# %%
report = check_data_parallel(attach_gradient_averaging, reduce_scatter_gradients, timeout=CHECK_TIMEOUT)
