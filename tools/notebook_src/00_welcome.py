# %% [markdown]
# # 00 · Welcome: training one network on many GPUs
#
# By default, deep-learning code uses **one** GPU, even on a machine that has eight (claim **R8** of the
# source texts). This course is about using all of them, and about what that costs.
#
# Every "GPU" in this course is a **process** with `torch.distributed` initialised. On a laptop the
# processes run on the CPU and talk through *[gloo](../docs/glossary.md#gloo-and-nccl)*. With at least as many GPUs as [ranks](../docs/glossary.md#rank), a launch picks
# *NCCL* by default, one GPU per process (`cuda:rank`), and the same code runs there once its tensors are
# on the rank's GPU; the examples in this chapter use CPU tensors, which need gloo (`backend="gloo"`).
# Nothing here is a simulation unless it says so: every measurement comes from a real run (the figure
# of the four strategies is drawn from a plan, and says so), every formula is checked against a count.
#
# **How to use the course**
# 1. Run the cells in order (Shift+Enter). Each chapter starts with a `parameters` cell: the defaults are
#    small so that everything runs in seconds on a laptop; raise them to see real effects.
# 2. Chapters 01–08 each have a graded exercise in `exercises/` (your copy to edit) and a worked solution
#    in `solutions/`. Grade your work with the grading cell, or from a terminal:
#    `coursekit grade exercises/01_ring_allreduce.ipynb` (it grades a copy; your file is never touched).
# 3. If something looks wrong with your machine, run `coursekit doctor` in a terminal.
# 4. A linked term leads to the [glossary](../docs/glossary.md): every term of the course with a one-line
#    definition, its Russian and Vietnamese names (the source texts' own words where they have one) and
#    the chapter that teaches it.

# %% tags=["parameters"]
# Parameters: small by default so the notebook runs in seconds; raise them freely.
WORLD_SIZE = 4      # number of ranks ("GPUs") for the hello examples
N_GPUS_FIGURE = 2   # GPUs in the strategy figure (the slider changes it)

# %%
# %matplotlib inline
import os

import torch
import torch.distributed as dist

import coursekit

print("torch", torch.__version__, "| coursekit", coursekit.__version__)
print("GPUs visible:", torch.cuda.device_count() if torch.cuda.is_available() else 0, "| CPU cores:", os.cpu_count())
print("backend a launch of", WORLD_SIZE, "ranks will use:", coursekit.resolve_backend("auto", WORLD_SIZE))

# %% [markdown]
# ## One GPU by default (R8)
#
# A model and its tensors live on *one* device unless you say otherwise. Even with several GPUs,
# `model.to("cuda")` means `cuda:0`, and the other GPUs sit idle. Let us measure it rather than say it:
# a plain training step of a small network, watched by hooks that note, for every layer's forward and
# every parameter's gradient, **which process** computed it and **on which device** each tensor lives
# (parameters, gradients, [activations](../docs/glossary.md#activations)).

# %%
device = "cuda" if torch.cuda.is_available() else "cpu"   # what plain code picks: the first GPU, or the CPU
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
seen = []                                                # (what, process id, device), noted by the hooks
for layer in model:
    layer.register_forward_hook(lambda layer, inputs, output: seen.append(("forward", os.getpid(), output.device)))
for param in model.parameters():
    param.register_post_accumulate_grad_hook(lambda p: seen.append(("gradient", os.getpid(), p.grad.device)))
for step in range(3):                                    # a plain training loop (SGD, written out)
    x = torch.randn(4, 8, device=device)
    loss = model(x).square().mean()
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for param in model.parameters():
            param -= 0.1 * param.grad
devices = {str(d) for _, _, d in seen} | {str(p.device) for p in model.parameters()}
print(f"device: {sorted(devices)} | GPUs visible: {torch.cuda.device_count()}")

# %% tags=["nbval-check-output"]
print(f"forwards and gradients computed in 3 steps: {len(seen)} "
      f"({sum(w == 'forward' for w, *_ in seen)} layer forwards, {sum(w == 'gradient' for w, *_ in seen)} gradients)")
print("processes that computed them:", len({pid for _, pid, _ in seen}))
print("devices holding parameters, gradients and activations:", len(devices))
print("torch.distributed initialised (any other process to share the work with?):", dist.is_initialized())

# %% [markdown]
# One process, one device, no [process group](../docs/glossary.md#process-group): every one of those computations ran here. On a machine
# with 8 GPUs the first line would read `cuda:0` and `GPUs visible: 8` — and the other seven would do
# nothing. The rest of the course is about the code that changes that.

# %% [markdown]
# ## Your first multi-rank program
#
# `coursekit.launch(fn, world_size)` runs `fn(rank, world_size)` on `world_size` ranks (the [world size](../docs/glossary.md#world-size)) and returns what
# each returned, in rank order. The function can live right here in the cell. Inside it,
# `torch.distributed` is ready: `dist.all_reduce` sums a tensor over all ranks (an [all-reduce](../docs/glossary.md#all-reduce)).

# %% tags=["nbval-check-output"]
def hello(rank, world_size):
    value = torch.tensor([rank + 1.0])
    dist.all_reduce(value)  # every rank ends with 1 + 2 + ... + world_size
    print(f"I am rank {rank} of {world_size}; the sum over all ranks is {value.item():g}")
    return value.item()


results = coursekit.launch(hello, WORLD_SIZE, output="ordered")
print("returned:", results)

# %% [markdown]
# What ranks print comes back prefixed with the rank. By default each line appears the moment its rank
# prints it (a progress bar on rank 0 moves while the ranks train), so lines of different ranks arrive
# in whatever order they were printed; `output="ordered"`, used above, holds them back and shows them
# rank by rank when the launch ends. A rank that raises stops all the others at once, and you get its
# traceback:

# %% tags=["nbval-check-output"]
def fails_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("something went wrong on rank 1")
    return rank


try:
    coursekit.launch(fails_on_rank_one, 2)
except coursekit.RankError as error:
    print(f"RankError from rank {error.rank}:", str(error).strip().splitlines()[-1])

# %% [markdown]
# And a rank that waits forever (a `recv` that no one answers) is stopped at the timeout, with the
# name of the rank and the line it was stuck on. Such bugs get a chapter of their own (08).

# %%
def forgot_to_send(rank, world_size):
    buffer = torch.zeros(1)
    if rank == 1:
        dist.recv(buffer, src=0)  # rank 0 never sends
    return rank


try:
    coursekit.launch(forgot_to_send, 2, timeout=2)
except coursekit.LaunchTimeout as error:
    print(error)

# %% [markdown]
# ## Warm ranks for interactive work: `Cluster`
#
# Starting ranks takes a fraction of a second; a widget that re-runs a distributed function on every
# slider move wants an answer in milliseconds. `Cluster` keeps the ranks running between calls.

# %%
import time

with coursekit.Cluster(WORLD_SIZE) as cluster:
    print("hello through the cluster:", cluster.run(hello))
    start = time.perf_counter()
    for _ in range(20):
        cluster.run(lambda rank, world_size: rank)
    print(f"one warm round trip to {WORLD_SIZE} ranks: {(time.perf_counter() - start) / 20 * 1e3:.2f} ms")

# %% [markdown]
# ## Four ways to share the work (R8, P1, P6)
#
# The source texts name four strategies (**R8**) in two families (**P1**): split the **data**
# ([data parallelism](../docs/glossary.md#data-parallelism): every GPU has the whole model and a slice of the batch),
# or split the **model** when it does not fit one GPU ([model parallelism](../docs/glossary.md#model-parallelism): whole
# layers per GPU; [tensor parallelism](../docs/glossary.md#tensor-parallelism): every weight matrix cut into pieces).
# [**Pipeline** parallelism](../docs/glossary.md#pipeline-parallelism) mixes both: layers per GPU as in model parallelism,
# and [micro-batches](../docs/glossary.md#micro-batch) as in data parallelism, so the GPUs idle less than in a chain
# ([bubbles](../docs/glossary.md#bubble) remain, **P7**). Libraries such as DeepSpeed and Colossal-AI combine them into
# [hybrids](../docs/glossary.md#hybrid-parallelism).
#
# The figure below (a Figure 1.1 of our own, **P6**) is drawn by `coursekit.viz.strategies` from the
# plan of who holds what. Colour = which GPU holds it. Here with 4 GPUs:

# %%
from coursekit.viz.strategies import draw_strategies

draw_strategies(n_gpus=4);

# %% [markdown]
# The same figure, live: move the slider.

# %%
from coursekit.widgets.strategies import strategy_explorer

strategy_explorer(n_gpus=N_GPUS_FIGURE)

# %% [markdown]
# Things to notice, each the subject of a chapter:
# - **model** parallelism (ch. 03): GPU2 can only start when GPU1 is done: a chain.
# - **data** parallelism (ch. 02): every GPU holds the *whole* model — it stops working when the
#   model does not fit — and the gradients must be combined (ch. 01).
# - **tensor** parallelism (ch. 05): each matrix multiplication is spread over all GPUs, which must
#   talk inside every layer.
# - **pipeline** parallelism (ch. 04): the empty cells at the start and the end are *bubbles*, time in
#   which a GPU waits.
#
# **P2:** none of this is specific to GPUs. The same ideas apply to TPUs and other [accelerators](../docs/glossary.md#accelerator): only
# the communication library changes (NCCL for NVIDIA GPUs, gloo for CPUs as here, XLA [collectives](../docs/glossary.md#collective) on
# TPUs); the algorithms in this course do not.
#
# ## The chapters
#
# | # | chapter | claims |
# |---|---|---|
# | 01 | how GPUs share what they learn: naive, parameter-server and ring all-reduce | R1–R7 |
# | 02 | data parallelism, from gradient averaging to ZeRO | P4, R2 |
# | 03 | model parallelism: layers on different GPUs | P3 |
# | 04 | pipeline parallelism: micro-batches and bubbles | P7, P10 |
# | 05 | tensor parallelism, and data × tensor | P5, P6, P8, P10 |
# | 06 | sequence parallelism: exact and inexact | P9 |
# | 07 | choosing a strategy: a memory and time model checked against measurements, a planner, a calculator | P1, P8, P10 |
# | 08 | debugging distributed programs: hangs, crashes, mismatched collectives and silent divergence, made on purpose and diagnosed | R2 |
# | 09 | the capstone: one trainer for every layout, pipeline × data × sequence × tensor on one mesh, under `torchrun` | P1, P8, P9 |
#
# Next: `01_gradient_sync.ipynb`.
