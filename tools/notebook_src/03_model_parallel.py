# %% [markdown]
# BEGIN SOLUTION
# # Solution 03 · Model parallelism: activations forward, gradients back
# EXERCISE: # # Exercise 03 · Model parallelism: activations forward, gradients back
# END SOLUTION
#
# In `notebooks/03_model_parallelism.ipynb` you ran the seed's example (claim **P3**): a two-layer network
# with the hidden layer on rank 0 ("GPU 1") and the output layer on rank 1 ("GPU 2"). Forward, activations
# travel from the first rank to the second; backward, their gradient travels back. Now you write one whole
# training step of such a two-stage model, forward and backward, from its contract.
#
# **`two_stage_step(stage, inputs, targets, loss_fn, width, micro_batches, group=None) -> loss`**, called on both
# ranks of the pipeline, each with its own stage.
#
# * **In**: `stage`, this rank's part of the network (`nn.Module`): on rank 0 of `group` the first layers, on
#   rank 1 the rest, ending in the output layer. `inputs` `(B, d_in)` and `targets` `(B,)`: the whole batch, given
#   to both ranks (the first stage needs only the inputs, the last only the targets). `loss_fn(output, targets)`:
#   the mean loss over the rows it is given. `width`: the features per row of the activations between the stages.
#   `micro_batches`: cut the batch into this many pieces with `tensor_split` (their sizes may differ by one).
#   `group`: the two ranks of the pipeline (`None`: the whole world of two; or a mesh axis, `mesh["pp"]`).
# * **Out**: the last stage returns the loss of the whole batch, the mean over its B rows (a number or a 0-d
#   tensor); the first stage returns `None`. When the call returns, every parameter of each stage holds in `.grad`
#   the gradient of that loss, as one process running the whole network on the whole batch would compute it.
# * **What may cross**: for each micro-batch, the activations forward and their gradient back, one message each,
#   nothing else. Autograd cannot follow a tensor into another process, so only numbers cross, and a receiver
#   must have a buffer of the right shape before the data arrive.
#
# **The tools**: `from coursekit import comm`: `comm.send(tensor, group=group, group_dst=...)`,
# `comm.recv(tensor, group=group, group_src=...)` (blocking; a send completes only once its receive is posted) and
# `comm.isend`/`comm.irecv` (a work object to `.wait()` on); `dst`/`src` name global ranks, `group_dst`/`group_src`
# ranks within `group`; `comm.get_rank(group)`. From autograd: `tensor.backward(gradient)`, `requires_grad_()`,
# `detach()`. While grading, `torch.distributed`'s own send/recv and collectives are switched off and every element
# sent through `coursekit.comm` is counted.
#
# **Grading**: against one process training the whole network on the same batches, with the course's equivalence
# harness: the loss, every gradient of both stages after one step, then the loss, every gradient and every weight
# after each of 3 steps, and with 3 uneven micro-batches per step. Then the traffic (one message of its rows ×
# `width` each way per micro-batch), and the activations sent detached. Hidden: other splits and sizes, and a
# pipeline that is the pp group of a 2 × 2 mesh. Each check runs in the strict simulator first (a deadlock is named
# at once), then on real ranks.
# From a terminal: `make grade NB=exercises/03_model_parallel.ipynb` (it grades a copy of your file).

# %% tags=["parameters"]
# Parameters: seconds each check may run before it counts as a deadlock (raise it on a slow machine).
CHECK_TIMEOUT = 30.0

# %%
import torch

import coursekit
from coursekit import comm
from coursekit.grading import check_model_parallel
from coursekit.models import TeacherData, loss_fn, tiny_mlp
from coursekit.parallel.pipeline import split
from coursekit.measure.verify import NamedPart, compare, record_step, reference_run

# %%
def two_stage_step(stage, inputs, targets, loss_fn, width, micro_batches, group=None):
    """One training step of a two-stage model on this rank's stage; the last stage returns the batch's loss."""
# BEGIN SOLUTION
    last = comm.get_rank(group) == 1
    total = 0.0
    for x, y in zip(inputs.tensor_split(micro_batches), targets.tensor_split(micro_batches)):
        if not last:
            activations = stage(x)
            comm.send(activations.detach(), group=group, group_dst=1)   # data only: autograd stays on this rank
            grad = torch.empty_like(activations)
            comm.recv(grad, group=group, group_src=1)
            activations.backward(grad)                                  # the chain rule, continued here
        else:
            received = torch.empty(len(y), width)
            comm.recv(received, group=group, group_src=0)
            received.requires_grad_()                                   # a leaf whose gradient autograd computes
            share = len(y) / len(targets)                               # this micro-batch's part of the batch mean
            loss = loss_fn(stage(received), y) * share
            loss.backward()                                             # the gradients add up over micro-batches
            comm.send(received.grad, group=group, group_dst=0)          # back where the activations came from
            total += loss.item()
    return total if last else None
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("forward and backward of one step, across the two stages")
# END SOLUTION

# %% [markdown]
# Try it: the two-layer network (16 → 64 → 4) cut in two with `coursekit.parallel.pipeline.split`, 3 SGD steps
# on 2 ranks, compared with one process by the harness (it names the first step, tensor and rank that
# differ). Each rank records only its own stage's gradients and weights; rank 1 also records the output.
# It runs in the strict simulator first (the two ranks as threads: a deadlock is named at once, instead of
# waited for until the timeout), then on 2 real ranks.

# %%
def try_two_stages(rank, world_size, steps=3, batch=12):
    model, data = tiny_mlp(seed=0, n_layers=2), TeacherData()
    stage = split(model, 2)[rank]                # rank 0: layers.0 (+ GELU); rank 1: layers.1
    mine = {id(p) for p in stage.parameters()}
    named = [(n, p) for n, p in model.named_parameters() if id(p) in mine]
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.1, momentum=0.9)
    records = []
    for step in range(steps):
        x, y = data.batch(step, batch)
        optimizer.zero_grad()
        outputs = []
        loss = two_stage_step(stage, x, y, lambda out, t: (outputs.append(out.detach()), loss_fn(out, t))[1], 64, 1)
        loss, output = (torch.zeros(()), None) if rank == 0 else (torch.as_tensor(loss), outputs[0])
        grads = NamedPart({n: p.grad.clone() for n, p in named})
        optimizer.step()
        records.append(record_step(output, loss.item(), grads, NamedPart(dict(named))))
    return records


def simulated(rank, world_size):
    """Both stages as threads of this one rank, in the strict simulator (its own process: ranks forked from a
    kernel whose threads have multiplied matrices can hang)."""
    return comm.simulate(try_two_stages, 2, timeout=CHECK_TIMEOUT).results


model = tiny_mlp(seed=0, n_layers=2)             # one process, the whole network: what the two ranks must equal
reference = reference_run(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                          [TeacherData().batch(s, 12) for s in range(3)], loss_fn)
try:
    coursekit.launch(simulated, 1, timeout=CHECK_TIMEOUT)   # a deadlock is named here, in a second
    runs = coursekit.launch(try_two_stages, 2, timeout=CHECK_TIMEOUT)
    for r0, r1 in zip(*runs):
        r0["loss"] = r1["loss"]                  # the loss lives on rank 1
    print(compare(reference, runs))
except Exception as error:                      # an unfinished exercise lands here
    print(type(error).__name__, str(error).strip().splitlines()[-1])

# %% [markdown]
# ## The grader

# %%
report = check_model_parallel(two_stage_step, timeout=CHECK_TIMEOUT)
