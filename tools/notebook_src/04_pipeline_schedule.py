# %% [markdown]
# BEGIN SOLUTION
# # Solution 04 · Pipeline parallelism: write the 1F1B schedule
# EXERCISE: # # Exercise 04 · Pipeline parallelism: write the 1F1B schedule
# END SOLUTION
#
# In `notebooks/04_pipeline_parallelism.ipynb` micro-batches filled the chain of stages (**P7**): while
# one rank works on micro-batch 2, the next already works on micro-batch 1. *Who does what, and when*
# is the **schedule**, and in this course a schedule is plain data: per rank, an ordered list of
# actions. The executor only carries it out; a validator checks it before anything runs.
#
# You write **`one_f_one_b(p, m)`**: the 1F1B schedule (PipeDream-Flush; Narayanan et al. 2021,
# "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM") for `p` ranks
# (one stage each: rank `r` holds stage `r`) and `m` micro-batches.
#
# **The actions** (`Action(op, stage, micro_batch)`, printed as `F3@s1`): `F` forward, `B` backward,
# `SEND_F`/`RECV_F` the activations going forward to the next rank, `SEND_B`/`RECV_B` the gradients
# coming back. A SEND never blocks; a RECV blocks until its SEND has been issued; messages between two
# ranks match **in order**. You may write the sends and receives yourself, or list only F and B per
# rank and let `add_communication` put them in.
#
# **Grading** (`check_pipeline_schedule`), for p = 1..4 and m = 1..8, m < p included: the validator
# accepts it (the feedback names the rank and the first wrong action); its unit-time plan idles exactly
# (p−1)/(m+p−1) of the time; rank r never holds more than min(p−r, m) micro-batches' activations; and
# run by the course's executor on real ranks, training equals one process.
# Only 1F1B's shape counts: validity, the bubble and the training earn points only where no rank holds
# more than one micro-batch over min(p−r, m), so GPipe's order earns next to nothing. The library's own
# schedules (`gpipe`, `one_f_one_b`, `make_schedule`) refuse while your function is graded; `Action`,
# `Schedule` and `add_communication` are yours to use.
# From a terminal: `make grade NB=exercises/04_pipeline_schedule.ipynb`.

# %% tags=["parameters"]
# Parameters: seconds the execution check may run before it counts as a deadlock (raise it on a slow machine).
CHECK_TIMEOUT = 90.0

# %%
# %matplotlib inline
from coursekit.grading import check_pipeline_schedule
from coursekit.parallel.pipeline import (Action, Schedule, ScheduleError, add_communication, bubble_formula,
                                         gpipe, plan, validate)
from coursekit.viz.pipeline import draw_plan

# %% [markdown]
# ## A schedule you know: GPipe
#
# GPipe (Huang et al. 2019) runs every forward, then every backward. Here it is for 2 ranks and
# 3 micro-batches, communication included, then its plan on a unit-time clock (F = 1, B = 2): the
# white area is the bubble, and "peak" is how many micro-batches' activations a rank holds at once.

# %%
example = gpipe(2, 3)
for rank, actions in enumerate(example.actions):
    print(f"rank {rank}:", " ".join(str(a) for a in actions))
validate(example)                      # raises ScheduleError if anything is wrong
planned = plan(example)
print("bubble", planned.bubble_fraction, "= (p-1)/(m+p-1) =", bubble_formula("gpipe", 2, 3),
      "| peak activations per rank:", planned.peak_activations)
draw_plan(planned);

# %% [markdown]
# GPipe idles (p − 1)/(m + p − 1) of the time, and every rank holds **all m** micro-batches'
# activations until the backwards start. 1F1B does not shrink that bubble — it is the same
# (p − 1)/(m + p − 1) — but it cuts the memory: it starts each backward as early as it can. (Smaller
# bubbles take other schedules: interleaved 1F1B gives each rank v smaller stages, (p − 1)/(v·m + p − 1);
# ZB-H1 splits the backward and fills the bubble with weight gradients — chapter 04 plans and measures
# both.) 1F1B, step by step:
#
# 1. **warm-up**: rank `r` runs `min(p − 1 − r, m)` forwards (micro-batches 0, 1, …);
# 2. **steady state**: then it alternates one forward (the next micro-batch) and one backward (the
#    oldest micro-batch whose backward has not run), until every forward is done;
# 3. **cool-down**: the remaining backwards, oldest first.
#
# The last rank has no warm-up (F0 B0 F1 B1 …); rank 0 of 4 runs three forwards first. So rank `r`
# holds at most `min(p − r, m)` micro-batches. Build the per-rank lists of `Action("F", r, i)` and
# `Action("B", r, i)`, wrap them in `Schedule("1f1b", p, m, 1, actions)` and return
# `add_communication(...)` of it (or write the sends and receives yourself).

# %%
def one_f_one_b(p, m):
    """The 1F1B schedule for p ranks (rank r holds stage r) and m micro-batches."""
# BEGIN SOLUTION
    actions = []
    for r in range(p):
        warmup = min(p - 1 - r, m)                                 # forwards before the first backward
        ops = [Action("F", r, i) for i in range(warmup)]
        for i in range(m - warmup):                                # one forward, one backward
            ops += [Action("F", r, warmup + i), Action("B", r, i)]
        ops += [Action("B", r, i) for i in range(m - warmup, m)]  # cool-down
        actions.append(ops)
    return add_communication(Schedule("1f1b", p, m, 1, actions))
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("per rank: warm-up forwards, then one forward and one backward, then the rest")
# END SOLUTION

# %% [markdown]
# Try it: 4 ranks, 8 micro-batches. The validator names the rank, the action and what to change;
# the plan gives the bubble and each rank's peak.

# %%
try:
    mine = one_f_one_b(4, 8)
    validate(mine)
    planned = plan(mine)
    print(f"bubble {planned.bubble_fraction} (formula {bubble_formula('1f1b', 4, 8)}) | peak activations per "
          f"rank: {planned.peak_activations} (1F1B: at most [4, 3, 2, 1])")
    draw_plan(planned);
except ScheduleError as error:
    print("not a valid schedule:", error)
except NotImplementedError as error:
    print("not done yet:", error)

# %% [markdown]
# ## The grader

# %%
report = check_pipeline_schedule(one_f_one_b, timeout=CHECK_TIMEOUT)
