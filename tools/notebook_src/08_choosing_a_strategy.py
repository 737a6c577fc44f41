# ci_parameters: {"TRACE_STEPS": 2, "MFU_STEPS": 3, "ROOFLINE_QUICK": true, "RECOMPUTE_SHAPE": {"batch": 2, "seq": 64, "d_model": 64, "n_heads": 4}}
# %% [markdown]
# # 08 · Choosing a strategy: a memory and time model, and a planner
#
# Chapters 02-07 built every strategy and measured it. This chapter turns those measurements into a
# **[cost model](../docs/glossary.md#cost-model)** you
# can ask before you rent the GPUs: how many bytes each GPU holds and how long a step takes, for any model, any
# machine and any way of combining the strategies. A **planner** then searches every combination and ranks the
# ones that fit. The seed's recommendations, **P1**, **P8** and **P10**, come out of the numbers:
#
# 1. what a *[layout](../docs/glossary.md#layout)* is, and the order of the [axes](../docs/glossary.md#axis) on the mesh;
# 2. memory: each formula beside this course's measurement;
# 3. time: compute, the pipeline's bubble, communication;
# 4. where a step's time went, read from a profiler trace of every rank;
# 5. why some operations run slower than others: this machine's roofline;
# 6. how much of the peak a step uses: MFU;
# 7. recomputation: memory bought with compute;
# 8. the planner on three scenarios, what it can and cannot tell apart, and long sequences;
# 9. a calculator: your model, your machine.
#
# The library is `coursekit.costmodel`: plain functions whose docstrings cite their sources.

# %% tags=["parameters"]
# Parameters: the measurements are one training step at 2 ranks; the rest is arithmetic (seconds).
RANKS = 2                  # ranks of the measured runs (section 2)
TOP = 5                    # layouts printed per scenario (section 8)
TRACE_STEPS = 4            # traced training steps (section 4)
RECOMPUTE_SHAPE = {"batch": 4, "seq": 256, "d_model": 128, "n_heads": 4}   # the course transformer, longer, wider
MFU_STEPS = 10             # timed training steps for MFU (section 6)
ROOFLINE_QUICK = False     # True: small probes (the bandwidth then comes from the caches)

# %%
# %matplotlib inline
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import coursekit
import coursekit.parallel.pipeline  # noqa: F401  (registers the "pipeline" strategy)
from coursekit.costmodel import (MISTAKES, OPTIMIZER_PASSES, Hardware, Layout, ModelConfig, Space, Work,
                                 activation_bytes_per_layer, axis_network, bubble_fraction, communication_bytes,
                                 communication_time, compute_flops, compute_time, evaluate, flops_per_token,
                                 layouts, logits_bytes, margin, mfu, mlp_work, model_error, model_flops_per_token,
                                 model_state_bytes, num_params, optimizer_ops, pair_errors, plan, ranking_error,
                                 ties)
from coursekit.costmodel.published import RUNS as PUBLISHED_RUNS, predict
from coursekit.comm.mesh import coordinates_of
from coursekit.experiments import wide_mlp
from coursekit.experiments.pipeline_sweep import balanced_mlp
from coursekit.experiments.recompute import recompute_table
from coursekit.measure.profile import merge_traces, profiled, write_trace
from coursekit.measure.trace_reading import (backward_windows, computing, exposed_collectives, gradient_all_reduces,
                                             idle_share, in_flight, overlap_from_trace, step_windows)
from coursekit.measure.op_cost import op_overhead
from coursekit.measure.roofline import COURSE_OPS, measure_op, measure_roofline
from coursekit.models import LanguageData, TeacherData, loss_fn, tiny_transformer
from coursekit.parallel.recompute import RecomputedBlock
from coursekit.comm.traffic import Traffic
from coursekit.train import train
from coursekit.viz.costmodel import PRESETS, calculator_candidates, draw_calculator, layout_label
from coursekit.viz.step_time import draw_recompute, draw_roofline, draw_trace, draw_waits

torch.set_num_threads(1)

# %% [markdown]
# ## 1. What a layout is
#
# A **layout** says how G GPUs are used: dp × tp × pp × sp = G, any degree possibly 1.
#
# * **dp**, data parallelism, chapter 02: each replica takes a slice of the batch. **ZeRO** stages 1-3 shard the
#   optimizer state, then the gradients, then the parameters over dp.
# * **tp**, tensor parallelism, chapter 05: every weight matrix split, collectives inside every layer. Megatron's
#   **sequence parallelism**, chapter 06, splits what tp leaves whole.
# * **pp**, pipeline parallelism, chapter 04: the layers in stages, *m* micro-batches, a schedule.
# * **sp**, [context parallelism](../docs/glossary.md#sequence-parallelism), chapter 06's ring attention or Ulysses: each GPU
#   takes a block of the sequence.
#
# torchtitan and the cost model put the ranks on the mesh in the order **pp, dp, sp, tp**, outermost first, so
# neighbouring ranks differ in tp. torchtitan calls sp *cp*, for context parallel. So "**dp 8, tp 2, cp 2, pp 2**"
# is 64 GPUs, and a rank's number, written in that mixed radix, says where it sits:

# %%
coursekit.show(coordinates_of)

# %% [markdown]
# For each rank, its place on each axis, and the link rank 0's group on that axis uses:

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
# With 8 GPUs a node, rank 0's tp group and its sp group stay on [NVLink](../docs/glossary.md#nvlink-and-infiniband). Its dp group spans ranks 4 apart, two per
# node, so it uses both links. Its pp partner is 32 ranks away, on another node. The order follows the traffic:
# tp talks in every layer, so it goes where the link is fastest; pp sends one activation per micro-batch and
# stage, so it can cross nodes.
#
# ## 2. Memory, and what this course measured
#
# How much does each GPU hold? Three terms. First the **[model states]({G}#model-states)**: with Adam, 16 bytes a
# parameter, in fp32 as 4 + 4 + 8 and in mixed precision as 2 + 2 + 12. ZeRO-1 divides the optimizer state by dp,
# ZeRO-2 also the gradients, ZeRO-3 also the parameters. The ZeRO paper's Figure 1, for 7.5 B parameters on 64
# GPUs:

# %% tags=["nbval-check-output"]
for stage in range(4):
    states = model_state_bytes(7_500_000_000, dp=64, zero_stage=stage)
    print(f"ZeRO-{stage}: {states.total / 1e9:7.3f} GB per GPU "
          f"(params {states.params / 1e9:.3g}, grads {states.grads / 1e9:.3g}, optimizer {states.optimizer / 1e9:.3g})")
gpt2 = ModelConfig.gpt2_small()
print(f"num_params(GPT-2 small) = {num_params(gpt2).total:,}; "
      f"the course transformer: {num_params(ModelConfig.course()).total:,}")

# %% [markdown]
# The paper prints 120, 31.4, 16.6 and 1.88 GB. The parameter count for the GPT shape with a tied head gives
# GPT-2 small's published 124,439,808.
#
# Second, the **activations**. Take a micro-batch of b sequences of s tokens, a hidden size h and a attention
# heads. Korthikanti et al. 2022, Table 2, count sbh(34 + 5as/h) bytes a layer, in 16 bits with dropout; the
# 5as/h term is the attention scores. Tensor parallelism over t GPUs divides 24 of the 34 and the scores' term:
# sbh(10 + 24/t + 5as/(ht)). Sequence parallelism also splits the other 10, so the whole is divided by t.
# Selective [recomputation](../docs/glossary.md#activation-recomputation) drops the scores' term. For GPT-3 175B
# at s = 2,048 and b = 1:

# %% tags=["nbval-check-output"]
s, h, a = 2048, 12288, 96
for label, kw in (("no parallelism", {}), ("tp 2", {"tp": 2}), ("tp 8", {"tp": 8}), ("tp 8 + sp", {"tp": 8, "sequence_parallel": True}),
                  ("tp 8 + sp, selective", {"tp": 8, "sequence_parallel": True, "recompute": "selective"})):
    per_layer = activation_bytes_per_layer(s, 1, h, a, **kw).total
    print(f"{label:<22} {per_layer / (s * h):6.2f} · sbh = {per_layer / 2**20:8.1f} MiB a layer")

# %% [markdown]
# The rows without parallelism and at t = 8 are Table 2's: 114, 23, 14.25 and 4.25.
#
# **Against this course's runs.** One training step of the course transformer on 2 ranks, in fp32 with Adam.
# Chapter 02's four ZeRO stages are measured by the storage each allocated. Chapter 04's 1F1B pipeline on 2
# stages is measured by what autograd saves. The traffic each sends is counted message by message:

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
# Every model state is exact except for Adam's `step` counter: 4 bytes for each parameter tensor, which the ZeRO
# paper's 16Ψ leaves out. The activations are Table 2 at 4 bytes without dropout, *selective*, because PyTorch's
# fused attention never keeps the a·s² scores. The model leaves out LayerNorm's statistics, attention's
# log-sum-exp and the token ids: about 1%.
#
# And the traffic, `communication_bytes`, against what was counted:

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
# **Takeaway:** every byte of model state and every element sent matches the formulas; the activations match
# within 1%.
#
# ## 3. Time: compute, bubble, communication
#
# How long does a step take? The model adds three terms:
#
# * **compute**: each kernel by its shape. `Hardware.a100()` is an A100, 312 TFLOP/s in bf16, as Calculon
#   describes it: a matmul runs at the share of peak its size reaches, 0.95 from 128 GFLOP up, 0.9 from 16,
#   0.6 from 1; the memory-bound operations are priced by the bytes they move. Against Korthikanti et al.
#   2022's eight measured GPT steps on A100s it is within 8%.
# * **the bubble**: chapter 04's (p − 1)/(m + p − 1) for 1F1B.
# * **communication**: each collective through chapter 01's network model, on the link its group uses: NVLink
#   inside a node at 0.65 of its bandwidth, InfiniBand across at 0.9.
#
# What overlaps what is a named argument, zero by default. For GPT-3 175B on 1,024 A100s:

# %% tags=["nbval-check-output"]
a100 = Hardware.a100()    # an A100 priced kernel by kernel (section 3)
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
# **Takeaway:** compute differs by layout, least without tp and most at tp = 16, whose matmuls are the
# smallest; the communication and the memory differ far more: tp = 16 across nodes spends 42.455 s a step in its
# all-reduces, and dp × pp without tp does not fit.
#
# The first row is Narayanan et al. 2021's layout for this model, from their Table 1: **tp 8 × pp 16 × dp 8**.
#
# ## 4. A trace of every rank
#
# Where did a step's time go? A **profiler** records every operation a rank runs, on which thread and when.
# `torch.profiler` writes one trace per rank. We merge them into one file, one process per rank on one clock,
# that opens in Perfetto (ui.perfetto.dev) or `chrome://tracing`.
#
# We trace chapter 02's bucketed data parallelism on 2 ranks, its all-reduces started from backward's hooks.
# From the trace we read each backward pass on a rank's main thread, and each gradient all-reduce from the
# moment it was issued until gloo's thread finished it:

# %% tags=["nbval-ignore-output"]
def traced(rank, world_size):
    with profiled() as recording:
        train(rank, world_size, "bucketed", model="transformer", steps=TRACE_STEPS, record=False, overlap=True)
    return recording.trace


step_trace = merge_traces(coursekit.launch(traced, 2))
path = write_trace(step_trace, Path(tempfile.gettempdir()) / "coursekit_step_trace.json.gz")
print(f"{len(step_trace['traceEvents']):,} events of 2 ranks in {path.name}: open it in ui.perfetto.dev")
windows = {rank: backward_windows(step_trace, rank) for rank in (0, 1)}
flights = {rank: gradient_all_reduces(step_trace, rank) for rank in (0, 1)}
for rank in (0, 1):
    print(f"rank {rank}: {len(flights[rank])} gradient all-reduces; {overlap_from_trace(step_trace, rank):.0%} of "
          "their time ran during backward")
last = windows[0][-1]
draw_trace(step_trace, windows, flights, (last[0] - 100, max(end for _, _, end in flights[0]) + 100));

# %% [markdown]
# **Takeaway:** the buckets' all-reduces run on gloo's threads while backward computes: 62% of their time is
# hidden behind it on rank 0, 74% on rank 1.
#
# <details><summary>How this was measured</summary>
#
# Each rank's profiler stamps its events in microseconds since its own start, and the export records that start
# on the machine's clock, so the merged trace puts both ranks on one clock: the two halves of each all-reduce
# line up. Chapter 02's timeline stamps the same moments from Python, where a callback on gloo's thread waits
# for the interpreter's lock and a free core. On a quiet machine its share agrees with the trace's within
# 3 points; on a busy one it can be 12 points off (`python -m coursekit.bench trace`).
# </details>
#
# The same kind of trace answers two more questions. **Where does a pipeline wait?** A receive that blocks is
# no operation, so a rank's waiting is the gaps between the operations on its main thread. **Is an all-reduce
# on the critical path?** It is when the main thread computes nothing while gloo runs it. We trace chapter 04's
# 1F1B on 2 ranks, at m = 1 and m = 4. Its model is an MLP of 8 layers 1,024 wide whose two halves cost the
# same. Then chapter 05's tensor parallelism on the course transformer:

# %% tags=["nbval-ignore-output"]
def traced_run(rank, world_size, strategy, **options):
    with profiled() as recording:
        train(rank, world_size, strategy, steps=TRACE_STEPS, record=False, **options)
    return recording.trace


pipelined = {m: merge_traces(coursekit.launch(traced_run, 2, "pipeline", micro_batches=m, model=balanced_mlp,
                                              data=TeacherData(1536, 1024), global_batch=256, optimizer="sgd"))
             for m in (1, 4)}
for m, trace in pipelined.items():
    print(f"1F1B, m = {m}: the ranks wait {idle_share(trace, 0):.0%} and {idle_share(trace, 1):.0%} of a step; "
          f"the schedule's bubble is {bubble_fraction(Layout(pp=2, micro_batches=m)):.0%}")
tensor_trace = merge_traces(coursekit.launch(traced_run, 2, "tensor", model="transformer"))
step_us, flying, beside = exposed_collectives(tensor_trace, 0)
print(f"tensor parallelism: gloo's all-reduces in flight {flying / step_us:.0%} of rank 0's step; its main thread "
      f"computed during {beside / flying:.0%} of that time")
draw_waits([("1F1B, m = 4, one step of 2 ranks", {r: (computing(pipelined[4], r), in_flight(pipelined[4], r))
                                                   for r in (0, 1)}, step_windows(pipelined[4], 0)[-1]),
            ("tensor parallelism, one step of 2 ranks", {r: (computing(tensor_trace, r), in_flight(tensor_trace, r))
                                                         for r in (0, 1)}, step_windows(tensor_trace, 0)[-1])]);

# %% [markdown]
# **Takeaway:** at m = 1 the pipeline's ranks wait 48% and 52% of a step, at m = 4 27% and 25%, against
# bubbles of 50% and 20%. Tensor parallelism's all-reduces fill 38% of the step, and the main thread computes
# during 0% of them: they are on the critical path.
#
# At m = 4 the waits exceed the bubble: each micro-batch crosses between the ranks twice, and a message's
# latency does not shrink with the micro-batch (chapter 04's sweep measures it).
#
# ## 5. The roofline of this machine
#
# Why is a wide layer fast and the course transformer slow, on the same core? Every operation does some
# arithmetic on some bytes. Its **arithmetic intensity** is FLOPs per byte moved to or from memory. A core can
# do at most its *peak* FLOP/s, and move at most its memory *bandwidth*. So an operation runs at most at
# min(peak, intensity × bandwidth): the **[roofline](../docs/glossary.md#roofline)** (Williams et al. 2009). Below the *ridge*, peak ÷
# bandwidth, memory is the limit; above it, arithmetic is.
#
# We measure both on one core: a large matrix product for the peak, a copy of arrays larger than the caches for
# the bandwidth. Then we time the course's own operations and place them:

# %% tags=["nbval-ignore-output"]
roof = measure_roofline(threads=1, quick=ROOFLINE_QUICK)
print(f"one core: peak {roof.peak / 1e9:.0f} GFLOP/s, bandwidth {roof.bandwidth / 1e9:.1f} GB/s, "
      f"ridge {roof.ridge:.1f} FLOP/byte")
points = {}
for name, op, shapes in COURSE_OPS:
    if name in ("wide MLP up", "MLP up", "layer norm", "attention softmax", "attention scores, one head"):
        measured = measure_op(op, shapes)
        points[name] = (measured.intensity.value, measured.flops_per_second)
        print(f"{name:<28} intensity {measured.intensity.value:6.1f}   {measured.flops_per_second / 1e9:6.1f} GFLOP/s"
              f"   roof {roof.attainable(measured.intensity) / 1e9:6.1f}")
draw_roofline(roof, points);

# %% [markdown]
# **Takeaway:** the matrix products are compute-bound and run at the peak: the wide MLP's at 93.5 GFLOP/s
# against a measured 92 (the peak is one product's speed, and another can beat it by a few percent). Layer norm
# and softmax are memory-bound: about one FLOP per byte, at 7.1 and 5.2 GFLOP/s.
#
# A transformer step is many such operations. The wide ones set its speed only when they are most of it.
#
# ## 6. MFU: how much of the peak a step uses
#
# **[Model FLOPs utilisation](../docs/glossary.md#mfu)** (MFU) is the FLOPs a step *must* do, divided by the
# time it took and the hardware's peak. Training a token costs about 6 FLOPs per weight it meets (2 forward, 4
# backward), plus attention's 12·L·h·s for L layers of width h and sequences of s tokens. That is the count PaLM
# and torchtitan use:

# %%
coursekit.show(model_flops_per_token)

# %% [markdown]
# We time a few Adam steps of the course transformer and of the wide MLP of chapter 05, on one core, and divide
# by this core's measured peak. Beside each, the cost model's step on this core. It prices the FLOPs at the
# roofline's peak. It adds every operation's fixed cost, measured on tiny layers. And it adds the bytes the
# memory-bound parts move (norms, activations, weights read, Adam's passes) at the roofline's bandwidth:

# %% tags=["nbval-ignore-output"]
def tokens_per_second(model, inputs, tokens, loss_of, steps=MFU_STEPS):
    """Tokens a second over ``steps`` Adam steps of ``model`` on ``inputs`` (after one step to warm up)."""
    optimizer = torch.optim.Adam(model.parameters())
    for step in range(steps + 1):
        if step == 1:
            begin = time.perf_counter()
        optimizer.zero_grad()
        loss_of(model(inputs)).backward()
        optimizer.step()
    return tokens * steps / (time.perf_counter() - begin)


course = ModelConfig.course()
inputs, targets = LanguageData(seq_len=65).batch(step=0, batch_size=8)           # 8 sequences of 64 tokens
course_rate = tokens_per_second(tiny_transformer(seed=0), inputs, inputs.numel(), lambda y: loss_fn(y, targets))
wide = torch.nn.Sequential(*wide_mlp(blocks=4))                                 # 1,024 -> 4,096 -> 1,024, 4 blocks
rows = torch.randn(512, 1024)
wide_rate = tokens_per_second(wide, rows, rows.shape[0], lambda y: y.square().mean())
wide_flops = flops_per_token(matmul_params=4 * 2 * 1024 * 4096, layers=0, hidden=1024, seq_len=0)
print(f"{'':<20}{'FLOPs a token':>15}{'tokens/s':>12}{'MFU':>8}")
print(f"{'course transformer':<20}{model_flops_per_token(course, 64):>15,.0f}{course_rate:>12,.0f}"
      f"{mfu(course_rate, model_flops_per_token(course, 64), roof.peak):>8.1%}")
print(f"{'wide MLP':<20}{wide_flops:>15,.0f}{wide_rate:>12,.0f}{mfu(wide_rate, wide_flops, roof.peak):>8.1%}")

this_core = Hardware(memory=float("inf"), flops=roof.peak, efficiency=1.0, op_overhead=op_overhead()[0],
                     memory_bandwidth=roof.bandwidth, name="this core")
wide_params = [p.numel() for p in wide.parameters()]
adam = Work(ops=optimizer_ops(len(wide_params)), bytes=sum(wide_params) * OPTIMIZER_PASSES["adam"] * 4)
predicted = {"course transformer": compute_time(course, Layout(), this_core, global_batch=8, itemsize=4).total,
             "wide MLP": (mlp_work(512, 1024, 4096, blocks=4) + adam).seconds(this_core)}
for name, rate, tokens in (("course transformer", course_rate, inputs.numel()), ("wide MLP", wide_rate, 512)):
    print(f"{name}: a step measured {tokens / rate * 1e3:.1f} ms, the cost model {predicted[name] * 1e3:.1f} ms "
          f"({predicted[name] * rate / tokens:.2f}×)")

# %% [markdown]
# **Takeaway:** on the same core the wide MLP uses 88.9% of the peak and the course transformer 41.5%: its
# operations are small, and its memory-bound ones run far below the peak. Priced with each operation's fixed
# cost and bytes, the cost model's step is 0.75× the course transformer's and 0.99× the wide MLP's.
#
# On this core, that is where its time holds. With two ranks it misses by more: the course's own loop and
# hooks around a tiny model, and gloo's stalls while both ranks compute, are not in it.
#
# On GPUs the same arithmetic judges real runs. torchtitan reports Llama 3.1 8B on 8 H100s at 5,762 tokens a
# second per GPU (bf16, FSDP, sequences of 8,192). Its 7.5 billion matmul weights, counted by hand, and the H100's
# dense bf16 peak of 989 TFLOP/s give its MFU. Then the usual mistakes, each giving another number:

# %% tags=["nbval-check-output"]
llama_flops = flops_per_token(matmul_params=7_504_658_432, layers=32, hidden=4096, seq_len=8192)
print(f"Llama 3.1 8B, 8 H100s: {llama_flops / 1e9:.2f} GFLOP a token, MFU {mfu(8 * 5762, llama_flops, 989e12, gpus=8):.1%}"
      " (torchtitan reports 33-39%)")
print()
gpt2 = ModelConfig.gpt2_small()
print(f"{'the mistake':<32}{'GPT-2 small, 8 GPUs: MFU x':>28}   why it is wrong")
for mistake in MISTAKES:
    if mistake.name == "all experts":
        continue                                        # a dense model has no experts to miscount
    factor = mistake.wrong(1e6, gpt2, 312e12, gpus=8) / mfu(1e6, gpt2, 312e12, gpus=8)
    print(f"{mistake.name:<32}{factor:>28.2f}   {mistake.why}")

# %% [markdown]
# **Takeaway:** torchtitan's Llama run uses 33.7% of its GPUs' peak. For GPT-2 small, counting the embedding as
# work gives 1.27 times the true MFU, and the whole run's tokens against one GPU's peak 8.00 times: numbers that
# look better and mean nothing.
#
# The embedding's factor depends on the model. Llama 3.1 8B's vocabulary matrix is a smaller share of its work,
# so there the same mistake gives about 1.05.
#
# ## 7. Recomputation: memory bought with compute
#
# A layer keeps tensors from its forward for its backward. **[Recomputation](../docs/glossary.md#activation-recomputation)**
# keeps fewer and computes them again in backward (Korthikanti et al. 2022). *Full* keeps only a block's input
# and reruns the block. *Selective* reruns only attention's core, QKᵀ, the softmax and the product with V: cheap
# to redo, and its s × s probabilities are the biggest thing a layer keeps at long sequences. Both are
# `torch.utils.checkpoint`, around the whole block or around the core:

# %%
coursekit.show(RecomputedBlock)

# %% [markdown]
# We measure what a layer keeps, with saved-tensor hooks, and count the FLOPs of one step under each policy.
# Attention is written out here, so that its probabilities are kept: PyTorch's fused attention kernel on CPU
# already recomputes its scores, as selective recomputation does.

# %% tags=["nbval-ignore-output"]
recompute_rows = [r for r in recompute_table(**RECOMPUTE_SHAPE, repeats=3) if r.variant != "fused"]
none = next(r for r in recompute_rows if r.variant == "none")
print(f"{'policy':<10}{'kept per layer':>16}{'cost model':>12}{'GFLOP a step':>14}{'more FLOPs':>12}")
for r in recompute_rows:
    print(f"{r.variant:<10}{r.saved_per_layer / 2**20:>12.2f} MiB{(r.model_per_layer + r.left_out) / 2**20:>8.2f} MiB"
          f"{r.flops / 1e9:>14.3f}{r.flops / none.flops - 1:>+12.0%}")
draw_recompute(recompute_rows);

# %% [markdown]
# **Takeaway:** selective recomputation cuts what a layer keeps from 12.02 MiB to 8.02 MiB for 4% more FLOPs;
# full recomputation keeps 0.50 MiB for 25% more. The cost model's bytes are the measured ones.
#
# <details><summary>How this was measured</summary>
#
# Saved-tensor hooks count every tensor autograd keeps in one layer's forward. The cost model's bytes are
# Korthikanti et al.'s Table 2 at 4 bytes without dropout; the measurement also holds LayerNorm's mean and
# 1/std, which the table leaves out and the figure adds. FLOPs are counted by `torch.utils.flop_counter`.
# PyTorch's checkpoint stops recomputing at the last tensor backward needs, so full recomputation costs less
# than a whole extra forward. `tests/test_recompute.py` checks the bytes for every policy and the FLOPs by hand.
# </details>
#
# ## 8. The planner: three scenarios (P1, P8, P10)
#
# `plan(config, hardware, gpus, global_batch)` walks every valid layout: the degrees, ZeRO 0-3, chapter 04's four
# schedules, every number of micro-batches, the recomputations, sequence parallelism on and off. It keeps those
# that fit and ranks them by modelled step time. Every reason it prints is computed from the numbers; nothing
# says "tp stays in a node".
#
# **What the model can tell apart.** Its bytes are exact, as section 2 checked, so *fits or not* is firm. Its
# time is coarser. Against published runs on H100s it prices each GPU by shape (`Hardware.h100()`): a matmul at
# the share of peak its size reaches, attention at a flash kernel's measured speed, Llama with its own shapes
# (grouped-query attention, SwiGLU). The planner below prices A100s the same way, with section 3's
# `Hardware.a100()`.

# %% tags=["nbval-check-output"]
for p in map(predict, PUBLISHED_RUNS):
    print(f"{p.run.name}: published {p.run.tokens_per_gpu:,.0f} tokens/s per GPU, predicted "
          f"{p.tokens_per_gpu:,.0f} ({p.ratio:.2f}×)")
print(f"one run's speed: off by up to {model_error():.2f}×; the ratio of two layouts of one model "
      f"(405B on 16,384 against 8,192 GPUs): off by {ranking_error():.2f}×")
pairs = pair_errors()
worst = max(pairs, key=lambda pair: pair[2])
print(f"the ratio over all {len(pairs)} pairs of one model on one machine, with Korthikanti's and Narayanan's A100 "
      f"runs: off by up to {margin():.2f}× ({worst[0].name} against {worst[1].name})")

# %% [markdown]
# **Takeaway:** one run's speed is off by up to 1.74× (torchtitan's eager run; every other run within 1.12×); the
# ratio of the 405B's two layouts only by 1.11×, but the ratio of two layouts over every published pair by up to
# 1.65×: ZeRO-3 against tensor and pipeline parallelism for GPT-3 175B.
#
# A ranking compares layouts of one model on one machine, so what is wrong for all of them alike cancels. That
# is how fast one code base runs the same step (torchtitan's eager and compiled runs are 1.16× apart, and both
# reach a lower share of peak than NeMo's on the same model), and the card's true peak. What does not cancel is
# what differs between the layouts: the model hides ZeRO-3's gathers behind compute, and Narayanan et al.'s
# ZeRO-3 runs took about as long as both added. So the model separates gaps like tp across nodes, 63 s against
# 21 s, but layouts within 1.65× of the first, the worst published pair (`margin()`), are a **tie** for it:
# `ties(ranked)` lists them, and the planner below says so.

# %%
def show(config, hardware, gpus, batch, top=TOP, space=Space(), where="", **assumptions):
    ranked = plan(config, hardware, gpus, batch, top=top, space=space, **assumptions)
    print(f"{config.name} ({num_params(config).total / 1e9:.3g} B parameters), {gpus} GPUs of "
          f"{hardware.memory / 1e9:.0f} GB, batch {batch}, s = {config.seq_len}"
          + (f", {assumptions}" if assumptions else "") + (f", {where}" if where else "") + ":")
    for i, c in enumerate(ranked):
        print(f"  {i + 1}. {layout_label(c.layout).replace(chr(10), ', '):<34} {c.seconds * 1e3:9.1f} ms  "
              f"{c.memory.total / 1e9:5.1f} GB")
    if len(ranked) > 1:
        tied, spread = ties(ranked), ranked[-1].seconds / ranked[0].seconds - 1
        print(f"  all {len(ranked)} within {spread:.1%} of the first: a tie for this model" if len(tied) == len(ranked)
              else f"  the first {len(tied)} are a tie for this model; the last is {spread:.0%} slower than the first")
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
# **A model that fits one GPU**: GPT-2 small has 2 GB of model states on an 80 GB GPU. Every layout listed is data
# parallelism alone, **P1** and **P10**: "a small model that fits one GPU → data parallelism". Its collectives
# stay on NVLink and cost 4% of the step. The five differ only in the ZeRO stage and, for the last, in cutting
# the batch into two micro-batches. In the labels, `Z1` is ZeRO-1, `m` the micro-batches, `sel` selective
# recomputation and `SP` Megatron's sequence parallelism.
#
# **A model too large for one GPU**: GPT-3's 13 B shape on one node of 8 × 80 GB. Its model states alone are
# 206 GB, so plain data parallelism cannot hold them:

# %% tags=["nbval-check-output"]
gpt3_13b = ModelConfig(51200, 2048, 5120, 40, 40, name="GPT-3 13B")
print(f"plain dp on 8 GPUs: {evaluate(gpt3_13b, Layout(dp=8), a100, 64).memory.total / 1e9:.0f} GB per GPU")
big = show(gpt3_13b, a100, 8, 64)
print()
big_overlap = show(gpt3_13b, a100, 8, 64, dp_overlap=1.0)

# %% [markdown]
# **Takeaway:** for the 13B model, plain data parallelism would need 592 GB a GPU. Every layout listed splits
# the model states: by tensor parallelism, a pipeline, or ZeRO. Which is faster, the model cannot tell.
#
# The first ranking answers **P8**: "too large for one GPU → data + tensor parallelism combined". Granted that
# the gradient collectives overlap the backward pass, `dp_overlap=1.0`, ZeRO-2 over all 8 GPUs comes first
# instead. That is the seed's other answer: shard the model with data parallelism, as DeepSpeed's ZeRO does. Both
# rankings list layouts within 2.4% of their first: ties for this model.
#
# **A model that fills a cluster**: GPT-3 175B on 1,024 A100s, batch 1,536. The second ranking searches only
# what Megatron-LM offered in 2021: tp × pp × dp, 1F1B or interleaved, no ZeRO, no context parallelism.

# %% tags=["nbval-check-output"]
huge = show(gpt3, a100, 1024, 1536)
print()
megatron_space = show(gpt3, a100, 1024, 1536, space=Space.megatron_2021(), where="in Megatron-LM's 2021 space")
megatron = evaluate(gpt3, Layout(dp=8, tp=8, pp=16, micro_batches=192), a100, 1536)
print(f"Megatron-LM's shape, tp 8 × pp 16 × dp 8, 1F1B: {megatron.seconds:.2f} s, "
      f"{megatron.memory.total / 1e9:.1f} GB ({'fits' if megatron.fits else 'does not fit'}); the planner's first: "
      f"{huge[0].seconds:.2f} s: Megatron-LM's takes {100 * (megatron.seconds / huge[0].seconds - 1):.0f}% longer")

# %% [markdown]
# **Takeaway:** for GPT-3 175B the fastest layouts all have a pipeline; in Megatron-LM's 2021 space, which has no
# ZeRO, the planner finds the paper's tp 8 × pp 16 × dp 8.
#
# pp is the axis whose traffic can cross InfiniBand, and tp stays inside a node. The choices that came later,
# ZeRO-1, selective recomputation with Megatron's sequence parallelism and ZB-H1's smaller bubble, give a layout
# the model prices faster: Megatron-LM's takes 18% longer. That is inside the 1.65× within which the model
# cannot tell two layouts apart: a tie.
#
# Priced by shape, compute is no longer the same for every layout. The planner's first computes 14.5 s a step,
# its recomputation included: tp = 4 and micro-batches of two sequences make each matmul four times as large as
# in Megatron-LM's layout, tp = 8 on one sequence, which computes 16.3 s.
#
# **Where pipelining pays, and where it does not (P7, P10).** For each scenario, the best layout with a pipeline
# against the best without one:

# %% tags=["nbval-check-output"]
for config, gpus, batch in ((PRESETS["GPT-2 small"], 8, 64), (gpt3_13b, 8, 64), (gpt3, 1024, 1536)):
    flat = (evaluate(config, layout, a100, batch) for layout in layouts(config, a100, gpus, batch) if layout.pp == 1)
    best = {False: min((c for c in flat if c.fits), key=lambda c: c.seconds, default=None),  # the whole space, pp = 1
            True: next((c for c in plan(config, a100, gpus, batch, top=100) if c.layout.pp > 1), None)}
    words = [f"{'with' if kind else 'without'} pp: {layout_label(c.layout).replace(chr(10) + '-', '').replace(chr(10), ', ')} "
             f"{c.seconds * 1e3:.1f} ms (bubble {c.time.bubble * 1e3:.1f} ms)" for kind, c in best.items() if c]
    ratio = best[False].seconds / best[True].seconds
    print(f"{config.name}: " + "; ".join(words) + f"; without / with: {ratio:.2f}")

# %% [markdown]
# **Takeaway:** for GPT-2 small the best layout without a pipeline takes 0.77 of the time of the best with one,
# for the 13B model 0.98, and for 175B every layout without one is at least 1.38× slower.
#
# That is **P10**'s "pipeline parallelism may bring little for small models", and **P7**'s "bubbles remain",
# priced. All three gaps are inside the model's 1.65×, though: it leans towards a pipeline for 175B, and cannot
# promise it.
#
# **Long sequences.** The activations grow with s, and the scores with s²; the parameters do not. A Llama-style
# 7 B on 8 GPUs of 80 GB, 8 sequences, at s = 4,096 and at s = 32,768:

# %% tags=["nbval-check-output"]
llama = PRESETS["Llama-style 7B"]
for seq_len in (4096, 32768):
    show(replace(llama, seq_len=seq_len), a100, 8, 8, top=3)

# %% [markdown]
# **Takeaway:** at 32,768 tokens the first layout's activations, split by tp 2 and sp 2, would need 1,412 GB a
# GPU without recomputation; selective recomputation brings them to 37.7 GB.
#
# That is **P9**: split the sequence "to overcome the memory limits of attention". Each GPU keeps half of every
# sequence, with chapter 06's ring passing the key and value blocks around.

# %% [markdown]
# ## 9. The calculator
#
# Choose a model, a sequence length, a batch, the GPUs and their links. The left chart stacks what the most
# loaded GPU holds, for the fastest layouts that fit and for plain data parallelism; the dashed line is the
# GPU's memory, and a layout that does not fit is hatched. The right chart splits each step into compute, bubble and exposed communication. Its default
# state, as a static image: the Llama-style 7 B, s = 4,096, batch 64, 16 GPUs of 80 GB, 8 per node.

# %%
from coursekit.widgets.costmodel import calculator_inputs, strategy_calculator, summary

draw_calculator(*calculator_inputs())
plt.show()
print(summary(calculator_candidates(*calculator_inputs()), *calculator_inputs()[:3]))

# %%
strategy_calculator()

# %% [markdown]
# Try it: GPT-3 175B on 16 GPUs fits nowhere; raise the GPUs until it does. Set the network to 3.125 GB/s and
# watch the exposed communication grow where groups cross nodes. Change GPUs per node to 4 and see which
# tensor-parallel degrees still rank.
#
# **Exercise** `exercises/08_choose_a_layout.ipynb`: write a function that lays out any training run by this
# chapter's rules; it is graded on three runs you see and three you do not.
