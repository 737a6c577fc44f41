# ci_parameters: {"TIMELINE_STEPS": 4, "WIDTH": 384}
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
# `coursekit.parallel.pipeline.model`. Raise `WIDTH` in the parameters cell to make the layers heavier.
# </details>

# %% tags=["parameters"]
# Parameters: small by default so the notebook runs in well under a minute; raise them freely.
PROOF_STEPS = 3            # optimiser steps compared with one process
WIDTH = 512                # the timed two-layer network: WIDTH -> WIDTH -> WIDTH (try 1024)
TIMELINE_BATCH = 256       # samples per step in the timed runs
TIMELINE_STEPS = 6         # traced steps (the first is warm-up)
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
from coursekit.parallel.pipeline import layer_costs, layers, partition, split, stage_costs  # registers "model"
from coursekit.measure.trace import busy_time, overlap_length, union_length
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
# While one GPU computes, what does the other do? To see it, the layers must take measurable time. The same
# network is made `WIDTH` wide and trained on batches of `TIMELINE_BATCH`. Each rank gets one row of the
# timeline: forward, backward and the optimiser step, and every wait in grey.

# %%
wide = lambda: tiny_mlp(n_layers=2, d_in=WIDTH, d_hidden=WIDTH, d_out=WIDTH, seed=0)  # noqa: E731
wide_data = TeacherData(d_in=WIDTH, n_classes=WIDTH)


def traced(rank, world_size):
    return train(rank, world_size, "model", model=wide, data=wide_data, steps=TIMELINE_STEPS,
                 global_batch=TIMELINE_BATCH, record=False, trace=True)["spans"]


spans = coursekit.launch(traced, 2)[0]
forwards = {r: sorted(s.start for s in spans if s.kind == "forward" and s.rank == r) for r in (0, 1)}
begin = forwards[0][1]                                  # from step 1 on: step 0 is warm-up
end = max(s.end for s in spans if s.kind == "optimizer")
steady = [s for s in spans if s.start >= begin]
last_two = [s for s in spans if s.start >= forwards[0][-2]]
fig = draw_timelines({f"model parallel, 2 ranks: the last two of {TIMELINE_STEPS} steps": last_two},
                    hidden_share=False)  # a chain has no communication to hide: it waits
plt.show()

# %% [markdown]
# How much of each step did each rank compute, and how much was it idle? The cell below measures every
# step but the first, which warms up.

# %%
window = end - begin
compute = {r: [(s.start, s.end) for s in steady if s.rank == r and s.kind in ("forward", "backward")]
           for r in (0, 1)}
idle = {}
for r in (0, 1):
    computing, stepping = union_length(compute[r]) / window, busy_time(steady, "optimizer", r) / window
    idle[r] = 1 - computing - stepping
    sync = sum(s.duration for s in steady if s.rank == r and s.kind == "idle" and s.name == "end-of-step sync")
    blocked = busy_time(steady, "idle", r)
    print(f"rank {r} (GPU {r + 1}): computing {computing:5.1%}, optimiser step {stepping:5.1%}, idle {idle[r]:5.1%} "
          f"of the step; blocked in a send or receive {(blocked - sync) / window:5.1%}, in the end-of-step sync "
          f"{sync / window:5.1%}")
both = overlap_length(compute[0], compute[1]) / window
print(f"both ranks computing at the same time: {both:.1%} of the step")
print(f"\nmeasured: rank 0 was idle {idle[0]:.0%} and rank 1 {idle[1]:.0%} of each step; the two computed "
      f"together {both:.1%} of it")

# %% [markdown]
# **Takeaway:** each rank sat idle for a large share of every step, and the two almost never computed at
# the same moment.
#
# Rank 1 cannot start its forward before rank 0's activations arrive. Rank 0 cannot start its backward before
# rank 1's gradient arrives. At the end of the step, the rank that finished first waits for the other.
#
# <details><summary>What counts as idle</summary>
#
# Idle is all the time a rank is not in forward, backward or its optimiser step. Part of it is traced, in grey:
# blocked in a send or a receive, or in the end-of-step sync, where the rank that is done waits for the other's
# loss. The rest is loop work that one process does too, such as building the batch, `zero_grad` and Python
# between calls. A non-blocking send still spends its call handing the tensor to gloo. On this 2-core machine
# two ranks get a core each; other programs on the cores stretch every span, but the order of the chain stays.
# </details>
#
# Is a chain at least faster? Here is each rank's computing time per step, and the step itself.

# %%
n_steps = len(forwards[0]) - 1
per_step = {r: union_length(compute[r]) / n_steps * 1e3 for r in (0, 1)}
print(f"per step: rank 0 computed {per_step[0]:.1f} ms, rank 1 {per_step[1]:.1f} ms (both at once {both:.1%} of the "
      f"time); summed: {per_step[0] + per_step[1]:.1f} ms of computing in a step of {window / n_steps * 1e3:.1f} ms")
print(f"two weight matrices of the same size, not the same work: rank 1 computed {per_step[1] / per_step[0]:.2f}x "
      f"rank 0's time (stage 1 computes the loss and its input's gradient; stage 0 does not need its input's)")

# %% [markdown]
# The two stages together do one process's work, one after the other. So a step lasts about their sum,
# plus the messages and the waits. With G equal stages, each GPU computes at most about 1/G of the step.
#
# **Takeaway:** model parallelism does not make a step faster; it is there for memory.
#
# <details><summary>Why rank 1 computes longer than rank 0</summary>
#
# The two weight matrices have the same size but not the same work. Stage 0's input is the data, which needs
# no gradient, so its backward skips one of its three matrix products. Stage 1 also computes the loss over
# `WIDTH` classes: a softmax and its gradient.
# </details>
#
# ## 4. What it buys: each rank holds only its layers
#
# How much memory does each rank save? Take the course transformer. `layers()` sees four layers: the
# embedding, two blocks, and the final norm with the output head. The head is **tied** to the token embedding:
# one 16 × 64 matrix is used first and last. So that matrix lives on the first and on the last stage, and the
# two sum its gradients after backward, as Megatron-LM does.
#
# The cell below weighs each layer two ways: by its parameters, and by the measured time of its forward and
# backward.

# %%
transformer = tiny_transformer(seed=0)
psi = count_parameters(transformer)
names = [name for name, _ in layers(transformer)]
by_params = layer_costs(transformer, "params")
by_time = coursekit.launch(lambda rank, world_size: layer_costs(
    tiny_transformer(seed=0), "time", sample=LanguageData().batch(0, GLOBAL_BATCH)[0], repeats=9), 1)[0]
print(f"{'layer':<10} {'parameters':>10} {'fwd+bwd (ms)':>13}")
for name, p, t in zip(names, by_params, by_time):
    print(f"{name:<10} {p:>10,.0f} {t * 1e3:>13.2f}")
print(f"Ψ = {psi:,} distinct parameters (the tied 16×64 matrix counts in both layers that use it above)")

# %% [markdown]
# Now the transformer trains on 2, 3 and 4 ranks. Each rank keeps only its stage's parameters, and `train`
# measures the bytes it holds. The table compares them with 4 bytes times the parameters of the stage's layers.

# %%
STAGED_STEPS = 3


def staged(rank, world_size, sizes):
    result = train(rank, world_size, "model", model="transformer", steps=STAGED_STEPS, global_batch=GLOBAL_BATCH,
                   layers_per_stage=sizes, record=False, trace=True, count_traffic=True)
    work = sorted((s for s in result["spans"] if s.rank == rank and s.kind in ("forward", "backward")),
                  key=lambda s: s.start)[2:]                     # one forward and one backward per step: skip step 0
    return result["memory"], result["peak_memory"], result["traffic"], sum(s.duration for s in work) / (STAGED_STEPS - 1)


def stage_bytes(sizes):
    """4 bytes per distinct parameter of each stage's layers."""
    stages, out = split(tiny_transformer(seed=0), len(sizes), layers_per_stage=sizes), []
    for stage in stages:
        out.append(4 * sum(p.numel() for p in {id(p): p for p in stage.parameters()}.values()))
    return out


cuts = {(g, by): partition(by_params if by == "params" else by_time, g) for g in MEMORY_RANKS
        for by in ("params", "time")}
measured = {(g, tuple(sizes)): None for (g, _), sizes in cuts.items()}   # a cut both costs agree on runs once
measured = {key: coursekit.launch(staged, key[0], list(key[1]), timeout=300) for key in measured}
runs = {(g, by): measured[(g, tuple(sizes))] for (g, by), sizes in cuts.items()}

# %% tags=["nbval-check-output"]
print(f"4Ψ = {4 * psi:,} bytes of parameters in one process\n")
print(f"{'ranks':>5}  {'layers per stage':<16} {'parameter bytes per rank (measured)':<44} formula?  largest / (4Ψ/G)")
for g in MEMORY_RANKS:
    sizes = cuts[(g, "params")]
    held = [run[0]["params"] for run in runs[(g, "params")]]
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
    sizes = cuts[(g, "params")]
    acts = activation_bytes(split(tiny_transformer(seed=0), g, layers_per_stage=sizes), tokens)
    start = 0
    for r, run in enumerate(runs[(g, "params")]):
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

# %%
print(f"{'ranks':>5}  {'cut by':<7} {'layers per stage':<16} {'largest rank (bytes)':>20} "
      f"{'slowest stage (ms)':>19}   per stage (ms)")
for (g, by), sizes in cuts.items():
    held = max(run[0]["params"] for run in runs[(g, by)])
    times = [run[3] * 1e3 for run in runs[(g, by)]]
    print(f"{g:>5}  {by:<7} {str(sizes):<16} {held:>20,} {max(times):>19.2f}   "
          + " ".join(f"{t:.2f}" for t in times))
same = [g for g in MEMORY_RANKS if cuts[(g, "params")] == cuts[(g, "time")]]
differ = [g for g in MEMORY_RANKS if g not in same]
print(f"\nthe two cuts agree on {same or 'no'} ranks" + (f" and differ on {differ}" if differ else ""))
for g in differ:
    slowest = {by: max(stage_costs(by_time, cuts[(g, by)])) * 1e3 for by in ("params", "time")}
    ran = {by: max(run[3] for run in runs[(g, by)]) * 1e3 for by in ("params", "time")}
    better = min(ran, key=ran.get)
    print(f"{g} ranks: slowest stage by the layers' measured costs: cut by params {slowest['params']:.2f} ms, by time "
          f"{slowest['time']:.2f} ms ({slowest['params'] / slowest['time']:.2f}x); in the runs above "
          f"{ran['params']:.2f} ms and {ran['time']:.2f} ms: the cut by {better} was faster, "
          f"{max(ran.values()) / min(ran.values()):.2f}x")

# %% [markdown]
# Cutting by parameters balances memory; cutting by measured time balances work. They differ when a layer's
# parameters and its time disagree. An embedding holds many parameters but only looks rows up.
#
# **Takeaway:** the two blocks dominate both the parameters and the time, so every cut puts them on different
# stages.
#
# <details><summary>How the times were measured, and what the cuts decide</summary>
#
# Each layer's forward and backward is timed in a rank of its own: the least of 9 runs, in the CPU time of the
# thread that computes, so other processes do not count. The stages' times in the table are wall-clock spans
# of the traced runs. On 3 and 4 ranks the processes share 2 cores, so read those as a rough guide. The cuts can
# differ only in where the small layers go. On 3 ranks that rests on small differences between measured times,
# even between the two blocks, which are the same layer. The margin is a few percent of a stage, about what a
# rerun on shared cores changes. `train(..., "model", partition_by="time")` measures the layers on rank 0 and
# gives every rank the same cut; `layers_per_stage=[...]` sets it by hand.
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
    traffic = comm.Traffic.merge([run[2] for run in runs[(g, "params")]])
    formula = 2 * (g - 1) * GLOBAL_BATCH * s * d + 2 * V * d
    links = sorted(traffic.links)
    print(f"{g} ranks: {traffic.total // STAGED_STEPS:>6,} elements per step, formula 2·{g - 1}·{GLOBAL_BATCH}·{s}·{d} "
          f"+ 2·{V}·{d} = {formula:>6,}: {'exact' if traffic.total == STAGED_STEPS * formula else 'NO'}; links {links}")
two = comm.Traffic.merge([run[2] for run in runs[(2, "params")]]).total // STAGED_STEPS
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
# ## What we have
#
# * The source's example runs for real: two layers on two ranks, two messages per step, equal to one process.
# * The GPUs wait for each other (P3): each rank is idle for much of every step.
# * It buys memory: each rank holds only its layers, split as finely as the layers allow.
# * It costs 2(G − 1)·b·s·d elements per step, plus the tied gradient, counted exactly.
#
# **Exercise** `exercises/03_model_parallel.ipynb`: write one whole step of a two-stage model, in micro-batches:
# activations forward, gradients back, each stage's backward. It is graded against one process, with every
# message counted.

