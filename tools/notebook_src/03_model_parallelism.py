# ci_parameters: {"TIMELINE_STEPS": 4, "CUT_ITERATIONS": 2}
# %% [markdown]
# # 03 · Model parallelism: layers on different GPUs
#
# A model too big for one GPU can still train: put different layers on different GPUs. This is
# **[model parallelism](../docs/glossary.md#model-parallelism)**, claim **P3** of the source texts. The source's example has two
# layers: the hidden layer on GPU 1, the output layer on GPU 2. The catch is that the GPUs take turns. They form
# a chain.
#
# This chapter runs that example on real ranks. It shows what the split buys, which is memory, and what it
# costs: messages and idle time. Then it shows why chapters 04 and 05 exist.
#
# <details><summary>How this chapter runs</summary>
#
# As in every chapter, a "GPU" is a process that talks through gloo on the CPU. The code is
# `coursekit.parallel.pipeline.model`. Raise `TOKENS` in the parameters cell to make every step heavier.
# </details>

# %% tags=["parameters"]
# Parameters: small by default so the notebook runs in well under a minute; raise them freely.
PROOF_STEPS = 3            # optimiser steps compared with one process
TOKENS = 512               # tokens per step in the timed runs (sections 3 and 5)
TIMELINE_STEPS = 6         # traced steps (the first is warm-up)
MICRO_BATCHES = 4          # micro-batches of the pipeline in section 5
CUT_ITERATIONS = 7         # paired repeats of section 5's four runs
MEMORY_RANKS = [2, 3, 4]   # world sizes for the course transformer
GLOBAL_BATCH = 8           # sequences per step for the transformer

# %%
# %matplotlib inline
import os

import matplotlib.pyplot as plt
import torch
import torch.nn as nn

import coursekit
from coursekit import comm
from coursekit.models import LanguageData, TeacherData, count_parameters, tiny_mlp, tiny_transformer
from coursekit.parallel.pipeline import layer_costs, layers, partition, split  # registers "model"
from coursekit.experiments import TokenData, chain_shares, compare_cuts, token_mlp
from coursekit.measure.trace import overlap_length, union_length
from coursekit.train import train
from coursekit.measure.verify import compare
from coursekit.viz.timeline import draw_timelines

print("torch", torch.__version__, "| CPU cores:", os.cpu_count())

# %% [markdown]
# ## 1. Two layers, two GPUs
#
# How do you cut a network into pieces that live on different GPUs?
#
# `layers(model)` lists the layers whose composition is the model's forward. `split(model, 2)` cuts that list into
# two contiguous **[stages](../docs/glossary.md#stage)**. Rank 0 gets stage 0 and plays GPU 1; rank 1 gets stage 1. Here is the
# course's MLP with two layers:

# %% tags=["nbval-check-output"]
two_layers = lambda: tiny_mlp(n_layers=2, seed=0)  # noqa: E731  (every rank builds the same weights)
net = two_layers()
for name, layer in layers(net):
    print(f"layer {name:<12} {sum(p.numel() for p in layer.parameters()):>5} parameters")
for rank, stage in enumerate(split(net, 2)):
    print(f"stage {rank} on rank {rank} (GPU {rank + 1}):", stage)

# %% [markdown]
# One training step then has three parts:
#
# * **Forward.** Rank 0 computes the hidden [activations](../docs/glossary.md#activations) and sends them to rank 1. Rank 1
#   computes the output and the loss.
# * **Backward.** Rank 1's backward also gives the gradient of the loss with respect to the activations it
#   received. Rank 1 sends that gradient back, and rank 0 continues the chain rule from it.
# * **Step.** Each rank updates only the weights it holds.
#
# Autograd never crosses a process. The two messages *are* the chain rule across the cut. Writing them is this
# chapter's exercise.
#
# ## 2. Equal to one process
#
# Is the split model still the same model? Two ranks train the two-layer network for `PROOF_STEPS` Adam steps.
# One process trains the whole network on the same batches. `compare` checks the output, the loss, every gradient
# and every weight at every step.

# %%
def proof(rank, world_size):
    return train(rank, world_size, "model", model=two_layers, data=TeacherData(), steps=PROOF_STEPS,
                 global_batch=32, lr=1e-2, count_traffic=True)


proof_runs = coursekit.launch(proof, 2)
single = train(0, 1, "single", model=two_layers, data=TeacherData(), steps=PROOF_STEPS, global_batch=32, lr=1e-2)
report = compare(single["records"], [run["records"] for run in proof_runs])
print(report.table())

# %% tags=["nbval-check-output"]
print(f"{PROOF_STEPS} steps on 2 ranks equal to one process (loss, output, every gradient, every weight):",
      report.ok)
for rank, run in enumerate(proof_runs):
    print(f"rank {rank} holds and updates:", sorted(run["records"][-1]["params"].tensors))
print("losses:", "same on both ranks" if proof_runs[0]["losses"] == proof_runs[1]["losses"] else "DIFFERENT")

# %% [markdown]
# **Takeaway:** two ranks compute exactly what one process computes, step for step.
#
# The table's differences are zero, not rounding: the same operations run on the same numbers, in the same
# order. Data parallelism, in chapter 02, sums gradients in another order and agrees only up to rounding.
#
# ## 3. The chain: one rank works, the other waits (P3)
#
# While one GPU computes, what does the other do? To see it, the layers must cost more than the messages
# between them. So the model here has the shape of a small language model: an embedding of 4,096 tokens,
# four MLP blocks 256 → 1,024 → 256 wide, and an output head back to 4,096 tokens. It trains on `TOKENS` tokens
# a step. `split` cuts it where the parameters balance: the embedding and two blocks on rank 0, two blocks and
# the head on rank 1.
#
# Each rank gets one row of the timeline: forward, backward and the optimiser step. A wait is grey; the
# orange lane below holds the sends.

# %%
token_data = TokenData()


def traced(rank, world_size):
    return train(rank, world_size, "model", model=token_mlp, data=token_data, steps=TIMELINE_STEPS,
                 global_batch=TOKENS, record=False, trace=True)["spans"]


spans = coursekit.launch(traced, 2)[0]
forwards = {r: sorted(s.start for s in spans if s.kind == "forward" and s.rank == r) for r in (0, 1)}
begin = forwards[0][1]                                  # from step 1 on: step 0 is warm-up
end = max(s.end for s in spans if s.kind == "optimizer")
steady = [s for s in spans if s.start >= begin]
last_two = [s for s in spans if s.start >= forwards[0][-2] and (s.kind != "comm" or s.name.startswith("send"))]
fig = draw_timelines({f"model parallel, 2 ranks: the last two of {TIMELINE_STEPS} steps": last_two},
                    hidden_share=False)  # a chain has no communication to hide: it waits
plt.show()

# %% [markdown]
# How much of each step did each rank compute, and how much was it idle? And was it idle because the other
# rank was computing, or for the messages? The cell below measures every step but the first, which warms up.

# %%
window = end - begin
shares = chain_shares(steady, begin, end)
for r, share in shares.items():
    print(f"rank {r} (GPU {r + 1}): computing {share['computing']:5.1%}, optimiser step {share['optimizer']:5.1%}, "
          f"idle {share['idle']:5.1%} of the step: waiting while the other rank computes {share['waiting']:5.1%}, "
          f"messages and the loop {share['other']:5.1%}")
compute = {r: [(s.start, s.end) for s in steady if s.rank == r and s.kind in ("forward", "backward")]
           for r in (0, 1)}
both = overlap_length(compute[0], compute[1]) / window
print(f"both ranks computing at the same time: {both:.1%} of the step")

# %% [markdown]
# **Takeaway:** each rank sat idle while the other computed, and the two almost never computed at the same
# moment; the messages took a small part of the step.
#
# Rank 1 cannot start its forward before rank 0's activations arrive. Rank 0 cannot start its backward before
# rank 1's gradient arrives. At the end of the step, the rank that finished first waits for the other.
#
# <details><summary>What counts as idle</summary>
#
# Idle is all the time a rank is not in forward, backward or its optimiser step. A receive is a wait, drawn in
# grey: most of it passes while the other rank computes. The rest of the idle time is the messages themselves,
# the end-of-step sync, where the rank that is done waits for the other's loss, and loop work that one process
# does too: building the batch, `zero_grad`, Python between calls. On this 2-core machine two ranks get a core
# each; other programs on the cores stretch every span, but the order of the chain stays.
# </details>
#
# Is a chain at least faster? Here is each rank's computing time per step, and the step itself.

# %%
n_steps = len(forwards[0]) - 1
per_step = {r: union_length(compute[r]) / n_steps * 1e3 for r in (0, 1)}
print(f"per step: rank 0 computed {per_step[0]:.1f} ms, rank 1 {per_step[1]:.1f} ms (both at once {both:.1%} of the "
      f"time); summed: {per_step[0] + per_step[1]:.1f} ms of computing in a step of {window / n_steps * 1e3:.1f} ms")
print(f"rank 1 computed {per_step[1] / per_step[0]:.2f}x rank 0's time, with about as many parameters")

# %% [markdown]
# The two stages together do one process's work, one after the other. So a step lasts about their sum,
# plus the messages and the waits. With G equal stages, each GPU computes at most about 1/G of the step.
#
# **Takeaway:** model parallelism does not make a step faster; it is there for memory.
#
# <details><summary>Why rank 1 computes longer than rank 0</summary>
#
# Each rank holds about 2.1 million parameters, but not the same work. The embedding holds a million of rank
# 0's and only looks rows up. The head holds a million of rank 1's and multiplies every token by all of them,
# then computes the loss over 4,096 classes. Section 5 cuts by time instead.
# </details>
#
# ## 4. What it buys: each rank holds only its layers
#
# How much memory does each rank save? Take the course transformer. `layers()` sees four layers: the
# embedding, two blocks, and the final norm with the output head. The head is **tied** to the token embedding:
# one 16 × 64 matrix is used first and last. So that matrix lives on the first and on the last stage, and the
# two sum its gradients after backward, as Megatron-LM does.
#
# The cell below counts each layer's parameters.

# %%
transformer = tiny_transformer(seed=0)
psi = count_parameters(transformer)
names = [name for name, _ in layers(transformer)]
by_params = layer_costs(transformer, "params")
print(f"{'layer':<10} {'parameters':>10}")
for name, p in zip(names, by_params):
    print(f"{name:<10} {p:>10,.0f}")
print(f"Ψ = {psi:,} distinct parameters (the tied 16×64 matrix counts in both layers that use it above)")

# %% [markdown]
# Now the transformer trains on 2, 3 and 4 ranks. Each rank keeps only its stage's parameters, and `train`
# measures the bytes it holds. The table compares them with 4 bytes times the parameters of the stage's layers.

# %%
STAGED_STEPS = 3


def staged(rank, world_size, sizes):
    result = train(rank, world_size, "model", model="transformer", steps=STAGED_STEPS, global_batch=GLOBAL_BATCH,
                   layers_per_stage=sizes, record=False, count_traffic=True)
    return result["memory"], result["peak_memory"], result["traffic"]


def stage_bytes(sizes):
    """4 bytes per distinct parameter of each stage's layers."""
    stages, out = split(tiny_transformer(seed=0), len(sizes), layers_per_stage=sizes), []
    for stage in stages:
        out.append(4 * sum(p.numel() for p in {id(p): p for p in stage.parameters()}.values()))
    return out


cuts = {g: partition(by_params, g) for g in MEMORY_RANKS}
runs = {g: coursekit.launch(staged, g, cuts[g], timeout=300) for g in MEMORY_RANKS}

# %% tags=["nbval-check-output"]
print(f"4Ψ = {4 * psi:,} bytes of parameters in one process\n")
print(f"{'ranks':>5}  {'layers per stage':<16} {'parameter bytes per rank (measured)':<44} formula?  largest / (4Ψ/G)")
for g in MEMORY_RANKS:
    sizes = cuts[g]
    held = [run[0]["params"] for run in runs[g]]
    print(f"{g:>5}  {str(sizes):<16} {str(held):<44} {'exact' if held == stage_bytes(sizes) else 'NO':<9} "
          f"{max(held) / (4 * psi / g):.2f}")

# %% [markdown]
# Parameters are not all a rank holds. Training also keeps a gradient per parameter (4 bytes) and Adam's two
# moments (8 bytes), measured at their peak during the step. And each stage keeps the activations its layers
# save for backward. The cell below measures those with `torch.autograd.graph.saved_tensors_hooks`, for one batch
# of `GLOBAL_BATCH` sequences.

# %%
def activation_bytes(stages, x):
    """Bytes autograd saves for backward in each stage's forward (each storage once, weights excluded)."""
    out = []
    for stage in stages:
        weights = {p.untyped_storage().data_ptr() for p in stage.parameters()}
        saved = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in weights:
                saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        x = x.detach().requires_grad_(x.is_floating_point())
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            x = stage(x)
        out.append(sum(saved.values()))
    return out


tokens = LanguageData().batch(0, GLOBAL_BATCH)[0]
whole = activation_bytes([nn.Sequential(*(layer for _, layer in layers(tiny_transformer(seed=0))))], tokens)[0]
kinds = ("params", "grads", "optimizer")
print(f"one process: {4 * psi:,} B parameters, {4 * psi:,} B gradients, {8 * psi:,} B Adam state, "
      f"{whole:,} B activations\n")
print(f"{'ranks':>5}  {'rank':>4}  {'layers':<18} {'params':>8} {'grads':>8} {'Adam':>8} {'activations':>12} "
      f"{'total':>9}  of one process")
for g in MEMORY_RANKS:
    sizes = cuts[g]
    acts = activation_bytes(split(tiny_transformer(seed=0), g, layers_per_stage=sizes), tokens)
    start = 0
    for r, run in enumerate(runs[g]):
        held = [run[1][k] for k in kinds] + [acts[r]]
        print(f"{g:>5}  {r:>4}  {', '.join(names[start:start + sizes[r]]):<18} "
              + " ".join(f"{b:>8,}" for b in held[:3]) + f" {held[3]:>12,} {sum(held):>9,}  "
              f"{sum(held) / (16 * psi + whole):.0%}")
        start += sizes[r]

# %% [markdown]
# **Takeaway:** each rank holds exactly its own layers' share of everything, so memory splits only as finely
# as the layers do.
#
# A rank can hold no less than its largest layer. Here a block is about half the model. So on 4 ranks the two
# block ranks each hold about twice an even share, and the embedding and head ranks hold little. Finer cuts need
# smaller layers, or cutting inside the layers: tensor parallelism, chapter 05.
#
# ## 5. Where to cut: balance the time
#
# Which layers should go together? In a chain the step is the sum of all stages, whatever the cut. In a
# pipeline, chapter 04, the stages work at the same time, so the slowest stage sets the pace. So the cut should
# balance time, not parameters.
#
# `partition(costs, G)` finds the contiguous cut whose largest stage is as small as possible. It works for any
# cost per layer, with a small dynamic program:

# %%
coursekit.show(partition)

# %% [markdown]
# On section 3's model the two costs disagree. The embedding and the head hold the same million parameters.
# The embedding only looks rows up; the head multiplies every token by all of its weights. So the cut by
# parameters gives the head's stage about twice the work of the other. `layer_costs(model, "time")` times each
# layer's forward and backward instead, and the cut by time moves one block across.
#
# The cell below cuts the model both ways. It runs each cut as the chain, and as a pipeline of `MICRO_BATCHES`
# micro-batches, where the stages work at once: four runs, taken in turn `CUT_ITERATIONS` times.

# %%
comparison = compare_cuts(tokens=TOKENS, micro_batches=MICRO_BATCHES, iterations=CUT_ITERATIONS)
print(comparison.table())

# %% [markdown]
# In the chain, the cut only moves the idle time from one rank to the other: the step stays the sum of the
# stages. In the pipeline, the slowest stage sets the pace, and the cut by time makes it faster. It pays with
# memory: the cut by time leaves more parameters on rank 0.
#
# **Takeaway:** cut by measured time, not by parameters: in a chain both cuts take about as long, and in a
# pipeline the cut by time gives the shorter step.
#
# <details><summary>How the times were measured</summary>
#
# Each layer is timed on one rank alone: the least of 5 runs of its forward and backward on the whole batch, in
# the CPU time of the thread that computes, so other processes do not count. A step is forward and backward of
# `TOKENS` tokens, the slower rank's wall-clock time; the optimiser step, the same work for every run, is left
# out. The four runs take turns within each iteration, after a barrier each, so whatever else slows the machine
# slows all four; the ratios are per iteration, the median with the lowest and highest. A rank's idle share is
# the part of the step it spent outside its forward and backward. The pipeline is GPipe: all the forwards, then
# all the backwards. `train(..., "model", partition_by="time")` measures the layers on rank 0 and gives every
# rank the same cut; `layers_per_stage=[...]` sets it by hand.
# </details>
#
# ## 6. What it costs: two messages per cut
#
# How much does the chain send? Each cut carries the activations forward and their gradient back: batch ×
# sequence × d_model elements each way. The tied matrix adds its gradient, sent each way between the first and
# the last stage. So per step:
#
# traffic = 2 (G − 1) · b · s · d  +  2 · V · d
#
# `comm.record()` counts every element on every rank:

# %% tags=["nbval-check-output"]
seed_traffic = comm.Traffic.merge([run["traffic"] for run in proof_runs])
b, h = 32, two_layers().layers[0].out_features  # the batch `proof` trains on, the hidden width
print(f"two-layer network, 2 ranks: {seed_traffic.total // PROOF_STEPS:,} elements per step, formula 2·b·h = "
      f"2·{b}·{h} = {2 * b * h:,}: {'exact' if seed_traffic.total == PROOF_STEPS * 2 * b * h else 'NO'}; "
      f"links {sorted(seed_traffic.links)}")
s, d, V = LanguageData().seq_len - 1, transformer.tok_emb.embedding_dim, transformer.tok_emb.num_embeddings
print(f"\ncourse transformer, b = {GLOBAL_BATCH}, s = {s}, d = {d}, V = {V}:")
for g in MEMORY_RANKS:
    traffic = comm.Traffic.merge([run[2] for run in runs[g]])
    formula = 2 * (g - 1) * GLOBAL_BATCH * s * d + 2 * V * d
    links = sorted(traffic.links)
    print(f"{g} ranks: {traffic.total // STAGED_STEPS:>6,} elements per step, formula 2·{g - 1}·{GLOBAL_BATCH}·{s}·{d} "
          f"+ 2·{V}·{d} = {formula:>6,}: {'exact' if traffic.total == STAGED_STEPS * formula else 'NO'}; links {links}")
two = comm.Traffic.merge([run[2] for run in runs[2]]).total // STAGED_STEPS
print(f"\n(data parallelism's ring all-reduce of the gradients, chapter 01: 2(G − 1)Ψ = {2 * psi:,} elements per step "
      f"on 2 ranks, {2 * psi / two:.1f}x the {two:,} above)")

# %% [markdown]
# **Takeaway:** the counts match the formula exactly; the traffic grows with batch × sequence × width, not
# with the parameters.
#
# Only neighbours talk, plus the first and the last stage for the tied matrix. A block's weights never travel.
# The traffic is not the problem. The problem is the chain:
#
# * **A chain.** Stage s + 1 needs stage s's output, and stage s's backward needs stage s + 1's gradient. For one
#   batch, at most one rank computes at any moment.
# * **A bottleneck.** The step takes as long as all the stages plus the messages. More GPUs add memory, never
#   speed, and the slowest stage holds everyone.
#
# Two ways out, each a chapter:
#
# * **Chapter 04, pipeline parallelism (P7):** cut the batch into micro-batches. While stage 1 works on one,
#   stage 0 starts the next. Some idle time remains at the start and end of each step: the bubble.
# * **Chapter 05, tensor parallelism (P5, P10):** cut *inside* each layer, so every GPU computes every layer at
#   the same time. That is why the source recommends tensor over model parallelism for a model too large for one
#   GPU (**P10**). The price is communication inside every layer.
#
# ## 7. The same thing in PyTorch
#
# PyTorch has no separate model-parallel API. Inside one process you can place the layers yourself:
# `layer1.to("cuda:0")`, `layer2.to("cuda:1")`, and autograd follows `.to()` across devices. Across processes,
# `torch.distributed.pipelining` runs this chapter's chain. Each rank gets a `PipelineStage`, and a
# [schedule](../docs/glossary.md#pipeline-schedule) with **one micro-batch** is model parallelism. Below, the course transformer
# trains on 2 ranks both ways and is compared with one process:
#
# | coursekit | PyTorch |
# |---|---|
# | `split(model, G)`, stage r on rank r | `PipelineStage(stage, r, G, device)` |
# | `ModelParallel.run_step`: forward, send, receive, backward | `ScheduleGPipe(stage, 1, loss_fn=loss_fn, scale_grads=False)`.`step(...)` |
# | `Channel`'s shape header, once | the stage's shape inference at its first step |
# | `sum_tied_gradients` (embedding = head) | not done by torch: the same call after `step` |

# %%
def production(rank, world_size):
    config = dict(model="transformer", steps=PROOF_STEPS, global_batch=GLOBAL_BATCH, micro_batches=1)
    return {name: train(rank, world_size, name, **config, **options)
            for name, options in (("model", {}), ("torch_pipeline", {"schedule": "gpipe"}))}


side_by_side = coursekit.launch(production, 2)
reference = train(0, 1, "single", model="transformer", steps=PROOF_STEPS, global_batch=GLOBAL_BATCH)["records"]
for name in ("model", "torch_pipeline"):
    times = [max(t) for t in zip(*(side_by_side[r][name]["step_times"][1:] for r in range(2)))]  # after step 0
    print(f"{name:<15} equal to one process: {compare(reference, [side_by_side[r][name]['records'] for r in range(2)]).ok}"
          f"   mean of steps 1-{len(times)}: {sum(times) / len(times) * 1e3:.1f} ms a step")

# %% [markdown]
# **Takeaway:** both versions equal one process at every step.
#
# The times are a few steps on a shared 2-core machine: the same order of magnitude, no ranking. With more
# micro-batches the same `PipelineStage`s run [GPipe](../docs/glossary.md#gpipe) and [1F1B](../docs/glossary.md#1f1b) schedules, and several
# stages per rank run [interleaved](../docs/glossary.md#interleaved-1f1b) ones: chapter 04.
#
# ## When it does not pay on a laptop
#
# The same chain on the course transformer, 64 wide, on 4 ranks with one layer each:

# %%
def small_chain(rank, world_size):
    return train(rank, world_size, "model", model="transformer", steps=TIMELINE_STEPS, global_batch=GLOBAL_BATCH,
                 record=False, trace=True)["spans"]


small = coursekit.launch(small_chain, 4)[0]
starts = sorted(s.start for s in small if s.kind == "forward" and s.rank == 0)
small_end = max(s.end for s in small if s.kind == "optimizer")
fig = draw_timelines({f"model parallel, course transformer, 4 ranks: the last two of {TIMELINE_STEPS} steps":
                      [s for s in small if s.start >= starts[-2] and (s.kind != "comm" or s.name.startswith("send"))]},
                     hidden_share=False)
plt.show()
for r, share in chain_shares([s for s in small if s.start >= starts[1]], starts[1], small_end).items():
    print(f"rank {r}: computing {share['computing']:5.1%}, idle {share['idle']:5.1%} of the step: waiting while "
          f"another rank computes {share['waiting']:5.1%}, messages and the loop {share['other']:5.1%}")

# %% [markdown]
# A 64-wide layer computes so briefly that the fixed cost of every operation, the messages and the loop take more
# of the step than the layers. Four ranks share two cores, so a rank whose turn has come can still wait for a core.

# %% [markdown]
# ## What we have
#
# * The source's example runs for real: two layers on two ranks, two messages per step, equal to one process.
# * The GPUs wait for each other (P3): each rank is idle while the others compute.
# * It buys memory: each rank holds only its layers, split as finely as the layers allow.
# * Cut by measured time: in a chain the cut moves the idle time, in a pipeline it sets the step.
# * It costs 2(G − 1)·b·s·d elements per step, plus the tied gradient, counted exactly.
#
# **Exercise** `exercises/03_model_parallel.ipynb`: write one whole step of a two-stage model, in micro-batches:
# activations forward, gradients back, each stage's backward. It is graded against one process, with every
# message counted.

