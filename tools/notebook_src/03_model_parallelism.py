# ci_parameters: {"TIMELINE_STEPS": 4, "WIDTH": 384}
# %% [markdown]
# # 03 · Model parallelism: layers on different GPUs, and the chain they form
#
# **[Model parallelism](../docs/glossary.md#model-parallelism)** ("inter-op", claim **P3** of the source texts): put *different layers* on
# different GPUs, compute them in sequence, and pass the intermediate results from one device to the
# next. The seed's example is a two-layer network with the **hidden layer on GPU 1** and the **output
# layer on GPU 2**. It lets a model that does not fit one GPU train at all — but the GPUs wait for each
# other: **a chain, a bottleneck, no simultaneous work**.
#
# This chapter runs the seed's example for real and measures each part of that sentence:
#
# 1. the two-layer network on two ranks, proven equal to one process (loss, every gradient, every weight);
# 2. a measured timeline: each rank idle while it waits for the other (**P3**), as a fraction of the step;
# 3. what it buys — bytes per rank (parameters, gradients, optimiser state, activations) for the course
#    transformer on 2–4 ranks — and how to cut the layers: balanced by parameter count or by measured time;
# 4. what it costs: every element sent, counted against its formula;
# 5. why that is a chain and a bottleneck, and what chapters 04 and 05 do about it.
#
# As in every chapter, a "GPU" is a process (gloo on the CPU) and `coursekit.parallel.pipeline.model` is the code.

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
# ## The seed's example: two layers, two GPUs
#
# The course's MLP with two layers: a hidden layer (16 → 64, then GELU) and an output layer (64 → 4).
# `coursekit.parallel.pipeline.layers` lists a model as the layers whose composition is its forward;
# `split(model, 2)` cuts that list into two contiguous **[stages](../docs/glossary.md#stage)**, which share the model's parameters.
# Stage 0 goes to rank 0 ("GPU 1"), stage 1 to rank 1 ("GPU 2").

# %% tags=["nbval-check-output"]
two_layers = lambda: tiny_mlp(n_layers=2, seed=0)  # noqa: E731  (every rank builds the same weights)
net = two_layers()
for name, layer in layers(net):
    print(f"layer {name:<12} {sum(p.numel() for p in layer.parameters()):>5} parameters")
for rank, stage in enumerate(split(net, 2)):
    print(f"stage {rank} on rank {rank} (GPU {rank + 1}):", stage)

# %% [markdown]
# One training step of the strategy `"model"` (`coursekit.parallel.pipeline.ModelParallel`):
#
# * **forward** — rank 0 computes the hidden [activations](../docs/glossary.md#activations) (batch × 64) and **sends** them to rank 1;
#   rank 1 receives them into a tensor of its own, marks it as a leaf that requires grad, computes the
#   output and the loss;
# * **backward** — rank 1's `loss.backward()` fills its weights' gradients *and* the gradient of the loss
#   with respect to the activations it received; it **sends** that back, and rank 0 continues the chain rule
#   from it (`activations.backward(grad)`);
# * **step** — each rank updates only the weights it holds.
#
# Autograd never crosses a process: the two sends *are* the chain rule across the cut. (The receiver must
# allocate its buffer before the data arrives; the first time, the sender sends a small header with the
# shape — control traffic, not counted as payload.) Writing these two halves yourself is this chapter's
# exercise.
#
# ## The proof: equal to one process
#
# Two ranks train the two-layer network for `PROOF_STEPS` Adam steps; one process trains the whole network
# on the same batches. `coursekit.measure.verify.compare` checks at every step the output (computed on rank 1),
# the loss, every gradient and every weight after the step, each on the rank that holds it.

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
# Nothing is approximated: the same operations on the same numbers, in the same order, only on two
# processes — the table's differences are zero here, not rounding. (Data parallelism, chapter 02, sums
# partial gradients in a different order and agrees only to rounding.)
#
# ## The timeline: one rank works, the other waits (P3)
#
# To see the chain, the two layers must take measurable time: the same two-layer network, wider
# (`WIDTH` → `WIDTH` → `WIDTH`: two weight matrices of the same size), a batch of `TIMELINE_BATCH`, traced.
# The same size is *not* the same work, and the run below shows it: stage 0's input is the data, which
# needs no gradient, so its backward skips the input-gradient matrix multiply (one of its three); stage 1
# computes the loss over `WIDTH` classes (a softmax and its gradient) and both gradient multiplies of its
# layer. So rank 1 computes longer per step than rank 0 (the per-step line further down gives both).
#
# Each rank gets one row: forward, backward and the optimiser step on top, and every wait (grey, *idle*):
# the receives, the sends (a non-blocking send still spends its call handing the tensor to gloo, which
# can take milliseconds), and the end of the step, where each rank waits for its sends and for the loss broadcast —
# which the rank that is done first must wait in until the other has finished its backward. The
# communication lane underneath shows the same waits, from the call to the arrival.

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
# Measured over every step but the first: for each rank, the share of the wall-clock time it spent
# computing (forward + backward) and in its optimiser step; the rest it was **idle** — not computing. Of
# that idle time, the part spent blocked is traced (grey above): in a send or a receive, and in the end-of-step sync
# (its sends, the loss broadcast, in which the rank that is done waits for the other). The remainder is the
# work around forward and backward that one process does too (building the batch, `zero_grad`, the memory
# bookkeeping) and Python between the calls. And the share of the time during which **both** ranks
# computed at once.

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
# That is P3, measured. Rank 1 cannot start its forward before rank 0's activations arrive; rank 0 cannot
# start its backward before rank 1's gradient arrives; and the rank that finishes first waits for the
# other at the end of the step. So each rank spends a large share of every step not computing (the
# lines above give this run's numbers: part of it waiting for the other rank, part loop work that one
# process pays too), and the two ranks hardly ever compute at the same moment: what they can do side by
# side is the work outside forward and backward (not measured here), such as the optimiser step, each
# on its own weights.
#
# On a 2-core machine two ranks can have a core each (unless other programs keep the cores busy: then
# every span stretches, but the order of the chain does not change); 3 or 4 ranks must share them (below).
#
# **Is a chain faster?** Does splitting the layers at least speed the step up? The same traced run,
# per step: each rank's computing time, and the step itself.

# %%
n_steps = len(forwards[0]) - 1
per_step = {r: union_length(compute[r]) / n_steps * 1e3 for r in (0, 1)}
print(f"per step: rank 0 computed {per_step[0]:.1f} ms, rank 1 {per_step[1]:.1f} ms (both at once {both:.1%} of the "
      f"time); summed: {per_step[0] + per_step[1]:.1f} ms of computing in a step of {window / n_steps * 1e3:.1f} ms")
print(f"two weight matrices of the same size, not the same work: rank 1 computed {per_step[1] / per_step[0]:.2f}x "
      f"rank 0's time (stage 1 computes the loss and its input's gradient; stage 0 does not need its input's)")

# %% [markdown]
# The two stages' work is the work of one process (the same layers on the same batch), and since the
# two ranks hardly ever compute at the same time, the chain's step lasts about their sum or more (the
# line above) — plus the transfers, the waits and the rest of the loop. With G equal stages each GPU
# computes at most about 1/G of the step and is idle for the rest,
# (G − 1)/G or more. Model parallelism is not there for speed: it is for **memory**.
#
# ## What it buys: each rank holds only its layers
#
# The course transformer (2 blocks, d_model 64) as `layers()` sees it: the embedding, two blocks, and
# the final norm with the output head. Its head is **tied** to the token embedding (one 16 × 64 matrix used
# first and last), so that matrix lives on the first and on the last stage, and their gradients are summed
# between the two after backward (`sum_tied_gradients`, as Megatron-LM does over its "embedding group").
#
# How to cut the layers into G contiguous stages? `partition(costs, G)` finds the cut whose largest
# stage is as small as possible, for any cost per layer (`layer_costs`):
#
# * **by parameters** (`partition_by="params"`) balances the *memory*: the largest stage holds as few
#   parameters as possible;
# * **by measured time** (`partition_by="time"`) balances the *work*: forward + backward of each layer,
#   measured (here in a rank of its own: the least of 9 runs, in the CPU time of the thread that computes,
#   so that other processes on the cores do not count). In a chain the step is the sum of the
#   stages anyway; in a pipeline (chapter 04) the slowest stage sets the pace, so time is what to balance.
#
# The two differ when a layer's parameters and its time disagree: an embedding holds parameters but
# only looks rows up; attention computes with the sequence length squared and no parameters for it.

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
# Now the course transformer trained for real on 2, 3 and 4 ranks, cut both ways. Each rank holds only
# its own stage's parameters (the others' are released), and `train` measures what it holds
# (`memory`, and `peak_memory` for the most during the step). Bytes of parameters per rank, measured,
# against the formula 4 bytes × the parameters of the stage's layers; then everything a rank holds.

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
# Parameters are not all a rank holds. Training also keeps each parameter's gradient (4 bytes) and Adam's
# two moments (8 bytes, plus a step counter per tensor), measured at their peak during the step
# (`peak_memory`), and the **activations**
# its layers save for backward — measured here with `torch.autograd.graph.saved_tensors_hooks`: the bytes
# autograd keeps between each stage's forward and its backward, for one batch of `GLOBAL_BATCH` sequences
# (weights excluded: they are counted as parameters). Each stage keeps only its own layers' activations,
# plus the tensor it received.

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
# Each rank holds a contiguous share of the *layers* (1/G of them only when G divides the layer count),
# not 1/G of the *bytes*: a rank can hold no less than its largest
# layer (a block here: 49,792 parameters, about half the model), so on 4 ranks the two block ranks hold
# about twice 4Ψ/4 while the embedding and head ranks hold little (the first table's last column: the
# largest rank over the ideal share). Gradients and Adam's state follow the parameters (4 and 8 bytes
# each); activations follow the layers too, and here a block's dominate its rank. The tied matrix is held
# twice, by the first and the last stage, with its gradient and moments. Finer cuts need smaller layers —
# or cutting inside the layers: tensor parallelism (chapter 05).
#
# The two ways of cutting, side by side: layers per stage, the largest rank's parameter bytes, and the
# slowest stage's measured forward + backward per step (wall-clock time of the traced spans). On 3 and 4
# ranks the processes share this machine's 2 cores, so those times include waiting for a core, and other
# work on this shared machine can stretch any of them: read them as a rough guide.

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
print(f"\nthis run: the two cuts agree on {same or 'no'} ranks" + (f" and differ on {differ}" if differ else "")
      + (" (a cut both agree on was run once: its two rows are the same run)" if same else ""))
for g in differ:
    slowest = {by: max(stage_costs(by_time, cuts[(g, by)])) * 1e3 for by in ("params", "time")}
    ran = {by: max(run[3] for run in runs[(g, by)]) * 1e3 for by in ("params", "time")}
    better = min(ran, key=ran.get)
    print(f"{g} ranks: slowest stage by the layers' measured costs: cut by params {slowest['params']:.2f} ms, by time "
          f"{slowest['time']:.2f} ms ({slowest['params'] / slowest['time']:.2f}x); in the runs above "
          f"{ran['params']:.2f} ms and {ran['time']:.2f} ms: the cut by {better} was faster, "
          f"{max(ran.values()) / min(ran.values()):.2f}x")

# %% [markdown]
# Here the blocks dominate both the parameters and the time, so both costs call for the same thing:
# a block per stage where possible. Where the cuts can differ is where to put the small layers: with 3
# ranks the embedding (5,120 parameters, mostly the position table, but only a lookup) and the head
# (1,152 parameters, but a matrix multiply per token) weigh very differently by parameters and far less
# so by time (both a small fraction of a block's), so the cut by time rests on small differences between
# measured times — even between the two blocks, which are the same layer and differ only by measurement
# noise (the lines above say what was decided in this run: on 3 ranks the cut by time is embedding + block
# | block | head whenever the embedding and the first block measure less than the second block and the
# head, and the parameters' cut otherwise). Where the two cuts differ, a last
# line compares them twice: by the layers' own measured costs (which the cut by time minimises, so it
# cannot lose there) and by the stages' times in the runs. Time is the right thing to balance — in a
# pipeline the slowest stage sets the pace — but between these cuts the margin is a small layer's time,
# a few percent of a stage, about what a rerun on shared cores changes: a measured cost is only as good
# as the measurement.
# `train(..., "model", partition_by="time")` measures the layers on rank 0 and gives every rank the same
# cut; `layers_per_stage=[...]` sets it by hand.
#
# ## What it costs: two messages per cut, counted
#
# Per step, each cut between stage s and s + 1 carries the activations forward and their gradient back,
# each of batch × sequence × d_model elements (the MLP: batch × hidden). The tied matrix adds its gradient
# sent each way between the first and the last stage (V × d = 16 × 64 = 1,024 elements each way). So per
# step:
#
# traffic = 2 (G − 1) · b · s · d  +  2 · V · d
#
# Counted by `coursekit.comm.record()` on every rank (the one-time shape headers are control traffic,
# not counted here):

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
# Only neighbours talk (r ↔ r + 1), plus the first and the last stage for the tied matrix. The volume
# grows with batch × sequence × d_model, not with the number of parameters: a block's weights never
# travel, only what flows between the blocks (the last line compares it with data parallelism's
# all-reduce for this small model: Ψ against b·s·d per cut; for a large model the comparison depends on
# its batch and sequence length). The traffic is not the problem. The problem is the chain.
#
# ## Why a chain, and a bottleneck
#
# * **A chain.** Stage s + 1 needs stage s's output; stage s's backward needs stage s + 1's gradient. For
#   one batch there is no order other than forward through the stages, then backward through them in
#   reverse: at any moment at most one rank computes (measured above: the ranks computed together for
#   a negligible share of the step) and each is idle the rest of the step.
# * **A bottleneck.** The step takes as long as all stages plus the transfers, so adding GPUs adds
#   memory, never speed; and the slowest stage, or the slowest link, holds everyone.
#
# Two ways out, each a chapter:
#
# * **Chapter 04, pipeline parallelism (P7):** cut the batch into *micro-batches*. While stage 1 works on
#   micro-batch 1, stage 0 can already start micro-batch 2 — activations flow forward as here, gradients of
#   earlier micro-batches flow back at the same time, and the ranks idle less. Idle time remains at the
#   start and the end of each step (the *bubble*), and for a small model or a slow link the gain can be small.
# * **Chapter 05, tensor parallelism (P5, P10):** cut *inside* each layer, so that every GPU holds a slice of
#   every weight matrix and all of them compute every layer at the same time. That is why, for a model too
#   large for one GPU, the seed recommends tensor over model parallelism (**P10**): the GPUs work
#   simultaneously — at the price of communication inside every layer.
#
# ## The same thing in production
#
# PyTorch has no separate model-parallel API. In the simplest form you place the layers yourself —
# `layer1.to("cuda:0")`, `layer2.to("cuda:1")`, `h = layer1(x.to("cuda:0")); y = layer2(h.to("cuda:1"))` —
# inside **one** process, and autograd follows `.to()` across devices. Across processes,
# `torch.distributed.pipelining` runs exactly this chapter's chain: `PipelineStage` per rank, and a
# [schedule](../docs/glossary.md#pipeline-schedule) with **one micro-batch** is model parallelism. `coursekit.parallel.pipeline.torch` drives it
# from the same training loop on the same stages (strategy `"torch_pipeline"`, schedule `"gpipe"`,
# `micro_batches=1`): the course transformer on 2 ranks, against one process and against coursekit's
# `"model"`:
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
# Both equal one process at every step. (The times are a few steps on a shared 2-core machine: same
# order of magnitude, no ranking.) With more micro-batches the same `PipelineStage`s run [GPipe](../docs/glossary.md#gpipe) and [1F1B](../docs/glossary.md#1f1b)
# schedules, and several stages per rank run [interleaved](../docs/glossary.md#interleaved-1f1b) ones: chapter 04.
#
# ## What we have
#
# * P3's example runs for real: hidden layer on rank 0, output layer on rank 1, activations forward and
#   gradients back through two counted messages, and training equal to one process.
# * P3's "the GPUs wait for each other", measured: each rank idle for a large share of every step, the two
#   hardly ever computing at once: the chain does one process's computation in turn, plus the transfers.
# * What it buys: each rank holds only its layers' parameters — its share of the layers, measured exactly —
#   and with them their gradients, optimiser state and activations; bytes split only as finely as the
#   largest layer.
# * What it costs: 2(G − 1)·b·s·d elements per step (+ the tied gradient), counted exactly.
#
# **Exercise** `exercises/03_model_parallel.ipynb`: write both halves of the two-stage step — send the
# activations forward, the gradient back — graded against one process, with every message counted.
