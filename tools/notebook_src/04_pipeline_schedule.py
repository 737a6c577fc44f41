# %% [markdown]
# BEGIN SOLUTION
# # Solution 04 · Pipeline parallelism: write the 1F1B schedule
# EXERCISE: # # Exercise 04 · Pipeline parallelism: write the 1F1B schedule
# END SOLUTION
#
# In `notebooks/04_pipeline_parallelism.ipynb` micro-batches filled the chain of stages (**P7**), and a
# schedule was plain data: per rank, an ordered list of actions, checked by a validator and carried out by an
# executor. Here you write one such schedule, **1F1B** (PipeDream-Flush; Narayanan et al. 2021, "Efficient
# Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"), for any number of ranks and of
# micro-batches. How the ranks get there is yours to work out: below is what it must do, not how.
#
# ## The contract
#
# **Inputs.** `p >= 1` ranks, rank `r` holding stage `r` (one stage each); `m >= 1` micro-batches, numbered from
# 0. Any `m`: fewer than `p`, or not a multiple of `p`.
#
# **Output.** A `Schedule` named `"1f1b"` for `p` ranks, `m` micro-batches and one stage per rank, whose
# `actions[r]` is everything rank `r` does in one training step, in order: every computation *and* every message.
# A `Schedule`'s fields, in order: `name, n_ranks, n_micro_batches, stages_per_rank, actions`.
#
# **The primitives.** `Action(op, stage, micro_batch)`, printed as `F3@s1`, with six ops. `F` and `B` are the
# forward and the backward of one micro-batch on one stage. `SEND_F` hands a stage's output to the next rank and
# `RECV_F` takes it there; `SEND_B` hands the gradient of a stage's input back to the previous rank and
# `RECV_B` takes it there. A send never blocks. A receive blocks until its send was issued. Between two ranks,
# messages match in the order they were sent. To try a schedule: `validate(s)` raises a `ScheduleError` naming
# the rank and the first wrong action; `plan(s)` runs it on a unit-time clock (F = 1, B = 2), with its
# `bubble_fraction` and each rank's `peak_activations`; `draw_plan` draws that plan. The library's generators
# (`gpipe` below among them) and `add_communication` refuse while your function is graded: you place the
# messages too.
#
# **The properties**, each graded for p = 1..4 and m = 1..8:
#
# 1. *valid*: `validate` accepts it: no stage computes before its input or its gradient has arrived, every
#    forward comes before its backward, and no rank waits on a message that is never sent;
# 2. *memory*: rank `r` never holds the activations of more than `min(p − r, m)` micro-batches at once (those
#    whose forward ran there and whose backward has not);
# 3. *bubble*: on the unit-time clock the ranks idle exactly (p − 1)/(m + p − 1) of the step, GPipe's bubble, no
#    more;
# 4. *training*: run by the course's executor on real ranks (p = 2, m = 4 and p = 3, m = 5), one step trains the
#    MLP exactly as one process does.
#
# The grader judges (1) and (4) as the answer, and (2) and (3) as its properties: they score only while the
# answer is right. A schedule far over the memory bound is another schedule, not 1F1B, and earns nothing.
# The feedback names the rank, the case and what to change.
# From a terminal: `make grade NB=exercises/04_pipeline_schedule.ipynb`.

# %% tags=["parameters"]
# Parameters: seconds the execution check may run before it counts as a deadlock (raise it on a slow machine).
CHECK_TIMEOUT = 90.0

# %%
# %matplotlib inline
from coursekit.grading import check_pipeline_schedule
from coursekit.parallel.pipeline import Action, Schedule, ScheduleError, bubble_formula, gpipe, plan, validate
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
# GPipe idles (p − 1)/(m + p − 1) of the time, and every rank holds **all m** micro-batches' activations until
# its backwards start. 1F1B keeps that bubble and holds far fewer: that is property 2. (Smaller bubbles take
# other schedules, interleaved 1F1B and ZB-H1: chapter 04 plans and measures both.)
#
# ## Your schedule
#
# Write `one_f_one_b(p, m)` in the cell below, from the contract. Print `plan(...)`'s numbers for a few sizes
# before you grade: p = 4 with m = 2, 3 and 8 tell most mistakes apart.

# %%
# BEGIN SOLUTION
def one_f_one_b(p, m):
    """1F1B for p ranks (rank r holds stage r) and m micro-batches, its messages placed by hand."""
    def forward(r, i):                  # the input arrives, the stage runs, its output leaves
        before = [Action("RECV_F", r, i)] if r > 0 else []
        after = [Action("SEND_F", r, i)] if r < p - 1 else []
        return before + [Action("F", r, i)] + after

    def backward(r, i):                 # the output's gradient arrives, the stage runs, the input's leaves
        before = [Action("RECV_B", r, i)] if r < p - 1 else []
        after = [Action("SEND_B", r, i)] if r > 0 else []
        return before + [Action("B", r, i)] + after

    actions = []
    for r in range(p):
        most, ops = min(p - r, m), []   # rank r may hold at most this many micro-batches
        started = done = 0              # forwards and backwards run so far: started - done are held
        while done < m:
            if started < m and started - done < most:
                ops += forward(r, started)
                started += 1
            else:                       # full, or no forward left: free the oldest micro-batch
                ops += backward(r, done)
                done += 1
        actions.append(ops)
    return Schedule("1f1b", p, m, 1, actions)
# EXERCISE: # YOUR CODE HERE: one_f_one_b(p, m), returning the Schedule the contract above describes.
# EXERCISE: one_f_one_b = None
# END SOLUTION

# %% [markdown]
# Try it: 4 ranks, 8 micro-batches. The validator names the rank, the action and what to change;
# the plan gives the bubble and each rank's peak.

# %%
if one_f_one_b is None:
    print("not done yet: write one_f_one_b in the cell above")
else:
    try:
        mine = one_f_one_b(4, 8)
        validate(mine)
        planned = plan(mine)
        print(f"bubble {planned.bubble_fraction} (formula {bubble_formula('1f1b', 4, 8)}) | peak activations per "
              f"rank: {planned.peak_activations} (1F1B: at most [4, 3, 2, 1])")
        draw_plan(planned);
    except ScheduleError as error:
        print("not a valid schedule:", error)

# %% [markdown]
# ## The grader

# %%
report = check_pipeline_schedule(one_f_one_b, timeout=CHECK_TIMEOUT)
