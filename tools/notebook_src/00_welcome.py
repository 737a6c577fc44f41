# %% [markdown]
# # 00 · Welcome: training one network on many GPUs
#
# Plain PyTorch code uses **one** GPU, even on a machine with eight (claim **R8** of the source texts).
# This course is about using all of them, and what that costs.
#
# In this course each "GPU" is a **process**, called a [rank](../docs/glossary.md#rank). The ranks run real
# `torch.distributed` code. On a laptop they run on the CPU and send each other tensors through
# *[gloo](../docs/glossary.md#gloo-and-nccl)*, PyTorch's library for that. On GPUs the same code runs over NCCL.
# Nothing is simulated unless the text says so.
#
# **How to use the course**
# 1. Run the cells in order with Shift+Enter. The first code cell holds the `parameters`. Their defaults are
#    small, so each chapter runs in seconds. Raise them to see bigger effects.
# 2. Chapters 01–09 each end with a graded exercise. Your copy is in `exercises/`, a worked one in
#    `solutions/`. Grade it with its grading cell, or from a terminal:
#    `make grade NB=exercises/01_ring_allreduce.ipynb`. Your file is never changed.
# 3. If something looks wrong with your machine, run `coursekit doctor` in a terminal.
# 4. A linked term leads to the [glossary](../docs/glossary.md). It gives a one-line definition, the Russian and
#    Vietnamese names, and the chapter that teaches it.
#
# <details><summary>On GPUs</summary>
#
# With at least as many GPUs as ranks, a launch picks NCCL for GPU tensors, one GPU per rank (`cuda:rank`).
# CPU tensors still go through gloo. The examples in this chapter use CPU tensors, so they run anywhere.
# </details>

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
# ## 1. One GPU by default (R8)
#
# What does plain PyTorch do with the GPUs it does not use?
#
# A model and its tensors live on *one* device unless you say otherwise. `model.to("cuda")` means `cuda:0`.
# Below, a small network trains for three steps. Hooks note, for every layer's forward and every gradient,
# which process computed it and on which device it lives. That covers parameters, gradients and
# [activations](../docs/glossary.md#activations), the outputs each layer keeps for backward.

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
# **Takeaway:** one process on one device did all 3 steps' work.
#
# No [process group](../docs/glossary.md#process-group) exists to share it with. On a machine with 8 GPUs the
# first line would read `cuda:0`, and the other seven GPUs would do nothing. The rest of the course changes that.

# %% [markdown]
# ## 2. Your first program on several ranks
#
# How do several processes work on one job?
#
# `coursekit.launch(fn, world_size)` starts `world_size` ranks; that number is the
# [world size](../docs/glossary.md#world-size). Each rank runs `fn(rank, world_size)`, and `launch` returns what
# each one returned, in rank order. The function can live right here in the cell. Inside it,
# `torch.distributed` is ready. `dist.all_reduce` sums a tensor over all ranks and gives every rank the sum:
# that is an [all-reduce](../docs/glossary.md#all-reduce).

# %% tags=["nbval-check-output"]
def hello(rank, world_size):
    value = torch.tensor([rank + 1.0])
    dist.all_reduce(value)  # every rank ends with 1 + 2 + ... + world_size
    print(f"I am rank {rank} of {world_size}; the sum over all ranks is {value.item():g}")
    return value.item()


results = coursekit.launch(hello, WORLD_SIZE, output="ordered")
print("returned:", results)

# %% [markdown]
# **Takeaway:** every rank started with its own number and ended with the same sum.
#
# What a rank prints comes back with its rank in front. By default each line appears the moment it is
# printed, so a progress bar on rank 0 moves while the ranks train. `output="ordered"`, used above, holds the
# lines back and shows them rank by rank at the end.
#
# ## 3. When a rank fails or hangs
#
# What happens when one rank goes wrong? A rank that raises stops all the others at once, and you get its
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
# A rank that waits forever, here for a message no one sends, is stopped at the timeout. The error names
# the rank and the line it was stuck on.

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
# **Takeaway:** a failing rank never leaves the others hanging. You get an error that names the rank, and
# chapter 09 teaches how to read it.
#
# ## 4. Warm ranks for interactive work
#
# Starting ranks takes a fraction of a second. A widget that reruns a distributed function on every slider
# move needs an answer in milliseconds. `Cluster` keeps the ranks running between calls.

# %%
import time

with coursekit.Cluster(WORLD_SIZE) as cluster:
    print("hello through the cluster:", cluster.run(hello))
    start = time.perf_counter()
    for _ in range(20):
        cluster.run(lambda rank, world_size: rank)
    print(f"one warm round trip to {WORLD_SIZE} ranks: {(time.perf_counter() - start) / 20 * 1e3:.2f} ms")

# %% [markdown]
# **Takeaway:** a warm round trip to every rank costs under a millisecond here, fast enough for a slider.
#
# ## 5. Four ways to share the work (R8, P1, P6)
#
# How can several GPUs share one training job? The source texts name four strategies (**R8**) in two
# families (**P1**).
#
# * Split the **data**. In [data parallelism](../docs/glossary.md#data-parallelism) every GPU holds the whole
#   model and trains on its own slice of the batch.
# * Split the **model**, when it does not fit one GPU. In
#   [model parallelism](../docs/glossary.md#model-parallelism) each GPU holds whole layers. In
#   [tensor parallelism](../docs/glossary.md#tensor-parallelism) every weight matrix is cut into pieces.
# * [**Pipeline** parallelism](../docs/glossary.md#pipeline-parallelism) mixes both. Each GPU holds layers, and
#   the batch is cut into [micro-batches](../docs/glossary.md#micro-batch) that flow through them. The GPUs idle
#   less than in a chain, but some idle time remains: the [bubble](../docs/glossary.md#bubble) (**P7**).
#
# Libraries such as DeepSpeed and Colossal-AI combine them into [hybrids](../docs/glossary.md#hybrid-parallelism).
# The figure below is our own version of the source's Figure 1.1 (**P6**). It is drawn from the plan of who
# holds what; colour says which GPU holds it.

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
# - **Model** parallelism (chapter 03): GPU2 can only start when GPU1 is done. The GPUs form a chain.
# - **Data** parallelism (chapter 02): every GPU holds the *whole* model, so it fails when the model does not
#   fit. The GPUs must also combine their gradients (chapter 01).
# - **Tensor** parallelism (chapter 05): each matrix product is spread over all GPUs, which must talk inside
#   every layer.
# - **Pipeline** parallelism (chapter 04): the empty cells at the start and the end are bubbles, time in which
#   a GPU waits.
#
# **Takeaway:** the data-parallel GPUs each hold everything; the other three strategies give each GPU a part
# of the model.
#
# **P2:** none of this is specific to GPUs. The same ideas apply to TPUs and other
# [accelerators](../docs/glossary.md#accelerator). Only the communication library changes: NCCL for NVIDIA
# GPUs, gloo for CPUs, XLA [collectives](../docs/glossary.md#collective) on TPUs. The algorithms stay the same.
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
# | 07 | expert parallelism: many experts, tokens sent to theirs and back | — |
# | 08 | choosing a strategy: a memory and time model, a planner, a calculator | P1, P8, P10 |
# | 09 | debugging: hangs, crashes and silent divergence, made on purpose and found | R2 |
# | 10 | the capstone: one trainer for every layout, under `torchrun` | P1, P8, P9 |
#
# Next: `01_gradient_sync.ipynb`.
