# ci_parameters: {"RUN_MICRO_BATCHES": [1, 4], "SPEED_STEPS": 3}
# %% [markdown]
# # 04 · Pipeline parallelism: micro-batches fill the chain
#
# Chapter 03 cut the model into stages, one per GPU, and found a chain: while one GPU computes, the
# others wait (**P3**). **[Pipeline parallelism](../docs/glossary.md#pipeline-parallelism)** (claim **P7**) keeps the stages but cuts the batch into
# *[micro-batches](../docs/glossary.md#micro-batch)*: while micro-batch 2 goes forward on GPU 2, micro-batch 3 can go forward on GPU 1, and
# gradients of earlier micro-batches flow backward at the same time. [Bubbles](../docs/glossary.md#bubble) (idle time) remain at the start
# and the end of every step; how large they are depends on the **[schedule](../docs/glossary.md#pipeline-schedule)** — the order in which each GPU
# runs its forwards and backwards.
#
# In this chapter a schedule is **data**: for each rank, an ordered list of actions (forward of micro-batch
# *i* on stage *s*, its backward, a send, a receive). Four generators build the classic ones:
#
# * **[GPipe](../docs/glossary.md#gpipe)** (Huang et al. 2019): every forward, then every backward;
# * **[1F1B](../docs/glossary.md#1f1b)** (PipeDream-Flush, Narayanan et al. 2021): after a warm-up, one forward, one backward;
# * **[interleaved 1F1B](../docs/glossary.md#interleaved-1f1b)** (Narayanan et al. 2021): *v* smaller stages per rank, the bubble's idle time shrinks *v*
#   times, its fraction from $(p-1)/(m+p-1)$ to $(p-1)/(v\,m+p-1)$;
# * **[ZB-H1](../docs/glossary.md#zero-bubble)** (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): the backward split into the input
#   gradient **B** and the weight gradient **W**, W deferred into the bubble.
#
# One validator rejects a bad schedule before anything runs (naming the rank, the action and the reason), one
# executor runs any valid one on real ranks, and every schedule is checked against one process at the
# micro-batch counts it is run with.

# %% tags=["parameters"]
# Parameters: small by default so the notebook runs in about a minute; raise them freely.
PLAN_RANKS = 4                 # p of the planned schedules (no processes: any p)
PLAN_MICRO_BATCHES = 8         # m of the planned schedules
RUN_RANKS = 2                  # ranks of the real runs (2 cores here: 2 ranks each get one)
RUN_MICRO_BATCHES = [1, 2, 4, 8]  # m of the real runs
GLOBAL_BATCH = 16              # sequences per step
SPEED_STEPS = 6                # steps per timing (the first is warm-up)

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
from coursekit.verify import compare
from coursekit.viz.pipeline import draw_plan, draw_plan_and_measured

torch.set_num_threads(1)  # one thread per process, as every rank has: the single-process baseline is comparable

# %% [markdown]
# ## 1. A schedule is a list of actions per rank
#
# 1F1B on 2 ranks with 4 micro-batches. `F3@s1` is the forward of micro-batch 3 on stage 1; `SEND_F3@s0`
# sends stage 0's output of micro-batch 3 to the rank that holds stage 1, `RECV_B3@s0` receives the
# gradient of that output back. A send does not block; a receive waits for its matching send.

# %% tags=["nbval-check-output"]
schedule = make_schedule("1f1b", 2, 4)
for rank, actions in enumerate(schedule.actions):
    print(f"rank {rank}: " + " ".join(str(a) for a in actions))

# %% [markdown]
# A learner's schedule that would [deadlock](../docs/glossary.md#deadlock), or compute before its input has arrived, is rejected with a
# sentence instead of a hung rank. Here rank 1's first two actions are swapped: it would run the forward of
# micro-batch 0 before receiving its input.

# %% tags=["nbval-check-output"]
from dataclasses import replace

broken = replace(schedule, actions=[list(a) for a in schedule.actions])
broken.actions[1][0], broken.actions[1][1] = broken.actions[1][1], broken.actions[1][0]
try:
    validate(broken)
except ScheduleError as error:
    print(error)

# %% [markdown]
# ## 2. Planned: the four schedules on a unit-time clock
#
# With every forward, backward input-gradient and weight-gradient taking one unit of time (an unsplit
# backward takes two; for interleaved 1F1B a unit is the forward of one chunk, 1/*v* of a rank's layers), the
# plan below is each schedule executed by the rules of the executor. Empty cells
# are the **bubble**. The planned bubble fraction is compared with the papers' formulas — written
# separately from the plan, and equal to it:
#
# * GPipe and 1F1B: $(p-1)/(m+p-1)$ — the same bubble; 1F1B's gain is memory (see *Activation memory,
#   measured* below);
# * interleaved 1F1B with $v$ stages per rank: $(p-1)/(v\,m+p-1)$;
# * ZB-H1: $(p-1)(T_F+T_B-T_W)$ of idle time next to $m(T_F+T_B+T_W)$ of work.

# %%
configs = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb_h1", 1)]
fig, axes = plt.subplots(len(configs), 1, figsize=(12, 1.2 + 1.1 * PLAN_RANKS * len(configs)))
plans = {}
for ax, (name, v) in zip(axes, configs):
    plans[name] = plan(make_schedule(name, PLAN_RANKS, PLAN_MICRO_BATCHES, v))
    draw_plan(plans[name], ax=ax, legend=ax is axes[0],
              title=f"{name} (v = {v}): bubble {float(plans[name].bubble_fraction):.1%}")
fig.tight_layout()
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
# The last column is what *Activation memory, measured* checks on real ranks: GPipe holds the activations of
# all *m* micro-batches at once before its first backward; 1F1B starts backward as soon as the first
# micro-batch reaches the last stage, so rank *r* holds at most *p − r*. Interleaving pays for its smaller
# bubble with more point-to-point messages (*p·v − 1* stage boundaries to cross instead of *p − 1*) and with
# more activations: its column counts chunks of 1/*v* of a rank's layers, in which 1F1B's *p − r* are
# *v·(p − r)*; interleaving's longer warm-up holds at least that on every rank, more wherever *m > p*, and
# relatively the most on the last rank.
#
# ## 3. Choose p, m, v and a schedule
#
# The widget redraws the plan instantly (no processes). Its default state, as a static image (so the
# chapter reads where widgets do not render), is the 1F1B plan above.

# %%
from coursekit.widgets.pipeline import schedule_explorer

schedule_explorer("1f1b", p=PLAN_RANKS, m=PLAN_MICRO_BATCHES, v=2)

# %% [markdown]
# ## 4. Measured: the same schedules on real ranks, equal to one process
#
# The course transformer (embedding | block | block | final norm + head) cut into stages, run by the
# executor on RUN_RANKS ranks. First the check: for every schedule and every micro-batch count it accepts
# (those it refuses, if any, are printed last, with the reason), the loss, every gradient and every weight after
# every step equal one process's on the same global batch to rounding (within `coursekit.verify`'s
# tolerances) — the tied embedding/head included (its gradient is the sum of its uses on the first and the
# last stage).

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
# Now the timelines: the planned schedule (unit time) above the measured Gantt chart of the same run, at
# m = 4 on RUN_RANKS ranks. Each action's real start and end are recorded on every rank on a shared clock.
#
# The measured bubble has the plan's definition: the share of RUN_RANKS × the window from the first
# forward's start to the last backward's end (on any rank) in which a rank does not compute
# (`coursekit.parallel.pipeline.measured_bubble`). After the schedule's last action (the dashed line) the step
# goes on: every rank waits for its sends, the tied embedding's gradient is summed between the first and the
# last stage, the loss is broadcast, the optimizer steps. That **tail** is not the pipeline's bubble — it does
# not shrink with m and no schedule removes it — so the titles give it apart, as a share of the whole step.

# %%
TIMELINE_M = 4


def timeline(rank, world_size, name, v, m=TIMELINE_M):
    result = train(rank, world_size, "pipeline", schedule=name, stages_per_rank=v, micro_batches=m,
                   model="transformer", steps=2, global_batch=GLOBAL_BATCH, trace=True, record=False)
    last = max(s.start for s in result["spans"] if s.name.startswith("F0@s0"))  # the second step only
    return [s for s in result["spans"] if s.start >= last]


measured = {}
for name, v in configs:
    spans = coursekit.launch(timeline, RUN_RANKS, name, v, timeout=300)[0]
    measured[name] = spans
    fig = draw_plan_and_measured(plan(make_schedule(name, RUN_RANKS, TIMELINE_M, v)), spans,
                                 title=f"{name}, measured on {RUN_RANKS} ranks")
    plt.show()

# %% [markdown]
# Try another: the controls redraw the plan; the button runs the chosen schedule on RUN_RANKS ranks kept
# warm (`coursekit.Cluster`; `cluster.close()` stops them) and draws the measured timeline under the plan.

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
            spans = cluster.run(timeline, name, v, m, timeout=120)[0]
            fig = draw_plan_and_measured(plan(chosen), spans, title=f"{name}, m = {m}, measured on {RUN_RANKS} ranks")
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
# The measured boxes keep the plan's order; their lengths do not keep its unit times. A real backward need
# not take exactly two forwards' time; the stages are balanced by parameter count, not by time, and in the
# interleaved run the chunks that hold only the embedding or only the final norm and head are tiny next to
# those holding a block; and every action carries a fixed cost — Python, autograd bookkeeping, a gloo
# receive that has to wake a process sharing this machine's two cores — which for a model this small can be
# as large as the work itself. So the measured bubble can be far above the planned one and need not keep
# its ranking: the last line below compares them. The table's last column is the tail after the actions:
# work every schedule does once per step, whatever m, so it is not counted in the bubble. ZB-H1's W runs autograd from the stage output again (see
# the `coursekit.parallel.pipeline.executor` docstring), so its measured boxes include compute the plan and the
# other schedules do not have.

# %% tags=["nbval-ignore-output"]
print(f"{'schedule':<12} {'planned':>8} {'measured':>9}   tail after the actions (share of the step)")
planned, bubble = {}, {}
for name, spans in measured.items():
    v = dict(configs)[name]
    planned[name] = float(plan(make_schedule(name, RUN_RANKS, TIMELINE_M, v)).bubble_fraction)
    step = measured_bubble(spans)
    bubble[name] = step.bubble
    print(f"{name:<12} {planned[name]:>8.1%} {bubble[name]:>9.1%}   {step.tail * 1e3:.1f} ms ({step.tail_share:.0%})")


def extreme(values, pick):
    return " and ".join(name for name in values if values[name] == pick(values.values()))


above = [name for name in bubble if bubble[name] > planned[name]]
print(f"\nmeasured above planned: {', '.join(above) or 'none'}; smallest bubble: planned {extreme(planned, min)}, "
      f"measured {extreme(bubble, min)}; largest: planned {extreme(planned, max)}, measured {extreme(bubble, max)}")

# %% [markdown]
# ## 5. Activation memory, measured
#
# The executor counts, on every rank, the micro-batches whose activations it holds (forward done, backward
# not yet) and their bytes, at the peak. GPipe holds all m; 1F1B at most p − r on rank r.

# %%
MEMORY_M = max(RUN_MICRO_BATCHES)


def activations(rank, world_size):
    out = {}
    for name in ("gpipe", "1f1b"):
        result = train(rank, world_size, "pipeline", schedule=name, micro_batches=MEMORY_M, model="transformer",
                       steps=1, global_batch=GLOBAL_BATCH, record=False)
        out[name] = (result["peak_in_flight"], result["peak_activation_bytes"])
    return out


held = coursekit.launch(activations, RUN_RANKS, timeout=300)
fig, (count_ax, bytes_ax) = plt.subplots(1, 2, figsize=(11, 3.2))
for k, name in enumerate(("gpipe", "1f1b")):
    xs = [r + 0.38 * k for r in range(RUN_RANKS)]
    count_ax.bar(xs, [held[r][name][0] for r in range(RUN_RANKS)], width=0.36, label=name)
    bytes_ax.bar(xs, [held[r][name][1] / 2**10 for r in range(RUN_RANKS)], width=0.36, label=name)
    count_ax.scatter(xs, [peak_activations_formula(name, RUN_RANKS, MEMORY_M, r) for r in range(RUN_RANKS)],
                     color="black", marker="_", s=400, zorder=3, label="formula" if k == 0 else None)
count_ax.set(xticks=[r + 0.19 for r in range(RUN_RANKS)], xticklabels=[f"rank {r}" for r in range(RUN_RANKS)],
             ylabel="micro-batches held at the peak", title=f"in flight, m = {MEMORY_M}")
bytes_ax.set(xticks=[r + 0.19 for r in range(RUN_RANKS)], xticklabels=[f"rank {r}" for r in range(RUN_RANKS)],
             ylabel="KiB of saved activations", title="bytes autograd saved, at the peak")
count_ax.legend(fontsize=8)
bytes_ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% tags=["nbval-check-output"]
for name in ("gpipe", "1f1b"):
    counts = [held[r][name][0] for r in range(RUN_RANKS)]
    formula = [peak_activations_formula(name, RUN_RANKS, MEMORY_M, r) for r in range(RUN_RANKS)]
    print(f"{name:<6} micro-batches held at the peak per rank: {counts}  formula {formula}  "
          f"{'equal' if counts == formula else 'NOT EQUAL'}")

# %% [markdown]
# ## 6. When pipelining brings little (P7, P10)
#
# P7 warns that "for small models or slow links the gain may be small". Measured here: the course
# transformer on RUN_RANKS ranks against one process, step time as m grows.

# %%
def step_times(rank, world_size, ms):
    out = {}
    for m in ms:
        result = train(rank, world_size, "pipeline", schedule="1f1b", micro_batches=m, model="transformer",
                       steps=SPEED_STEPS, global_batch=GLOBAL_BATCH, record=False)
        out[m] = sorted(result["step_times"][1:])[len(result["step_times"][1:]) // 2]
    return out


one = train(0, 1, "single", model="transformer", steps=SPEED_STEPS, global_batch=GLOBAL_BATCH, record=False)
single = sorted(one["step_times"][1:])[len(one["step_times"][1:]) // 2]
piped = coursekit.launch(step_times, RUN_RANKS, RUN_MICRO_BATCHES, timeout=300)
slowest = {m: max(piped[r][m] for r in range(RUN_RANKS)) for m in RUN_MICRO_BATCHES}
fig, ax = plt.subplots(figsize=(6.5, 3.2))
ax.plot(RUN_MICRO_BATCHES, [slowest[m] * 1e3 for m in RUN_MICRO_BATCHES], marker="o", label=f"1F1B on {RUN_RANKS} ranks")
ax.axhline(single * 1e3, color="black", linestyle="--", label="one process")
ax.set(xlabel="micro-batches m", ylabel="ms per step (median)", xticks=RUN_MICRO_BATCHES,
       title=f"course transformer, global batch {GLOBAL_BATCH}")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
for m in RUN_MICRO_BATCHES:
    print(f"m = {m}: {slowest[m] * 1e3:6.1f} ms per step, {single / slowest[m]:.2f}x one process")
m_max = max(RUN_MICRO_BATCHES)
compute = single / (m_max * RUN_RANKS)  # one stage's share of one micro-batch, from the one-process step
m_min = min(RUN_MICRO_BATCHES)
added = (slowest[m_max] - slowest[m_min]) / (m_max - m_min)
# the plan's step at m: (m + p - 1) micro-batch slots of single / (p m) each, so its bubble is (p - 1) single / (p m)
removed = (RUN_RANKS - 1) * single / RUN_RANKS * (1 / m_min - 1 / m_max) / (m_max - m_min)
print(f"\none stage's compute per micro-batch at m = {m_max}: about {compute * 1e3:.2f} ms; "
      f"each extra micro-batch changed the step by {added * 1e3:+.2f} ms ({added / compute:+.1f}x that compute), "
      f"where the plan says each removes {removed * 1e3:.2f} ms of bubble on average")

# %% [markdown]
# Read the numbers above as P7 and P10 predict for a *small* model on a *slow* link. Every micro-batch
# adds actions on every stage — a forward, a backward, a send and a receive — each with a fixed cost
# here: Python and autograd bookkeeping, a gloo message through the loopback, and the receiving process
# waking up. The last line above puts what one more micro-batch cost the step next to one stage's compute
# per micro-batch and next to the bubble the plan says it removes: where that fixed cost is not small against
# them, it eats the overlap — and the two ranks also share this machine's two cores with gloo's threads.
# The planned bubble shrinks as m grows; the measured step follows it only as far as that cost allows.
#
# On a real cluster the proportions change: a stage of a large model computes a micro-batch in tens of
# milliseconds, a point-to-point transfer of its activations over NVLink or InfiniBand takes a fraction
# of that, and the bubble formula is what you pay — at p = 4, m = 8 with 1F1B, 3/11 of the time idle,
# against 3/4 with a single micro-batch. That is why pipelining, with many micro-batches, is a tool for
# models too large for one GPU, where P10 recommends model or tensor parallelism (pipelining is model
# parallelism with micro-batches); for a small model that fits one GPU, P10 says data parallelism is usually
# best and pipelining may bring little.

# %% [markdown]
# ## 7. The same thing in production: `torch.distributed.pipelining`
#
# PyTorch's own pipelining runs the *same* stages (coursekit's split, on the same ranks) with its schedules
# `ScheduleGPipe`, `Schedule1F1B` and `ScheduleInterleaved1F1B`. The loop registers it as the strategy
# `"torch_pipeline"`: equal to coursekit's executor and to one process. Torch has no ZB-H1; the closest are
# the same paper's ZB1P (`ScheduleInterleavedZeroBubble`) and ZB-V (`ScheduleZBVZeroBubble`, exactly two
# stages per rank). A torch schedule's `pipeline_order[rank]` lists only compute actions (`None` for an idle
# step); the runtime schedules, `ScheduleInterleaved1F1B` among them, also build
# `pipeline_order_with_comms[rank]`, with the sends and receives.
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
# **Exercise** `exercises/04_pipeline_schedule.ipynb`: write the 1F1B generator. It is graded by the
# validator, by its bubble and its peak activations against the formulas, and by running it on real ranks
# against one process.
