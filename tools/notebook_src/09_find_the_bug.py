# ci_parameters: {"HANG_TIMEOUT": 3}
# %% [markdown]
# BEGIN SOLUTION
# # Solution 09 · Find the bug: three broken programs
# EXERCISE: # # Exercise 09 · Find the bug: three broken programs
# END SOLUTION
#
# A distributed program rarely fails where its bug is. One rank raises about a length it never chose; three
# ranks wait forever at the first step; or nothing fails at all and the model is just wrong. This exercise
# gives you three broken programs. Each one runs below, for real, and you see what coursekit reports. For each
# program you
#
# 1. **name the bug**: pick the reading of the report that explains it (`diagnosis`, one letter per program;
#    the other readings are what the report seems to say at first sight), and
# 2. **fix it**: copy the broken function, change what is wrong, and keep the rest as it is.
#
# **Grading** (`check_find_the_bug`): three points for the diagnosis, earned when all three letters are right. A
# wrong set is told where to look in each report, in the same words whichever letters are wrong: trying letters
# would take up to 64 gradings, reading the reports takes three. Three points per fix, which runs on real ranks at
# the world sizes where the bug shows (fixes of B and C on the strict simulator first, where a deadlock is found at
# once) and is compared with one process doing the same work. The feedback says what is still wrong. As in the other
# exercises, `torch.distributed`'s collectives are switched off while your fix runs: send with `coursekit.comm` and
# sum with `coursekit.collectives.ring_all_reduce`, as the broken programs do.
# From a terminal: `make grade NB=exercises/09_find_the_bug.ipynb`.

# %% tags=["parameters"]
# Parameters: seconds program B may hang before the launcher stops it and reports who waits on what.
HANG_TIMEOUT = 5

# %%
import torch

import coursekit
from coursekit import comm
from coursekit.collectives import ring_all_reduce
from coursekit.grading import check_find_the_bug
from coursekit.grading.find_the_bug_options import options_text
from coursekit.grading.find_the_bug_programs import (data_parallel_rank, data_parallel_reference, replica_rank,
                                                     replica_reference, replicas_compared, ring_rank)
from coursekit.models import loss_fn

# %% [markdown]
# ## Program A: one step of data parallelism, with a log line
#
# Every rank holds the same model (chapter 02) and its share of the batch. `broken_train_step` computes the
# loss and the gradients, averages the gradients over the ranks with the ring all-reduce, and steps. It also
# returns the mean loss of the *whole* batch (a learning-rate schedule reads it on every rank); since only
# rank 0 prints it, its author put the loss's all-reduce inside `if rank == 0:`.
# `data_parallel_rank` (in `coursekit.grading.find_the_bug_programs`) runs it for two steps on each rank;
# `data_parallel_reference` is one process doing the same two steps on the whole batch.

# %%
def broken_train_step(rank, world_size, model, optimizer, inputs, targets):
    optimizer.zero_grad()
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    mean_loss = loss.detach().clone()
    if rank == 0:                                    # only rank 0 prints, so only rank 0 averages the loss
        ring_all_reduce(mean_loss)
        mean_loss /= world_size
        print(f"loss {mean_loss.item():.4f}")
    for p in model.parameters():                     # average the gradients over the ranks
        ring_all_reduce(p.grad)
        p.grad /= world_size
    optimizer.step()
    return mean_loss.item()


# What the ranks should compute: one process training on the whole batch. (Run here first, it also imports what
# the first optimiser step needs once, in this kernel, rather than in every rank.)
reference_a = data_parallel_reference()
print("one process, loss each step:", [round(record["loss"], 4) for record in reference_a])
try:
    coursekit.launch(data_parallel_rank, 2, broken_train_step, timeout=60)
except coursekit.RankError as error:
    print(f"RankError: rank {error.rank} failed; the last line of its traceback:")
    print(error.remote_traceback.strip().splitlines()[-1])

# %% [markdown]
# Which reading explains this report?

# %%
print(options_text("program_a"))

# %% [markdown]
# ## Program B: a sum passed round a ring
#
# `broken_ring_sum` adds up every rank's tensor: at each of `world_size - 1` steps a rank passes the piece it
# holds to a neighbour and takes the next piece from its other neighbour (the ring of chapter 01, without the
# segments). On two ranks it works:

# %%
def broken_ring_sum(rank, world_size, tensor):
    left, right = (rank - 1) % world_size, (rank + 1) % world_size
    total, passing = tensor.clone(), tensor.clone()
    for step in range(world_size - 1):
        with comm.phase("ring", step=step):
            arriving = torch.empty_like(passing)
            sending = comm.isend(passing, dst=left)    # pass the piece on...
            comm.recv(arriving, src=left)              # ...and take the next one
            sending.wait()
        total += arriving
        passing = arriving
    return total


for rank, result in enumerate(coursekit.launch(ring_rank, 2, broken_ring_sum, 5, False)):
    print(f"rank {rank}: {result['total'].tolist()}")

# %% [markdown]
# On three ranks it never returns. The launcher stops it after `HANG_TIMEOUT` seconds and says what each rank
# was waiting on (`coursekit.comm` writes a note before every call that can block):

# %%
try:
    coursekit.launch(ring_rank, 3, broken_ring_sum, 5, False, timeout=HANG_TIMEOUT)
except coursekit.LaunchTimeout as error:
    print(error)

# %%
print(options_text("program_b"))

# %% [markdown]
# ## Program C: replicas that train without a word of complaint
#
# `broken_make_replica` builds a rank's replica. Each rank seeds its own random stream, `1000 + rank`, because
# after it each rank draws *its own* samples from that stream (`replica_rank` does, as a sampler seeded per rank
# would); then the replicas train with averaged gradients. Nothing hangs, nothing raises. Is it the training one
# process would do on every rank's samples together? `coursekit.compare` checks the loss, every gradient and
# every weight of each step against that one-process run (`replica_reference`, from rank 0's weights):

# %%
def broken_make_replica(rank, world_size):
    torch.manual_seed(1000 + rank)                   # this rank's own random stream: its own samples
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    return model


results = coursekit.launch(replica_rank, 2, broken_make_replica, timeout=60)
reference = replica_reference(results[0]["initial"], [r["drawn"] for r in results])
report = coursekit.compare(reference, [r["records"] for r in results], check_output=False)
print(report)
print("loss each step, ranks:", [round(rec["loss"], 4) for rec in results[0]["records"]],
      " one process:", [round(rec["loss"], 4) for rec in reference])

# %% [markdown]
# The first divergence is named on rank 0, at step 0's loss: every rank reports the same all-reduced loss, so
# this says *that* the run left one process, not *which* rank took it away. Compare the replicas with each other
# instead, before the first step (`replicas_compared`: each rank's weights against rank 0's):

# %%
print(replicas_compared(results))

# %%
print(options_text("program_c"))

# %% [markdown]
# ## Your diagnosis
#
# One letter per program, from the options printed above.

# %%
# BEGIN SOLUTION
diagnosis = {"program_a": "D", "program_b": "A", "program_c": "B"}
# EXERCISE: diagnosis = {"program_a": "?", "program_b": "?", "program_c": "?"}
# END SOLUTION

# %% [markdown]
# ## Your fixes
#
# Each fix keeps the broken function's signature and everything that was right in it; change only what the bug
# needs. The grader runs `train_step` on 2 and 3 ranks, `ring_sum` on 3 and 4 (where a wrong neighbour shows),
# `make_replica` on 2 and 3. Send with `coursekit.comm.send`/`recv` and sum with `ring_all_reduce`, as the broken
# programs do (`torch.distributed`'s collectives are switched off while grading), with one exception: `make_replica`
# may also call `torch.distributed.broadcast` (chapter 09 §7's `broadcast_parameters` wraps it, and is switched
# off here). Any fix of program C is right that starts
# every replica from the weights rank 0 builds (its seed, 1000, draws them) while each rank still draws its own
# samples, with or without a message.

# %%
def train_step(rank, world_size, model, optimizer, inputs, targets):
    """broken_train_step, fixed."""
# BEGIN SOLUTION
    optimizer.zero_grad()
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    mean_loss = loss.detach().clone()
    ring_all_reduce(mean_loss)                       # every rank: a collective is called by all ranks or by none
    mean_loss /= world_size
    if rank == 0:                                    # only the print is rank 0's
        print(f"loss {mean_loss.item():.4f}")
    for p in model.parameters():
        ring_all_reduce(p.grad)
        p.grad /= world_size
    optimizer.step()
    return mean_loss.item()
# EXERCISE:     # YOUR CODE HERE: copy broken_train_step's body and fix it
# EXERCISE:     raise NotImplementedError("copy broken_train_step here and fix it")
# END SOLUTION


def ring_sum(rank, world_size, tensor):
    """broken_ring_sum, fixed: every rank ends with the sum of all ranks' tensors, on any number of ranks."""
# BEGIN SOLUTION
    left, right = (rank - 1) % world_size, (rank + 1) % world_size
    total, passing = tensor.clone(), tensor.clone()
    for step in range(world_size - 1):
        with comm.phase("ring", step=step):
            arriving = torch.empty_like(passing)
            sending = comm.isend(passing, dst=right)   # on round the ring: the left neighbour receives from us
            comm.recv(arriving, src=left)
            sending.wait()
        total += arriving
        passing = arriving
    return total
# EXERCISE:     # YOUR CODE HERE: copy broken_ring_sum's body and fix it
# EXERCISE:     raise NotImplementedError("copy broken_ring_sum here and fix it")
# END SOLUTION


def make_replica(rank, world_size):
    """broken_make_replica, fixed."""
# BEGIN SOLUTION
    torch.manual_seed(1000 + rank)                   # kept: each rank still draws its own samples
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    with torch.no_grad():                            # rank 0's weights, to every other rank
        for p in model.parameters():
            if rank == 0:
                for other in range(1, world_size):
                    comm.send(p, dst=other)
            else:
                comm.recv(p, src=0)
    return model
# EXERCISE:     # YOUR CODE HERE: copy broken_make_replica's body and fix it
# EXERCISE:     raise NotImplementedError("copy broken_make_replica here and fix it")
# END SOLUTION

# %% [markdown]
# ## The grader

# %%
report = check_find_the_bug(diagnosis, train_step, ring_sum, make_replica)
