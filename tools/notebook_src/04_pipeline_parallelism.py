# ci_parameters: {"SPEED_STEPS": 3, "SWEEP_M": [1, 2, 4, 8], "SWEEP_WIDTH": 512, "SWEEP_BATCH": 128, "SWEEP_ITERS": 2, "RACE_WIDTH": 512, "RACE_BATCH": 64, "RACE_ITERS": 2}
# %% [markdown]
# # 04 · Pipeline parallelism: micro-batches fill the chain
#
# Chapter 03 cut the model into stages, one per GPU, and found a chain: while one GPU computes, the others
# wait (**P3**). **[Pipeline parallelism](../docs/glossary.md#pipeline-parallelism)**, claim **P7**, keeps the stages but cuts
# the batch into **[micro-batches](../docs/glossary.md#micro-batch)**. While micro-batch 2 goes forward on GPU 2, micro-batch 3
# can go forward on GPU 1. Idle time, the **[bubble](../docs/glossary.md#bubble)**, remains at the start and the end of each
# step.
#
# How big the bubble is depends on the **[schedule](../docs/glossary.md#pipeline-schedule)**: the order in which each GPU runs
# its forwards and backwards. Here a schedule is data, a list of actions per rank. The chapter builds four:
#
# * **[GPipe](../docs/glossary.md#gpipe)**: every forward, then every backward.
# * **[1F1B](../docs/glossary.md#1f1b)**: after a warm-up, one forward, one backward.
# * **[Interleaved 1F1B](../docs/glossary.md#interleaved-1f1b)**: *v* smaller stages per rank, a *v* times smaller bubble.
# * **[ZB-H1](../docs/glossary.md#zero-bubble)**: the backward split in two, part of it moved into the bubble.
#
# <details><summary>The papers</summary>
#
# GPipe: Huang et al. 2019. 1F1B, also called PipeDream-Flush, and interleaved 1F1B: Narayanan et al. 2021.
# ZB-H1: Qi et al. 2023, "Zero Bubble Pipeline Parallelism". One validator rejects a bad schedule before
# anything runs, one executor runs any valid one, and every schedule is checked against one process.
# </details>

# %% tags=["parameters"]
# Parameters: small by default so the notebook runs in about a minute; raise them freely.
PLAN_RANKS = 4                 # p of the planned schedules (no processes: any p)
PLAN_MICRO_BATCHES = 8         # m of the planned schedules
RUN_RANKS = 2                  # ranks of the real runs (2 cores here: 2 ranks each get one)
RUN_MICRO_BATCHES = [1, 2, 4, 8]  # m of the real runs
GLOBAL_BATCH = 16              # sequences per step
SPEED_STEPS = 6                # steps per timing (the first is warm-up)
SWEEP_M = [1, 2, 4, 8, 16]     # m of the P7 sweep (section 6), at a fixed global batch
SWEEP_WIDTH = 1024             # its MLP's width: wide, so that compute dominates
SWEEP_BATCH = 256              # its global batch
SWEEP_ITERS = 7                # paired iterations per m
RACE_WIDTH = 2048              # the MLP the four schedules race on (section 4): wide, so that compute dominates
RACE_BATCH = 256               # its global batch
RACE_ITERS = 7                 # repeats of the four schedules

# %%
# %matplotlib inline
import time
from fractions import Fraction

import matplotlib.pyplot as plt
import torch

import coursekit
from coursekit.parallel.pipeline import (SCHEDULES, bubble_formula, make_schedule, measured_bubble,
                                         peak_activations_formula, plan, validate, ScheduleError)
from coursekit.train import train
from coursekit.measure.verify import compare
from coursekit.viz.pipeline import draw_plan, draw_plan_and_measured, draw_plans

torch.set_num_threads(1)  # one thread per process, as every rank has: the single-process baseline is comparable

# %% [markdown]
# ## 1. A schedule is a list of actions per rank
#
# What exactly does a GPU do in a pipelined step? Here is 1F1B on 2 ranks with 4 micro-batches. `F3@s1` is the
# forward of micro-batch 3 on stage 1. `SEND_F3@s0` sends stage 0's output of micro-batch 3 to the next stage,
# and `RECV_B3@s0` receives its gradient back. A send does not block; a receive waits for its send.

# %% tags=["nbval-check-output"]
schedule = make_schedule("1f1b", 2, 4)
for rank, actions in enumerate(schedule.actions):
    print(f"rank {rank}: " + " ".join(str(a) for a in actions))

# %% [markdown]
# The executor runs any such list. It takes this rank's actions in order and does each one; everything a
# later action needs is kept under its (stage, micro-batch) key:

# %%
from coursekit.parallel.pipeline import Step, run_schedule

coursekit.show(run_schedule)

# %%
coursekit.show(Step.run)

# %% [markdown]
# A learner's schedule that would [deadlock](../docs/glossary.md#deadlock), or compute before its input has arrived, is
# rejected with a sentence instead of a hung rank. Here rank 1's first two actions are swapped: it would run the
# forward of micro-batch 0 before receiving its input.

# %% tags=["nbval-check-output"]
from dataclasses import replace

broken = replace(schedule, actions=[list(a) for a in schedule.actions])
broken.actions[1][0], broken.actions[1][1] = broken.actions[1][1], broken.actions[1][0]
try:
    validate(broken)
except ScheduleError as error:
    print(error)

# %% [markdown]
# **Takeaway:** a schedule is only an order of actions, and one short loop runs them all.
#
# ## 2. Planned: the four schedules on a unit-time clock
#
# How much idle time does each schedule leave? Say a forward takes one unit of time and a backward two. The
# plan below runs each schedule by the executor's rules on that clock. Empty cells are the bubble. The papers'
# formulas, written separately, give the same fractions:
#
# * GPipe and 1F1B: $(p-1)/(m+p-1)$, the same bubble. 1F1B's gain is memory.
# * Interleaved 1F1B with $v$ stages per rank: $(p-1)/(v\,m+p-1)$.
# * ZB-H1: $(p-1)(T_F+T_B-T_W)$ idle next to $m(T_F+T_B+T_W)$ of work.

# %%
configs = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb_h1", 1)]
plans = {name: plan(make_schedule(name, PLAN_RANKS, PLAN_MICRO_BATCHES, v)) for name, v in configs}
fig = draw_plans(list(plans.values()), titles=[f"{name} (v = {v})" for name, v in configs])
plt.show()

# %% tags=["nbval-check-output"]
print(f"p = {PLAN_RANKS}, m = {PLAN_MICRO_BATCHES}")
print(f"{'schedule':<12} {'planned bubble':>15} {'formula':>10}  equal?   peak activations per rank (plan / formula)")
for name, v in configs:
    p_ = plans[name]
    formula = bubble_formula(name, PLAN_RANKS, PLAN_MICRO_BATCHES, v)
    peaks = p_.peak_activations
    expected = [peak_activations_formula(name, PLAN_RANKS, PLAN_MICRO_BATCHES, r, v) for r in range(PLAN_RANKS)]
    print(f"{name:<12} {str(p_.bubble_fraction):>15} {str(formula):>10}  {'yes' if p_.bubble_fraction == formula else 'NO':<7}"
          f"  {peaks} / {expected}")

# %% [markdown]
# **Takeaway:** GPipe and 1F1B leave the same bubble; interleaving and ZB-H1 shrink it.
#
# The last column counts the micro-batches whose activations a rank holds at once. GPipe holds all *m* before
# its first backward. 1F1B starts backward as soon as the first micro-batch reaches the last stage, so rank *r*
# holds at most *p − r*. Interleaving pays for its smaller bubble with more messages and more activations.
#
# <details><summary>How the columns count</summary>
#
# Interleaving's column counts chunks of 1/*v* of a rank's layers, so 1F1B's *p − r* become *v·(p − r)*; its
# longer warm-up holds at least that on every rank. For ZB-H1 the column counts a micro-batch until its B. Its W
# still needs the layer inputs, so counted until W every rank holds *p*; section 5 measures that.
# </details>
#
# **What crosses between stages?** Each boundary carries a micro-batch's activations forward and their gradient
# back. At a fixed global batch that is the same bytes whatever *m* is: smaller messages, more of them. Below,
# `pipeline_traffic` counts them from a schedule's actions, beside what `coursekit.comm` recorded on real ranks
# and what data parallelism's all-reduce would send for the same model.

# %% tags=["nbval-check-output"]
from coursekit import comm
from coursekit.models import LanguageData, count_parameters, tiny_transformer
from coursekit.parallel.pipeline import all_reduce_bytes, pipeline_traffic, pipeline_traffic_formula

TRAFFIC_M = 4
transformer = tiny_transformer(seed=0)
seq, width, vocab = LanguageData().seq_len - 1, transformer.tok_emb.embedding_dim, transformer.tok_emb.num_embeddings
psi = count_parameters(transformer)
per_micro_batch = GLOBAL_BATCH // TRAFFIC_M * seq * width       # one micro-batch's activations at a boundary
tied = 2 * vocab * width * 4                                      # the tied embedding's gradient, both ways


def counted(rank, world_size):
    return [train(rank, world_size, "pipeline", schedule=name, stages_per_rank=v, micro_batches=TRAFFIC_M,
                  model="transformer", steps=1, global_batch=GLOBAL_BATCH, record=False,
                  count_traffic=True)["traffic"] for name, v in configs]


recorded = coursekit.launch(counted, RUN_RANKS, timeout=300)
print(f"course transformer: b = {GLOBAL_BATCH}, s = {seq}, h = {width}; p = {RUN_RANKS}, m = {TRAFFIC_M}: "
      f"{per_micro_batch:,} elements per message")
print(f"{'schedule':<12} {'boundaries':>10} {'messages':>9} {'per micro-batch':>16} {'per step':>10} "
      f"{'formula':>10} {'recorded (− tied)':>18}")
for k, (name, v) in enumerate(configs):
    t = pipeline_traffic(make_schedule(name, RUN_RANKS, TRAFFIC_M, v), per_micro_batch)
    formula = pipeline_traffic_formula(RUN_RANKS, TRAFFIC_M, per_micro_batch, v)
    got = comm.Traffic.merge([recorded[r][k] for r in range(RUN_RANKS)]).total_bytes - tied
    print(f"{name:<12} {t.boundaries:>10} {t.messages:>9} {t.bytes_per_micro_batch:>14,} B {t.bytes_per_step:>8,} B "
          f"{formula:>8,} B {got:>16,} B")
print(f"\nchapter 02's ring all-reduce of the gradients on {RUN_RANKS} ranks (data parallelism): 2(G − 1)Ψ·4 = "
      f"{all_reduce_bytes(psi, RUN_RANKS):,} B a step, among all ranks; 1F1B moves "
      f"{pipeline_traffic(make_schedule('1f1b', RUN_RANKS, TRAFFIC_M), per_micro_batch).bytes_per_step:,} B, "
      f"between neighbours only (+ {tied:,} B for the tied embedding)")

# %% [markdown]
# **Takeaway:** a pipeline sends only between neighbours, and far less than an all-reduce of every gradient.
#
# That is why, on a cluster, the pipeline's stages are cut across nodes, over the slower links, while tensor
# parallelism's all-reduces stay inside a node.
#
# ## 3. Choose p, m, v and a schedule
#
# The widget redraws the plan at once; no processes run. Its default state, the 1F1B plan above, is also
# drawn as a static image.

# %%
from coursekit.widgets.pipeline import schedule_explorer

schedule_explorer("1f1b", p=PLAN_RANKS, m=PLAN_MICRO_BATCHES, v=2)

# %% [markdown]
# ## 4. Measured: the same schedules on real ranks
#
# Does the real run match the plan? First, is it correct? The course transformer is cut into stages and run
# by the executor on `RUN_RANKS` ranks. For every schedule and micro-batch count, the loss, every gradient and
# every weight must equal one process's after every step, to rounding.

# %% tags=["nbval-check-output"]
PROOF = dict(model="transformer", steps=2, global_batch=GLOBAL_BATCH, optimizer="adam", lr=1e-3)
RUNS, refused = [], []
for name, v in configs:
    for m in RUN_MICRO_BATCHES:
        try:
            make_schedule(name, RUN_RANKS, m, v)
            RUNS.append((name, v, m))
        except ValueError as error:  # a schedule that cannot be built for this m says why
            refused.append(f"{name} v={v} m={m}: refused: {error}")


def prove(rank, world_size, runs):
    return [train(rank, world_size, "pipeline", schedule=name, stages_per_rank=v, micro_batches=m,
                  **PROOF)["records"] for name, v, m in runs]


reference = train(0, 1, "single", **PROOF)["records"]
proofs = coursekit.launch(prove, RUN_RANKS, RUNS, timeout=300)
for k, (name, v, m) in enumerate(RUNS):
    report = compare(reference, [proofs[r][k] for r in range(RUN_RANKS)], check_output=False)
    print(f"{name:<12} v={v} m={m}: {'equal to one process' if report.ok else report}")
print("\n".join(refused))

# %% [markdown]
# Now the speed. On the course transformer every action's fixed cost is as large as its work; the last
# section shows what that does. So the timed runs use layers where computing dominates: an MLP of 8 layers,
# `RACE_WIDTH` wide, on 2 ranks with a core each, at m = 4. Each repeat runs the four schedules back to back,
# so whatever else the machine does slows all four alike.
#
# Below, each schedule's plan sits above its measured step, the repeat with the median time. Each action's real
# start and end are recorded on every rank, on a shared clock. The measured bubble uses the plan's
# definition: the share of the window from the first forward to the last backward in which a rank does not
# compute.

# %% tags=["nbval-ignore-output"]
from coursekit.experiments.pipeline_schedules import format_race, race_steps, schedule_race

TIMELINE_M = 4
race = schedule_race(TIMELINE_M, batch=RACE_BATCH, width=RACE_WIDTH, iterations=RACE_ITERS)
for row in race:
    name, v, spans = row.schedule, row.v, row.spans
    fig = draw_plan_and_measured(plan(make_schedule(name, RUN_RANKS, TIMELINE_M, v)), spans,
                                 title=f"{name}, measured on {RUN_RANKS} ranks")
    plt.show()

# %% [markdown]
# Try another: the controls redraw the plan, and the button runs the chosen schedule on warm ranks and draws
# the measured timeline under it.

# %%
import ipywidgets as widgets
from IPython.display import display

cluster = coursekit.Cluster(RUN_RANKS)
choice = widgets.Dropdown(options=[name for name, _ in configs], value="zb_h1", description="schedule")
micro = widgets.IntSlider(value=TIMELINE_M, min=1, max=8, description="m", continuous_update=False)
run_button = widgets.Button(description=f"run on {RUN_RANKS} ranks", button_style="primary")
run_output = widgets.Output()


def show(measure: bool) -> None:
    """The chosen schedule's plan (instant); with ``measure``, run it on the warm ranks and draw both."""
    name, m = choice.value, micro.value
    v = dict(configs)[name]
    with run_output:
        run_output.clear_output(wait=True)
        try:
            chosen = make_schedule(name, RUN_RANKS, m, v)
        except ValueError as error:
            print(error)
            return
        if measure:
            ran = cluster.run(race_steps, m, RACE_BATCH, RACE_WIDTH, 8, 1, ((name, v),), timeout=120)
            fig = draw_plan_and_measured(plan(chosen), ran[0]["spans"][name][0],
                                         title=f"{name}, m = {m}, measured on {RUN_RANKS} ranks")
        else:
            fig = draw_plan(plan(chosen), title=f"{name}, m = {m}: planned (press the button to run it)")
        display(fig)
        plt.close(fig)


run_button.on_click(lambda _button: show(measure=True))
for control in (choice, micro):
    control.observe(lambda _change: show(measure=False), names="value")
show(measure=False)
display(widgets.VBox([widgets.HBox([choice, micro, run_button]), run_output]))

# %% [markdown]
# Each schedule's bubble and step, over the repeats: the median, then the lowest and the highest. The last
# column is the step's median ratio to 1F1B's in the same repeat.

# %% tags=["nbval-ignore-output"]
print(f"MLP of 8 layers {RACE_WIDTH} wide, {RACE_BATCH} samples a step, {RUN_RANKS} ranks, m = {TIMELINE_M}, "
      f"{RACE_ITERS} repeats: median [lowest, highest]")
print(format_race(race))

# %% [markdown]
# **Takeaway:** on real ranks the bubbles keep the plan's order: GPipe and 1F1B the largest, then
# interleaving, then ZB-H1. Here the steps followed them: 1F1B's took 525 ms, interleaving's 494 and ZB-H1's 473.
#
# A step gains less than its bubble promises. Interleaving pays for its smaller bubble with messages: each
# micro-batch crosses between the ranks three times instead of once, and on 2 CPU cores the waits for them can
# eat what it saves. ZB-H1's W allocates a fresh gradient for each weight, which costs a CPU more than a GPU.
# On GPUs, with fast links and a caching allocator, both costs are small beside the compute.
#
# <details><summary>How this was measured</summary>
#
# `schedule_race` runs, in each repeat, the four schedules back to back, each after a barrier, in an order that
# rotates from repeat to repeat. A step is forward and backward of the whole batch on the slowest rank; no
# optimiser step, the same for all. Interleaving cuts the model in four chunks of two layers, the others in two
# stages of four. The first layer is 1.5 times wider, so that every stage costs the same. At 1,024 wide, a
# chunk's compute is too short beside its messages: interleaving's measured bubble comes out larger than
# 1F1B's.
#
# ZB-H1's B computes only the input gradient and W the weight gradients, dW = dYᵀ·X, from what B kept
# (`coursekit.parallel.pipeline.split_backward`, as `torch.distributed.pipelining` splits it). B and W together
# run exactly one backward's matrix products. W adds each weight's gradient as soon as it is computed, as one
# backward does. Holding them all until the end made the memory allocator fetch fresh pages for each, and W's
# products ran 1.7 times slower.
# </details>

# %% [markdown]
# ## 5. Activation memory, measured
#
# How many micro-batches' activations does each rank really hold? The executor counts, on every rank, the
# (stage, micro-batch) pairs whose saved tensors are alive: from F until the backward that frees them. The black
# ticks are the plan's count, which for GPipe and 1F1B is the papers' formula.

# %%
MEMORY_M = max(RUN_MICRO_BATCHES)


def activations(rank, world_size):
    out = {}
    for name, v in configs:
        result = train(rank, world_size, "pipeline", schedule=name, stages_per_rank=v, micro_batches=MEMORY_M,
                       model="transformer", steps=1, global_batch=GLOBAL_BATCH, record=False)
        out[name] = (result["peak_in_flight"], result["peak_activation_bytes"])
    return out


held = coursekit.launch(activations, RUN_RANKS, timeout=300)
in_flight = {name: plan(make_schedule(name, RUN_RANKS, MEMORY_M, v)).peak_in_flight for name, v in configs}
width = 0.8 / len(configs)
fig, (count_ax, bytes_ax) = plt.subplots(1, 2, figsize=(11, 3.4))
for k, (name, _) in enumerate(configs):
    xs = [r + width * k for r in range(RUN_RANKS)]
    count_ax.bar(xs, [held[r][name][0] for r in range(RUN_RANKS)], width=width * 0.95, label=name)
    bytes_ax.bar(xs, [held[r][name][1] / 2**10 for r in range(RUN_RANKS)], width=width * 0.95, label=name)
    count_ax.scatter(xs, in_flight[name], color="black", marker="_", s=200, zorder=3,
                     label="plan" if k == 0 else None)
for ax, ylabel, title in ((count_ax, "held at the peak (chunks for interleaved)", f"in flight, m = {MEMORY_M}"),
                          (bytes_ax, "KiB saved for backward", "bytes held for backward, the most at any moment")):
    ax.set(xticks=[r + 0.4 - width / 2 for r in range(RUN_RANKS)],
           xticklabels=[f"rank {r}" for r in range(RUN_RANKS)], ylabel=ylabel, title=title)
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% tags=["nbval-check-output"]
for name, v in configs:
    counts = [held[r][name][0] for r in range(RUN_RANKS)]
    formula = ([peak_activations_formula(name, RUN_RANKS, MEMORY_M, r) for r in range(RUN_RANKS)]
               if name in ("gpipe", "1f1b") else "—")
    print(f"{name:<12} held at the peak per rank: {counts}  plan {in_flight[name]}  "
          f"{'equal' if counts == in_flight[name] else 'NOT EQUAL'}   formula {formula}   "
          f"KiB {[round(held[r][name][1] / 2**10) for r in range(RUN_RANKS)]}")

# %% [markdown]
# **Takeaway:** on real ranks each schedule holds exactly the activations its plan says: GPipe all of them,
# 1F1B at most p − r on rank r.
#
# ## 6. More micro-batches, less idle time (P7)
#
# Does cutting the batch finer really shrink the bubble? With *m* micro-batches on *p* stages, a pipeline sits
# idle $(p-1)/(m+p-1)$ of each step. More micro-batches, smaller bubbles.
#
# To see it, computing must cost more than sending: an MLP of 8 layers, `SWEEP_WIDTH` wide, on 2 ranks with a
# core each. The figure shows the step time of 1F1B and GPipe beside two baselines: one process running the
# same micro-batches, and one process on the whole batch.

# %% tags=["nbval-skip"]
# Timed on real ranks: the numbers differ from run to run.
from coursekit.experiments import pipeline_sweep
from coursekit.viz.pipeline_sweep import draw_sweep

sweep = pipeline_sweep(SWEEP_M, batch=SWEEP_BATCH, width=SWEEP_WIDTH, iterations=SWEEP_ITERS)
fig = draw_sweep(sweep)
plt.show()

# %% tags=["nbval-ignore-output", "nbval-skip"]
rows = {row["m"]: row for row in sweep.rows}
print(f"MLP of 8 layers {SWEEP_WIDTH} wide, {SWEEP_BATCH} samples a step, 2 ranks; ms a step (median of "
      f"{SWEEP_ITERS}); speed-up over one process running the same micro-batches: median [lowest, highest]")
print(f"{'m':>3} {'1F1B':>7} {'GPipe':>7} {'1 proc, same m':>15} {'1 proc, whole':>14}   {'1F1B speed-up':<22}"
      f"{'ideal':>6} {'share':>6}   {'bubble':>7} {'formula':>8}")
for m, row in rows.items():
    step, (med, lo, hi) = row["step"], row["speedup_1f1b"]
    print(f"{m:>3} {step['1f1b'] * 1e3:>7.0f} {step['gpipe'] * 1e3:>7.0f} {step['same_work'] * 1e3:>15.0f} "
          f"{step['whole_batch'] * 1e3:>14.0f}   {med:.2f}× [{lo:.2f}, {hi:.2f}]{'':<6}{row['ideal']:>5.2f}× "
          f"{med / row['ideal']:>6.0%}   {row['bubble']:>7.1%} {row['bubble_formula']:>8.1%}")
fastest = min(rows, key=lambda m: rows[m]["step"]["1f1b"])
best = max(rows, key=lambda m: rows[m]["speedup_1f1b"][0])
print(f"\n1F1B's speed-up over the same work: " + " → ".join(
    f"{rows[m]['speedup_1f1b'][0]:.2f}×" for m in rows) + f" (m = {', '.join(map(str, rows))}), the largest at "
      f"m = {best}: {rows[best]['speedup_1f1b'][0] / rows[best]['ideal']:.0%} of its ideal")
print(f"1F1B's fastest step at m = {fastest}; the one-process row grew from "
      f"{rows[min(rows)]['step']['same_work'] * 1e3:.0f} to {rows[max(rows)]['step']['same_work'] * 1e3:.0f} ms "
      f"with m (the cost of smaller micro-batches, pipelining or not)")
ms_ = list(rows)
rises = [f"{m}→{n}" for m, n in zip(ms_, ms_[1:]) if rows[n]["bubble"] >= rows[m]["bubble"]]
print(f"the measured bubble: " + " → ".join(f"{rows[m]['bubble']:.0%}" for m in ms_) +
      (f", falling at every step of m" if not rises else f", not falling at m = {', '.join(rises)}") +
      "; of it, waits for messages already sent: " + ", ".join(f"{rows[m]['in_flight']:.0%}" for m in ms_))
print("two ranks computing at once took " + ", ".join(f"{rows[m]['both_cores'][0]:.2f}×" for m in ms_) +
      " the time of one alone (1.00×: the cores do not slow each other)")

# %% [markdown]
# **Takeaway:** from 1 to 4 micro-batches the bubble shrinks from 52% to 29%, and 1F1B runs 1.35× faster than
# one process doing the same work. Past m = 4 the bubble barely falls here (28%, 27%): the note below says why.
#
# On a CPU, small matrix products cost more per element than one large one. So cutting the batch slows one
# process too: from eight micro-batches on, one process on the whole batch is as fast as every pipelined run
# here, or faster. The fair comparison for the pipeline is one process doing the same work.
#
# <details><summary>How this was measured, and where the bubble stops falling</summary>
#
# `pipeline_sweep` runs, in every iteration and back to back, 1F1B, GPipe, GPipe with each stage recomputed, one
# process with the same micro-batches and one with the whole batch. Speed-ups are per-iteration ratios: median,
# lowest and highest. The bubble is 1F1B's, measured as in section 4. A message's latency stays the same while a
# micro-batch's compute shrinks as 1/*m*, so at large *m* the waits for messages, not the fill and drain, are the
# idle time, and the measured bubble levels off above the formula. Two cores computing at once can also each be
# slower than one alone. The usual rule of thumb, m ≥ 4p, is where the formula's bubble is small.
# </details>
#
# **GPipe's price is memory.** GPipe runs every forward before any backward, so it holds the activations of all
# *m* micro-batches, while 1F1B holds at most *p − r* on rank *r*. GPipe's remedy is recomputation: keep only
# each stage's input and run the forward again in backward, with `torch.utils.checkpoint`. Bytes go down, time
# goes up:

# %% tags=["nbval-ignore-output", "nbval-skip"]
print(f"peak activation bytes per rank (rank 0 / rank 1), KiB; GPipe recomputed's step time beside GPipe's")
print(f"{'m':>3} {'1F1B':>15} {'GPipe':>17} {'GPipe recomputed':>18}   {'GPipe':>7} {'recomputed':>11}")
kib = lambda b: " / ".join(f"{v / 2**10:,.0f}" for v in b)  # noqa: E731
for m, row in rows.items():
    peak = row["peak_activation_bytes"]
    print(f"{m:>3} {kib(peak['1f1b']):>15} {kib(peak['gpipe']):>17} {kib(peak['gpipe_recompute']):>18}   "
          f"{row['step']['gpipe'] * 1e3:>5.0f} ms {row['step']['gpipe_recompute'] * 1e3:>8.0f} ms")

# %% [markdown]
# ## 7. Unequal stages: the slowest sets the pace
#
# What if one stage has more work than the other? In a pipeline the slowest stage sets the pace and grows the
# bubble. If stage 0 costs 1.5 units per micro-batch and stage 1 one, stage 1 waits half a unit for each
# micro-batch. With 1F1B on 2 ranks and m = 4 the plan's bubble grows from 1/5 to 3/13.
#
# Below, an MLP of 10 equal layers is cut 6 | 4, against the cut balanced by measured time, as chapter 03 cuts.
# 1F1B runs with m = 8 on 2 ranks.

# %%
from coursekit.models import TeacherData, tiny_mlp
from coursekit.parallel.pipeline import imbalance, layer_costs, partition, stage_costs, stage_times

LAYERS, WIDE, IMBALANCE_M = 10, 512, 8
equal_layers = lambda: tiny_mlp(n_layers=LAYERS, d_in=WIDE, d_hidden=WIDE, d_out=WIDE, seed=0)  # noqa: E731


def imbalanced(rank, world_size, sizes):
    result = train(rank, world_size, "pipeline", model=equal_layers, data=TeacherData(d_in=WIDE, n_classes=WIDE),
                   schedule="1f1b", micro_batches=IMBALANCE_M, layers_per_stage=sizes, steps=4, global_batch=256,
                   record=False, trace=True)
    last = max(s.start for s in result["spans"] if s.name == "F0@s0")          # the last step only
    return [s for s in result["spans"] if s.start >= last]


def measured_layer_costs(rank, world_size):
    return layer_costs(equal_layers(), "time", sample=torch.randn(256 // IMBALANCE_M, WIDE), repeats=9)


by_time = coursekit.launch(measured_layer_costs, 1)[0]
cuts = {"6 | 4": [6, 4], "balanced by time": partition(by_time, 2)}
print(f"{LAYERS} layers {WIDE} wide, 1F1B on {RUN_RANKS} ranks, m = {IMBALANCE_M}; planned bubble with equal "
      f"stages {float(plan(make_schedule('1f1b', RUN_RANKS, IMBALANCE_M)).bubble_fraction):.1%}")
bubbles = {}
for label, sizes in cuts.items():
    spans = coursekit.launch(imbalanced, RUN_RANKS, sizes, timeout=300)[0]
    times = stage_times(spans)
    costs = [times[s] for s in sorted(times)]
    planned = plan(make_schedule("1f1b", RUN_RANKS, IMBALANCE_M), stage_costs=[c / min(costs) for c in costs])
    by_costs = stage_costs(by_time, sizes)
    bubbles[label] = (float(planned.bubble_fraction), measured_bubble(spans).bubble)
    print(f"{label:<17} layers {sizes}: stage 0 / stage 1 by the layers' costs {by_costs[0] / by_costs[1]:.2f}×, "
          f"measured " + " / ".join(f"{c * 1e3:.2f}" for c in costs) + f" ms a micro-batch "
          f"({costs[0] / costs[1]:.2f}×); bubble planned with those times {bubbles[label][0]:.1%}, "
          f"measured {bubbles[label][1]:.1%}")
(plan_a, meas_a), (plan_b, meas_b) = bubbles.values()
print(f"the uneven cut's bubble: {100 * (plan_a - plan_b):+.1f} points planned and "
      f"{100 * (meas_a - meas_b):+.1f} measured against the balanced cut's")

# %% [markdown]
# **Takeaway:** the uneven cut plans more idle time than the balanced one; the measured bubble, set mostly by
# every action's fixed cost, need not follow.
#
# The measured bubble sits above the plan for both cuts. It moves with the cut only where the imbalance is
# larger than that fixed cost; the last line above says how far it moved. Still, a real model's stages can
# differ far more than these, which is why
# pipeline frameworks let you choose where the stages are cut, as DeepSpeed's
# `PipelineModule(partition_method=...)` does.

# %% [markdown]
# ## 8. The same thing in PyTorch: `torch.distributed.pipelining`
#
# PyTorch's own pipelining runs the *same* stages with its schedules `ScheduleGPipe`, `Schedule1F1B` and
# `ScheduleInterleaved1F1B`. The training loop registers it as the strategy `"torch_pipeline"`. Torch has no
# ZB-H1; the closest are the same paper's ZB1P, `ScheduleInterleavedZeroBubble`, and ZB-V,
# `ScheduleZBVZeroBubble`.
#
# | coursekit | PyTorch |
# |---|---|
# | `split(model, p * v)`, stage *s* on rank *s* mod *p* | `PipelineStage(stage_module, s, p * v, device)` |
# | `make_schedule("gpipe", p, m)` + `execute` | `ScheduleGPipe(stage, m, loss_fn)` |
# | `make_schedule("1f1b", p, m)` | `Schedule1F1B(stage, m, loss_fn)` (refuses m < p) |
# | `make_schedule("interleaved", p, m, v)` | `ScheduleInterleaved1F1B(stages, m, loss_fn)` |
# | `make_schedule("zb_h1", p, m)` | closest: `ScheduleInterleavedZeroBubble` (ZB1P), not run here |
# | `Schedule.actions[rank]` (with sends, receives) | `schedule.pipeline_order_with_comms[rank]` (runtime schedules) |
# | `sum_tied_gradients` (embedding = head) | not done by torch: the same call after its step |

# %% tags=["nbval-check-output"]
TORCH_M = 4


def both(rank, world_size, name, v):
    config = dict(PROOF, micro_batches=TORCH_M, schedule=name, stages_per_rank=v)
    out = {}
    for strategy in ("pipeline", "torch_pipeline"):
        result = train(rank, world_size, strategy, **config)
        timed = train(rank, world_size, strategy, **dict(config, steps=SPEED_STEPS, record=False))
        out[strategy] = (result["records"], sorted(timed["step_times"][1:])[len(timed["step_times"][1:]) // 2])
    return out


times = {}
for name, v in [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)]:
    runs = coursekit.launch(both, RUN_RANKS, name, v, timeout=300)
    for strategy in ("pipeline", "torch_pipeline"):
        report = compare(reference, [runs[r][strategy][0] for r in range(RUN_RANKS)], check_output=False)
        print(f"{name:<12} {strategy:<15} {'equal to one process' if report.ok else report}")
    times[name] = {s: max(runs[r][s][1] for r in range(RUN_RANKS)) for s in ("pipeline", "torch_pipeline")}

# %% tags=["nbval-ignore-output"]
print(f"step time, m = {TORCH_M}, {RUN_RANKS} ranks (median, slowest rank)")
for name, t in times.items():
    print(f"{name:<12} coursekit {t['pipeline'] * 1e3:6.1f} ms   torch {t['torch_pipeline'] * 1e3:6.1f} ms   "
          f"ratio {t['pipeline'] / t['torch_pipeline']:.2f}")

# %% [markdown]
# ## 9. When it does not pay on a laptop
#
# Does pipelining pay for any model? Here is the course transformer, a few thousand parameters a layer, on
# `RUN_RANKS` ranks. Left, the four schedules at m = 4. Right, 1F1B's step as *m* grows, against one process
# running the same micro-batches and, dashed, one process on the whole batch.

# %% tags=["nbval-ignore-output"]
def timeline(rank, world_size, name, v, m=TIMELINE_M):
    result = train(rank, world_size, "pipeline", schedule=name, stages_per_rank=v, micro_batches=m,
                   model="transformer", steps=2, global_batch=GLOBAL_BATCH, trace=True, record=False)
    last = max(s.start for s in result["spans"] if s.name.startswith("F0@s0"))  # the second step only
    return [s for s in result["spans"] if s.start >= last]


def step_times(rank, world_size, ms):
    out = {}
    for m in ms:
        result = train(rank, world_size, "pipeline", schedule="1f1b", micro_batches=m, model="transformer",
                       steps=SPEED_STEPS, global_batch=GLOBAL_BATCH, record=False)
        out[m] = sorted(result["step_times"][1:])[len(result["step_times"][1:]) // 2]
    return out


def one_process(m):
    run = train(0, 1, "single", model="transformer", steps=SPEED_STEPS, global_batch=GLOBAL_BATCH, micro_batches=m,
                record=False)
    return sorted(run["step_times"][1:])[len(run["step_times"][1:]) // 2]


small = {name: measured_bubble(coursekit.launch(timeline, RUN_RANKS, name, v, timeout=300)[0]) for name, v in configs}
same_work = {m: one_process(m) for m in RUN_MICRO_BATCHES}
single = one_process(1)  # the whole batch at once
piped = coursekit.launch(step_times, RUN_RANKS, RUN_MICRO_BATCHES, timeout=300)
slowest = {m: max(piped[r][m] for r in range(RUN_RANKS)) for m in RUN_MICRO_BATCHES}

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4))
names = [name for name, _ in configs]
planned = [float(plan(make_schedule(name, RUN_RANKS, TIMELINE_M, v)).bubble_fraction) for name, v in configs]
left.bar([k - 0.2 for k in range(len(names))], [100 * b for b in planned], width=0.4, color="grey", label="planned")
left.bar([k + 0.2 for k in range(len(names))], [100 * small[n].bubble for n in names], width=0.4, label="measured")
left.set(xticks=range(len(names)), xticklabels=names, ylabel="bubble (%)",
         title=f"course transformer, m = {TIMELINE_M}: the four schedules")
left.legend(fontsize=8)
right.plot(RUN_MICRO_BATCHES, [slowest[m] * 1e3 for m in RUN_MICRO_BATCHES], marker="o", label=f"1F1B on {RUN_RANKS} ranks")
right.plot(RUN_MICRO_BATCHES, [same_work[m] * 1e3 for m in RUN_MICRO_BATCHES], marker="s", color="grey",
           label="one process, the same m micro-batches")
right.axhline(single * 1e3, color="black", linestyle="--", label="one process, the whole batch")
right.set(xlabel="micro-batches m", ylabel="ms per step (median)", xticks=RUN_MICRO_BATCHES,
          title=f"course transformer, global batch {GLOBAL_BATCH}")
right.legend(fontsize=8)
fig.tight_layout()
plt.show()
for (name, v), b in zip(configs, planned):
    print(f"{name:<12} planned {b:5.1%} bubble {small[name].bubble:5.1%} "
          f"step {(small[name].window + small[name].tail) * 1e3:6.1f} ms")
for m in RUN_MICRO_BATCHES:
    print(f"m = {m}: 1F1B {slowest[m] * 1e3:6.1f} ms per step; one process {same_work[m] * 1e3:.1f} ms on the same "
          f"micro-batches, {single * 1e3:.1f} ms on the whole batch")

# %% [markdown]
# For layers this small, each action's fixed cost (Python, autograd's bookkeeping, waking the other process) is
# as large as its work. And the threads that carry the messages share the 2 cores with the ranks computing.
#
# **Takeaway:** for a small model the fixed costs decide, not the bubble: the smallest plan need not run
# fastest, and more micro-batches cost more than the bubble they remove. Pipelining is for models too large
# for one GPU; for a small one, data parallelism is usually best (P10).
#
# On a cluster the proportions change. A stage of a large model computes a micro-batch in tens of milliseconds,
# and sending its activations takes a fraction of that. Then the plan is what you pay.

# %% [markdown]
# **Exercise** `exercises/04_pipeline_schedule.ipynb`: write 1F1B, its messages included, for any p and m from its
# contract. The validator checks it, its bubble and peak activations are compared with the formulas, and it runs
# on real ranks against one process.
