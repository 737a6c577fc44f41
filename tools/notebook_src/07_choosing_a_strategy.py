# ci_parameters: {"TOP": 3}
# %% [markdown]
# # 07 · Choosing a strategy: a memory and time model, checked, and a planner
#
# Chapters 02-06 built every strategy and measured it. This chapter turns what they measured into a
# **model** you can ask before you rent the GPUs: how many bytes each GPU holds and how long a training step
# takes, for any model on any machine, for any way of combining the strategies. Then a **planner** searches
# every combination and ranks the ones that fit. The seed's recommendations (**P1**, **P8**, **P10**) come out
# of the numbers instead of being stated:
#
# 1. what a *[layout](../docs/glossary.md#layout)* is: dp, tp, pp, sp and ZeRO, and the order of the [axes](../docs/glossary.md#axis) on the mesh;
# 2. memory: parameters, model states with ZeRO 0-3, activations -- each formula beside this course's measurement;
# 3. time: compute, the pipeline's bubble, communication through chapter 01's network model;
# 4. the planner on three scenarios, with its reasons; where pipelining pays and where it does not (**P7**, **P10**);
#    long sequences;
# 5. a calculator: your model, your machine.
#
# The library is `coursekit.costmodel`: plain functions whose docstrings cite their source (the ZeRO paper,
# Korthikanti et al. 2022, Narayanan et al. 2021), tested against published figures and against the course's runs.

# %% tags=["parameters"]
# Parameters: the measurements are one training step at 2 ranks; the rest is arithmetic (seconds).
RANKS = 2                  # ranks of the measured runs (section 2)
TOP = 5                    # layouts printed per scenario (section 4)

# %%
# %matplotlib inline
from dataclasses import replace

import matplotlib.pyplot as plt
import torch

import coursekit
import coursekit.parallel.pipeline  # noqa: F401  (registers the "pipeline" strategy)
from coursekit.costmodel import (Hardware, Layout, ModelConfig, Space, activation_bytes_per_layer, axis_network,
                                 bubble_fraction, communication_bytes, communication_time, compute_flops, evaluate,
                                 logits_bytes, model_state_bytes, num_params, plan)
from coursekit.comm.mesh import coordinates_of
from coursekit.models import tiny_transformer
from coursekit.comm.traffic import Traffic
from coursekit.train import train
from coursekit.viz.costmodel import PRESETS, calculator_candidates, draw_calculator, layout_label

torch.set_num_threads(1)

# %% [markdown]
# ## 1. What a layout is
#
# A **layout** says how `G` GPUs are used: `dp × tp × pp × sp = G` (any degree may be 1), with
#
# * **dp** data parallelism (chapter 02): each group of replicas takes a slice of the batch; **ZeRO** stage 0-3
#   shards the optimizer state, the gradients, the parameters over dp;
# * **tp** tensor parallelism (chapter 05): every weight matrix split, collectives inside every layer;
#   Megatron's **sequence parallelism** (`sequence_parallel=True`, chapter 06) splits what tp leaves whole;
# * **pp** pipeline parallelism (chapter 04): the layers in stages, `m` micro-batches, a schedule;
# * **sp** [context parallelism](../docs/glossary.md#sequence-parallelism) (chapter 06's ring attention or Ulysses): each GPU takes a block of the sequence.
#
# torchtitan and the cost model put the ranks on the mesh in the order **pp, dp, sp, tp** (outermost first, tp
# innermost): neighbouring ranks differ in tp. So "**dp 8, tp 2, cp 2, pp 2**" (torchtitan calls sp *cp*,
# context parallel) is 8 · 2 · 2 · 2 = 64 GPUs, and a rank's number written in that mixed radix is where it sits
# (`coursekit.comm.mesh.coordinates_of`, chapter 05's mesh):

# %% tags=["nbval-check-output"]
axes = {"pp": 2, "dp": 8, "sp": 2, "tp": 2}
torchtitan = Layout(dp=8, tp=2, sp=2, pp=2)
print(f"dp 8, tp 2, cp 2, pp 2 = {torchtitan.gpus} GPUs")
for rank in (0, 1, 2, 4, 32, 63):
    print(f"rank {rank:>2}: {coordinates_of(rank, axes)}")
groups = {}
for axis, stride in (("tp", 1), ("sp", 2), ("dp", 4), ("pp", 32)):
    groups[axis] = [stride * i for i in range(axes[axis])]
    link = axis_network(torchtitan, Hardware(gpus_per_node=8), axis)[1]
    print(f"rank 0's {axis} group: {groups[axis]} -> {link}")

# %% [markdown]
# With 8 GPUs a node, rank 0's tp group {0, 1} and its sp group {0, 2} stay on NVLink, its dp group spans 4
# nodes' worth of ranks 4 apart (two GPUs per node: both links), and its pp partner is 32 ranks away, on
# another node. That order is a choice that follows from the traffic (section 3): tp talks in every layer, so it
# goes where the link is fastest; pp sends one activation per micro-batch and stage, so it can cross nodes.
#
# ## 2. Memory, and what this course measured
#
# Per GPU, three terms (`coursekit.costmodel.memory`):
#
# * **[model states](../docs/glossary.md#model-states)** -- `model_state_bytes(num_params, dp, zero_stage, precision)`: with Adam, 16 bytes a
#   parameter in fp32 (4 + 4 + 8) and in mixed precision (2 + 2 + 12, the ZeRO paper's K = 12); ZeRO-1 divides
#   the optimizer state by dp, ZeRO-2 also the gradients, ZeRO-3 also the parameters. The ZeRO paper's Figure 1
#   (Rajbhandari et al. 2020: Ψ = 7.5 B, N_d = 64):

# %% tags=["nbval-check-output"]
for stage in range(4):
    states = model_state_bytes(7_500_000_000, dp=64, zero_stage=stage)
    print(f"ZeRO-{stage}: {states.total / 1e9:7.3f} GB per GPU "
          f"(params {states.params / 1e9:.3g}, grads {states.grads / 1e9:.3g}, optimizer {states.optimizer / 1e9:.3g})")
gpt2 = ModelConfig.gpt2_small()
print(f"num_params(GPT-2 small) = {num_params(gpt2).total:,}; "
      f"the course transformer: {num_params(ModelConfig.course()).total:,}")

# %% [markdown]
# The paper prints 120, 31.4, 16.6 and 1.88 GB. The parameter count is N = h(v + s) + L(12h² + 13h) + 2h for
# the GPT shape with a tied head (GPT-2 small: 124,439,808, its published size).
#
# * **activations** -- `activation_bytes_per_layer(s, b, h, a, tp, sequence_parallel, recompute)`: Korthikanti
#   et al. 2022, Table 2, sbh(34 + 5as/h) bytes a layer in 16 bits with dropout; sbh(10 + 24/t + 5as/(ht)) with
#   tp; sbh(34/t + 5as/(ht)) with tp + sp; selective [recomputation](../docs/glossary.md#activation-recomputation) drops the 5as/h term, full keeps 2sbh. For
#   GPT-3 175B at s = 2,048, b = 1, tp = 8 (their Figure 1's row):

# %% tags=["nbval-check-output"]
s, h, a = 2048, 12288, 96
for label, kw in (("no parallelism", {}), ("tp 8", {"tp": 8}), ("tp 8 + sp", {"tp": 8, "sequence_parallel": True}),
                  ("tp 8 + sp, selective", {"tp": 8, "sequence_parallel": True, "recompute": "selective"})):
    per_layer = activation_bytes_per_layer(s, 1, h, a, **kw).total
    print(f"{label:<22} {per_layer / (s * h):6.2f} · sbh = {per_layer / 2**20:8.1f} MiB a layer")

# %% [markdown]
# 34 + 5 · 96 · 2048 / 12288 = 114 for no parallelism; 10 + 24/8 + 10 = 23 with tp 8; 34/8 + 10 = 14.25 with
# sp; 34/8 = 4.25 selective -- Table 2's rows.
#
# **Against this course's runs.** One training step of the course transformer on 2 ranks (fp32 Adam, so 16
# bytes a parameter as 4 + 4 + 8): chapter 02's four ZeRO stages, measured by `coursekit.measure.memory` inside
# `train` (the storage actually allocated, after the step); chapter 04's 1F1B pipeline on 2 stages,
# micro-batches of b = 4 sequences of s = 31 tokens, measured by what autograd saves; and the traffic each
# sends, counted message by message (chapter 01's counter).

# %%
STAGES = ("naive", "zero1", "zero2", "zero3")


def measure(rank, world_size):
    held = {name: train(rank, world_size, name, model="transformer", steps=1, global_batch=6, collectives="torch",
                        record=False, **({} if name == "naive" else {"bucket_elements": 10 ** 6}))["memory"]
            for name in STAGES}
    traffic = {name: train(rank, world_size, name, model="transformer", steps=1, global_batch=4, count_traffic=True,
                           record=False)["traffic"] for name in ("zero1", "zero3")}
    pipe = train(rank, world_size, "pipeline", model="transformer", micro_batches=2, schedule="1f1b", steps=1,
                 global_batch=8, record=False, count_traffic=True)
    return held, traffic, pipe["activation_bytes"], pipe["traffic"]


measured = coursekit.launch(measure, RANKS, timeout=300)

# %% tags=["nbval-check-output"]
course = ModelConfig.course()
psi = num_params(course).total
tensors = len(list(tiny_transformer().parameters()))
rows = []
for stage, name in enumerate(STAGES):
    model = model_state_bytes(psi, dp=RANKS, zero_stage=stage, precision="fp32")
    held = measured[0][0][name]
    counters = 4 * (tensors if stage == 0 else 1)       # Adam's 4-byte step counter per tensor (per shard)
    rows.append((f"ZeRO-{stage} params", "4Ψ" + ("/dp" if stage == 3 else ""), held["params"], model.params, 0))
    rows.append((f"ZeRO-{stage} grads", "4Ψ" + ("/dp" if stage >= 2 else ""), held["grads"], model.grads, 0))
    rows.append((f"ZeRO-{stage} optimizer", "8Ψ" + ("/dp" if stage >= 1 else ""), held["optimizer"], model.optimizer,
                 counters))
s_, b_, h_, a_, v_ = 31, 4, 64, 4, 16
block = activation_bytes_per_layer(s_, b_, h_, a_, recompute="selective", bytes_per_element=4, dropout=False).total
last = block + logits_bytes(s_, b_, h_, v_, bytes_per_element=4).total
for stage, model in ((0, block), (1, last)):
    rows.append((f"activations, stage {stage}", "sbh·64" + (" + logits" if stage else ""),
                 measured[stage][2][stage, 0], model, None))
print(f"{'term':<24} {'formula':<16} {'measured':>10} {'model':>10}  difference")
for term, formula, got, model, explained in rows:
    if explained is None:
        note = f"{100 * (got - model) / model:+.1f}% (norms' statistics, log-sum-exp, ids)"
    else:
        note = "exact" if got == model else (f"+{got - model}: Adam's step counters" if got - model == explained
                                             else f"UNEXPLAINED {got - model:+}")
    print(f"{term:<24} {formula:<16} {got:>10,} {model:>10,.0f}  {note}")

# %% [markdown]
# Ψ = 104,832 parameters. Every model state is exact but for Adam's `step` counter, 4 bytes for each
# parameter tensor, which the 16Ψ of the ZeRO paper leaves out. The activations are Table 2 at 4 bytes without
# dropout masks (the course model has none), *selective*: PyTorch's `scaled_dot_product_attention` never keeps
# the a·s² scores, it recomputes them in backward, which is what selective recomputation models; what the
# model leaves out is LayerNorm's mean and 1/std, attention's log-sum-exp and the token ids (named in
# tests/test_costmodel_memory_measured.py, which checks them to the byte). On the last stage the logits the
# loss keeps are added (section 4.3 of the paper).
#
# And the traffic: `communication_bytes(config, layout, micro_batch)` against what was counted (in elements):

# %% tags=["nbval-check-output"]
for name, zero in (("zero1", 1), ("zero3", 3)):
    counted = Traffic.merge([measured[r][1][name] for r in range(RANKS)]).sent
    predicted = communication_bytes(course, Layout(dp=RANKS, zero=zero), 4 // RANKS, 1, seq_len=31).dp
    print(f"ZeRO-{zero}, dp = {RANKS}: counted {counted[0]:,.0f} elements sent by rank 0, model {predicted:,.0f}: "
          f"{'equal' if all(counted[r] == predicted for r in range(RANKS)) else 'DIFFERENT'}")
pipe_counted = Traffic.merge([measured[r][3] for r in range(RANKS)]).sent
pipe_model = communication_bytes(course, Layout(pp=RANKS, micro_batches=2), 8 // 2, 1, seq_len=31).pp
print(f"pipeline, pp = {RANKS}, m = 2: counted {max(pipe_counted.values()):,.0f} elements (the busiest rank), "
      f"model {pipe_model:,.0f}: {'equal' if max(pipe_counted.values()) == pipe_model else 'DIFFERENT'}")

# %% [markdown]
# ## 3. Time: compute, bubble, communication
#
# `compute_time`: 6·P FLOPs a token for the parameters' matrices (forward 2, backward 4), plus attention's
# 12·L·s·h (Narayanan et al. 2021, eq. 3), at the GPU's peak times an efficiency (`Hardware()`: an A100,
# 312 TFLOP/s in bf16, at 50%). `bubble_fraction`: chapter 04's (p − 1)/(m + p − 1) for 1F1B.
# `communication_time`: each collective through chapter 01's network model on the link its group uses
# (NVLink inside a node, InfiniBand across). `step_time` adds them; what overlaps what is a named argument
# (`dp_overlap=1` hides the gradient all-reduce behind backward, as chapter 02's buckets do), zero by default.

# %% tags=["nbval-check-output"]
a100 = Hardware()
gpt3 = PRESETS["GPT-3 175B"]          # vocabulary padded to 51,200 as Megatron-LM's, so that tp = 8 divides it
flops = compute_flops(gpt3, tokens=2048)
print(f"GPT-3 175B, one sequence of 2,048 tokens: {flops.total / 1e15:.3f} PFLOP "
      f"(dense {flops.dense / 1e15:.3f}, attention {flops.attention / 1e15:.3f})")
for pp, m in ((8, 8), (8, 64), (16, 192)):
    print(f"bubble, 1F1B, p = {pp}, m = {m}: {bubble_fraction(Layout(pp=pp, micro_batches=m)):.1%}")
print()
print(f"{'layout (1,024 A100s, batch 1,536)':<38} {'compute':>9} {'bubble':>8} {'comm':>8} {'step':>8} {'memory':>9}")
for layout in (Layout(dp=8, tp=8, pp=16, micro_batches=192), Layout(dp=16, tp=8, pp=8, micro_batches=96),
               Layout(dp=8, tp=16, pp=8, micro_batches=192), Layout(dp=128, pp=8, micro_batches=12)):
    c = evaluate(gpt3, layout, a100, 1536)
    t = c.time
    print(f"{layout_label(layout).replace(chr(10), ', '):<38} {t.compute:8.2f}s {t.bubble:7.2f}s "
          f"{t.exposed_communication:7.2f}s {c.seconds:7.2f}s {c.memory.total / 1e9:7.1f} GB"
          f"{'' if c.fits else '  does not fit'}")
no_tp = evaluate(gpt3, Layout(dp=128, pp=8, micro_batches=12), a100, 1536).memory
print(f"dp 128 × pp 8 without tp: {(no_tp.params + no_tp.grads + no_tp.optimizer) / 1e9:.0f} GB of model states "
      f"and {no_tp.activations / 1e9:.0f} GB of activations on its most loaded GPU")
tp16 = evaluate(gpt3, Layout(dp=8, tp=16, pp=8, micro_batches=192), a100, 1536)
tp_seconds, m = communication_time(gpt3, tp16.layout, a100, 1).tp, tp16.layout.micro_batches
print(f"tp = 16 crosses the node: {tp_seconds:.3f} s of tp communication a step, {tp_seconds / m:.3f} s for each "
      f"of its {m} micro-batches of one sequence ({axis_network(tp16.layout, a100, 'tp')[1]})")

# %% [markdown]
# Read the table across: compute is the same for every layout of 1,024 GPUs (the FLOPs are the model's), so
# what ranks them is the bubble, the exposed communication, and whether they fit. A tp of 16 on nodes of 8
# sends every layer's all-reduces over InfiniBand (the last line: seconds a step, and per micro-batch); dp × pp without tp
# does not fit, because each GPU then keeps a whole stage's parameters with Adam's state and the activations of
# its micro-batches unsplit (the line before it).
#
# ## 4. The planner: three scenarios (P1, P8, P10)
#
# `plan(config, hardware, gpus, global_batch)` walks every valid layout -- the degrees, ZeRO 0-3, the four
# schedules of chapter 04, every number of micro-batches, the three recomputations, sequence parallelism on
# and off -- keeps those that fit, and ranks them by step time (it prunes by a lower bound;
# tests/test_costmodel_planner.py checks that its ranking equals `brute_force`'s). Every reason is computed
# from the numbers. Nothing says "tp stays in a node" or "use data parallelism for small models": those come out.

# %%
def show(config, hardware, gpus, batch, top=TOP, space=Space(), where="", **assumptions):
    ranked = plan(config, hardware, gpus, batch, top=top, space=space, **assumptions)
    print(f"{config.name} ({num_params(config).total / 1e9:.3g} B parameters), {gpus} GPUs of "
          f"{hardware.memory / 1e9:.0f} GB, batch {batch}, s = {config.seq_len}"
          + (f", {assumptions}" if assumptions else "") + (f", {where}" if where else "") + ":")
    for i, c in enumerate(ranked):
        print(f"  {i + 1}. {layout_label(c.layout).replace(chr(10), ', '):<34} {c.seconds * 1e3:9.1f} ms  "
              f"{c.memory.total / 1e9:5.1f} GB")
    if ranked:
        used = [f"{axis} {getattr(ranked[0].layout, axis)}" for axis in ("pp", "dp", "sp", "tp")
                if getattr(ranked[0].layout, axis) > 1]
        print(f"  the fastest uses: {' × '.join(used) or 'one GPU'}"
              + (f", ZeRO-{ranked[0].layout.zero}" if ranked[0].layout.zero else ""))
        print("  why the first:")
        for reason in ranked[0].reasons:
            print(f"    - {reason}")
    return ranked


# %% tags=["nbval-check-output"]
small = show(PRESETS["GPT-2 small"], a100, 8, 64)

# %% [markdown]
# **A model that fits one GPU** (GPT-2 small, 125 M parameters, 2 GB of model states on an 80 GB GPU): the
# fastest layouts are data parallelism alone (**P1**, **P10**: "a small model that fits one GPU → data
# parallelism"). Its gradient collectives stay on NVLink and cost 3% of the step; any tp or pp would add
# communication or a bubble to a step whose compute already fits. The five differ only in how the batch is cut
# into micro-batches and in ZeRO-1, which saves memory the model does not need. (Labels: the degrees in mesh
# order, then `Z1` for ZeRO-1, `m` the micro-batches, `sel` selective recomputation, `SP` Megatron's
# sequence parallelism.)
#
# **A model too large for one GPU**: 13 B parameters (h = 5,120, 40 layers, 40 heads, s = 2,048; the GPT-3
# paper's 13B) on one node of 8 × 80 GB. Its model states alone are 16 × 13 B = 206 GB: plain data parallelism
# cannot hold them on any GPU.

# %% tags=["nbval-check-output"]
gpt3_13b = ModelConfig(51200, 2048, 5120, 40, 40, name="GPT-3 13B")
print(f"plain dp on 8 GPUs: {evaluate(gpt3_13b, Layout(dp=8), a100, 64).memory.total / 1e9:.0f} GB per GPU")
big = show(gpt3_13b, a100, 8, 64)
print()
big_overlap = show(gpt3_13b, a100, 8, 64, dp_overlap=1.0)

# %% [markdown]
# The first ranking answers **P8** ("too large for one GPU → data + tensor parallelism combined"): tp inside the
# node, dp over the rest, ZeRO-1 to bring the model states under 80 GB. Chapter 02's buckets overlap the
# gradient all-reduce with the backward pass; granted that (`dp_overlap=1.0`, the second ranking), ZeRO-3 over all
# 8 GPUs comes first instead: its collectives then hide behind compute, and the seed's other answer for a model
# that does not fit -- shard it with data parallelism (DeepSpeed's ZeRO) -- wins. Which of the two is faster rests
# on that assumption, which is why it is a named argument and not a rule. In the first list pipelined layouts
# follow less than 1% behind, their bubble priced in.
#
# **A model that fills a cluster**: GPT-3 175B on 1,024 A100s (128 nodes of 8), batch 1,536 sequences.

# %% tags=["nbval-check-output"]
huge = show(gpt3, a100, 1024, 1536)
print()
megatron_space = show(gpt3, a100, 1024, 1536, space=Space.megatron_2021(), where="in Megatron-LM's 2021 space")
megatron = evaluate(gpt3, Layout(dp=8, tp=8, pp=16, micro_batches=192), a100, 1536)
print(f"Megatron-LM's shape, tp 8 × pp 16 × dp 8, 1F1B: {megatron.seconds:.2f} s, "
      f"{megatron.memory.total / 1e9:.1f} GB ({'fits' if megatron.fits else 'does not fit'}); the planner's first: "
      f"{huge[0].seconds:.2f} s: Megatron-LM's takes {100 * (megatron.seconds / huge[0].seconds - 1):.0f}% longer")

# %% [markdown]
# In the whole space (the first ranking) every one of the fastest layouts has a pipeline (the next cell finds
# none without one among the 200 fastest that fit): the model states alone are 16 × 175 B = 2.8 TB, and the pp
# line says what tp, dp and ZeRO would hold without a pipeline. pp is the axis whose traffic (one activation per
# micro-batch and stage) can cross InfiniBand; tp stays inside a node (a tp group across nodes would pay section
# 3's 38 s a micro-batch).
#
# The second ranking searches only what Megatron-LM offered when Narayanan et al. 2021 trained GPT-3 175B on
# 1,024 A100s (`Space.megatron_2021()`: tp × pp × dp, 1F1B or interleaved, no ZeRO, no context or sequence
# parallelism, no selective recomputation): its first is **tp 8 inside the node × pp 16 × dp 8**, the paper's
# PTD-P shape. tests/test_costmodel_planner.py checks its step time against the paper's: eq. 3's FLOPs for a
# batch of 1,536 over 1,024 GPUs at 140 TFLOP/s per GPU (the throughput that test cites from the paper) take
# 31.5 s, and the model's 25.6 s is within its stated factor of 1.5 (this `Hardware()` computes at 156 TFLOP/s
# before the bubble and the communication). With the choices that came later -- ZeRO-1, context parallelism,
# ZB-H1's smaller bubble -- the model finds a faster layout still: Megatron-LM's shape takes the percentage
# printed longer.
#
# **Where pipelining pays, and where it does not (P7, P10).** For each scenario, the best layout with a
# pipeline against the best without one, from the same search:

# %% tags=["nbval-check-output"]
for config, gpus, batch in ((PRESETS["GPT-2 small"], 8, 64), (gpt3_13b, 8, 64), (gpt3, 1024, 1536)):
    ranked = plan(config, a100, gpus, batch, top=200)
    best = {kind: next((c for c in ranked if (c.layout.pp > 1) == kind), None) for kind in (False, True)}
    words = []
    for kind, c in best.items():
        label = "with pp" if kind else "without pp"
        words.append(f"{label}: " + (f"{layout_label(c.layout).replace(chr(10), ', ')} {c.seconds * 1e3:.1f} ms"
                                    f" (bubble {c.time.bubble * 1e3:.1f} ms)" if c else "not among the 200 fastest that fit"))
    print(f"{config.name}: " + "; ".join(words))

# %% [markdown]
# For GPT-2 small and the 13B the best pipeline is slower than the best layout without one: the bubble and the
# sends cost more than anything a pipeline saves when the model fits without it (**P10**: "pipeline parallelism
# may bring little for small models"; **P7**: "bubbles remain" -- here they are priced). For 175B on 1,024 GPUs
# a pipeline is what makes it fit.
#
# **Long sequences.** The activations grow with s (and the scores with s²), the parameters do not. The
# Llama-style 7B (the GPT shape at Llama's sizes: an approximation, see `coursekit.viz.costmodel.PRESETS`) on
# 8 GPUs of 80 GB, 8 sequences, at s = 4,096 and at s = 32,768 (learned positions: s·h more parameters):

# %% tags=["nbval-check-output"]
llama = PRESETS["Llama-style 7B"]
for seq_len in (4096, 32768):
    show(replace(llama, seq_len=seq_len), a100, 8, 8, top=3)

# %% [markdown]
# At 4,096 tokens tp 2 × dp 4 is enough. At 32,768 the activations of that layout without recomputation would be 1.4 TB a GPU:
# the planner adds context parallelism (sp 2: each GPU keeps half of every sequence, chapter 06's ring attention
# passing the key and value blocks around) and selective recomputation, which drops the a·s² scores whose
# size grows with the square of the sequence (**P9**: sequence parallelism splits the sequence "to overcome the
# memory limits of attention").

# %% [markdown]
# ## 5. The calculator
#
# Choose a model, a sequence length, a global batch, the GPUs and their links: the left chart stacks what the
# most loaded GPU holds for the fastest layouts that fit (one per choice of degrees), with plain data
# parallelism on every GPU at the right for comparison, and the GPU's memory as a dashed line; the right chart
# splits each step into compute, bubble and exposed communication. Its default state, as a static image (so the
# chapter reads where widgets do not render): the Llama-style 7B, s = 4,096, batch 64, 16 GPUs of 80 GB,
# 8 per node, NVLink 300 GB/s, a network of 25 GB/s per GPU.

# %%
from coursekit.widgets.costmodel import calculator_inputs, strategy_calculator, summary

draw_calculator(*calculator_inputs())
plt.show()
print(summary(calculator_candidates(*calculator_inputs()), *calculator_inputs()[:3]))

# %%
strategy_calculator()

# %% [markdown]
# Try it: GPT-3 175B on 16 GPUs fits nowhere (the sentence says so); raise the GPUs until it does. Set the
# network to 3.125 GB/s and watch the exposed communication of the layouts whose groups cross nodes grow.
# Change GPUs per node to 4 and see which tensor-parallel degrees still rank.
#
# **Exercise** `exercises/07_choose_a_layout.ipynb`: three scenarios; for each, choose a layout that fits and is
# within 10% of the planner's best step time.
