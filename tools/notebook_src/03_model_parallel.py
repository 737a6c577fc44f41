# %% [markdown]
# BEGIN SOLUTION
# # Solution 03 · Model parallelism: activations forward, gradients back
# EXERCISE: # # Exercise 03 · Model parallelism: activations forward, gradients back
# END SOLUTION
#
# In `notebooks/03_model_parallelism.ipynb` you ran the seed's example (claim **P3**): a two-layer network
# with the hidden layer on rank 0 ("GPU 1") and the output layer on rank 1 ("GPU 2"). Forward, rank 0
# computes the hidden activations and **sends** them to rank 1, which computes the output and the loss.
# Backward, rank 1 computes the gradient of the loss with respect to the activations it received and sends
# it **back**; rank 0 continues the backward pass from there. Now you write both halves.
#
# **The task.** Write the two halves of one training step of this two-stage network, one function per rank:
#
# * **`first_stage(stage, inputs)`** on rank 0 (returns nothing): run the hidden layer on the inputs, and by
#   the end its parameters must hold their gradients — as if the whole network had run backward here;
# * **`second_stage(stage, targets, loss_fn, shape) -> loss`** on rank 1: run the output layer and the loss
#   (with the `loss_fn` you are given: it is scaled for micro-batches), fill the output layer's gradients,
#   and return the loss.
#
# **What crosses between the ranks** — two messages per call, nothing else: the hidden activations,
# `(batch, hidden)` = `shape`, from rank 0 to rank 1; and the gradient of the loss with respect to those
# activations, the same shape, from rank 1 back to rank 0. Autograd cannot follow a tensor into another
# process, so only numbers cross: each rank must turn what it receives into something its own autograd
# can use, and a receiver must have a buffer of the right shape before the data arrives.
#
# <details>
# <summary><b>Hint: the steps, one by one</b> (open it only if you are stuck)</summary>
#
# Rank 0 (`first_stage`):
#
# 1. `activations = stage(inputs)`;
# 2. send them to rank 1 *detached* (`comm.send(activations.detach(), dst=1)`), and keep `activations`,
#    still part of rank 0's graph, for step 4;
# 3. receive their gradient into a buffer of the same shape: `grad = torch.empty_like(activations)`, then
#    `comm.recv(grad, src=1)`;
# 4. continue backward from it: `activations.backward(grad)` fills the gradients of rank 0's layer.
#
# Rank 1 (`second_stage`):
#
# 1. receive the activations into `inputs = torch.empty(shape)`;
# 2. make them a leaf that requires grad, `inputs.requires_grad_()`, so that autograd computes `inputs.grad`;
# 3. `loss = loss_fn(stage(inputs), targets)`, then `loss.backward()`;
# 4. send `inputs.grad` back to rank 0, and return `loss`.
#
# </details>
#
# **The tools**: `from coursekit import comm`: `comm.send(tensor, dst=...)`, `comm.recv(tensor, src=...)`
# (blocking; `comm.isend`/`comm.irecv` return a work object to `.wait()` on). While grading,
# `torch.distributed`'s own send/recv and collectives are switched off and every element sent through
# `coursekit.comm` is counted.
#
# **Grading**: against one process training the whole network on the same batches, with the course's
# equivalence harness: the loss (the activations arrived), every gradient of both stages after one
# backward, then the loss, every gradient and every weight after each of 3 steps, and with 3 uneven
# micro-batches per step (your functions are called once per micro-batch; the gradients add up). The
# traffic is counted: exactly one message of b×h elements forward (rank 0 → 1) and one back (1 → 0) per
# micro-batch, nothing else. And the activations must be sent detached. Each check runs in the strict
# simulator first (a deadlock is named at once), then on two real ranks.
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

# %% [markdown]
# ## Rank 0: the hidden layer

# %%
def first_stage(stage, inputs):
    """Rank 0: forward, send the activations to rank 1; receive their gradient, continue backward."""
# BEGIN SOLUTION
    activations = stage(inputs)
    comm.send(activations.detach(), dst=1)       # data only: autograd stops at the process boundary
    grad = torch.empty_like(activations)         # d loss / d activations, computed by rank 1
    comm.recv(grad, src=1)
    activations.backward(grad)                   # the chain rule, continued on this rank
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("forward, send the activations, receive their gradient, backward")
# END SOLUTION

# %% [markdown]
# ## Rank 1: the output layer and the loss

# %%
def second_stage(stage, targets, loss_fn, shape):
    """Rank 1: receive the activations, forward, loss, backward, send their gradient to rank 0; return the loss."""
# BEGIN SOLUTION
    inputs = torch.empty(shape)
    comm.recv(inputs, src=0)
    inputs.requires_grad_()                      # a leaf whose gradient autograd will compute
    loss = loss_fn(stage(inputs), targets)
    loss.backward()                              # fills this stage's gradients and inputs.grad
    comm.send(inputs.grad, dst=0)                # back to where the activations came from
    return loss
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("receive, requires_grad_(), forward, loss, backward, send inputs.grad back")
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
        if rank == 0:
            first_stage(stage, x)
            loss, output = torch.zeros(()), None
        else:
            outputs = []
            loss = second_stage(stage, y, lambda out, t: (outputs.append(out.detach()), loss_fn(out, t))[1],
                                (x.shape[0], 64))
            output = outputs[0]
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
#
# The typical mistakes, and what each costs: forgetting `inputs.requires_grad_()` (then `inputs.grad` is
# None: there is no gradient to send back, and the first stage's gradients stay zero), sending the
# gradient to the wrong rank, sending more than the activations and their gradient, and sending the
# activations without `.detach()` (it works, but the grader asks you to say what crosses: only data).

# %%
report = check_model_parallel(first_stage, second_stage, timeout=CHECK_TIMEOUT)
