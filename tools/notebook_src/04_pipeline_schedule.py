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
from coursekit.parallel.pipeline import (Action, Schedule, ScheduleError, bubble_formula, gpipe,
                                        peak_activations_formula, plan, validate)
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
# ## Optional stretch: interleaved 1F1B (a bonus)
#
# Megatron-LM shrinks the bubble further by giving each rank several thin stages instead of one thick one
# (Narayanan et al. 2021, section 2.2.2). This part is optional: its points add to your score, never to the
# maximum, and left as it is it costs nothing.
#
# **Inputs.** `p >= 1` ranks and `v = 2` stages per rank: rank `r` holds stages `r` and `r + p` (the pipeline has
# `v·p` stages, and every micro-batch passes every rank twice); `m` micro-batches, `m = p` or `m = 2p`.
#
# **Output.** `interleaved_one_f_one_b(p, m, v=2)` returns a `Schedule` named `"interleaved"` for `p` ranks, `m`
# micro-batches and `v` stages per rank, messages included. A message between two stages on one rank is not a
# message: the next stage reads it directly. Between two ranks, receives must come in the order the sender sends,
# whatever their kind: with two ranks, forwards and gradients travel between the same pair.
#
# **The properties**, graded for p = 1..4, m = p and 2p:
#
# 1. *valid*: `validate` accepts it, and run by the course's executor (p = 2, m = 4, a four-layer MLP) one step
#    trains exactly as one process does;
# 2. *bubble*: on the unit-time clock the ranks idle exactly (p − 1)/(v·m + p − 1) of the step: the pipe fills v
#    times faster than 1F1B's. `bubble_formula("interleaved", p, m, 2)` gives the target, `plan(s)` your value;
# 3. *memory*: rank `r` never holds more than min((v − 1)·p + 2(p − 1 − r) + 1, v·m) (stage, micro-batch) pairs
#    between their forward and their backward (`peak_activations_formula("interleaved", p, m, r, 2)`): as
#    with one stage per rank, sending every forward first has the same bubble and holds far more.
#
# A hint, no more: Megatron-LM sends p micro-batches through one of a rank's stages, then the same p through
# its next stage, and so on, backwards in the opposite order of stages.
# As in the exercise, (1) is the answer, (2) and (3) its properties.

# %%
# BEGIN SOLUTION
def interleaved_one_f_one_b(p, m, v=2):
    """Interleaved 1F1B: rank r holds stages r, r+p, ..., r+(v-1)p; m a multiple of p, messages placed by hand."""
    n = v * p                                # stages in all

    def chunk_and_batch(r, k, back):        # rank r's k-th forward (or backward): its stage and micro-batch
        chunk = (k // p) % v                 # p micro-batches through one chunk, then the next chunk
        stage = ((v - 1 - chunk) if back else chunk) * p + r
        return stage, (k // (p * v)) * p + k % p

    def computations(r):                     # rank r's F and B, each followed by the message it sends
        total = v * m
        warm = min((v - 1) * p + 2 * (p - 1 - r), total)
        order = [("F", k) for k in range(warm)]
        for j in range(total - warm):
            order += [("F", warm + j), ("B", j)]
        order += [("B", j) for j in range(total - warm, total)]
        ops = []
        for op, k in order:
            stage, i = chunk_and_batch(r, k, op == "B")
            ops.append(Action(op, stage, i))
            peer = stage + 1 if op == "F" else stage - 1
            if 0 <= peer < n and peer % p != r:
                ops.append(Action("SEND_" + op, stage, i))
        return ops

    def source(a):                           # the rank a receive on this compute comes from, or None
        peer = a.stage - 1 if a.op == "F" else a.stage + 1
        return None if not 0 <= peer < n or peer % p == a.stage % p else peer % p

    plans = [computations(r) for r in range(p)]
    inbox = {}                               # (sender, receiver) -> receives, in the order the sender sends
    for sender, ops in enumerate(plans):
        for a in ops:
            if a.op.startswith("SEND"):
                peer = a.stage + 1 if a.op == "SEND_F" else a.stage - 1
                inbox.setdefault((sender, peer % p), []).append(Action("RECV" + a.op[4:], peer, a.micro_batch))
    actions = []
    for r, ops in enumerate(plans):
        out, received = [], set()
        for a in ops:
            sender = source(a) if a.op in ("F", "B") else None
            wanted = Action("RECV_" + a.op, a.stage, a.micro_batch)
            while sender is not None and wanted not in received:
                got = inbox[(sender, r)].pop(0)   # earlier messages from that rank first: they were sent first
                out.append(got)
                received.add(got)
            out.append(a)
        actions.append(out)
    return Schedule("interleaved", p, m, v, actions)
# EXERCISE: # OPTIONAL: interleaved_one_f_one_b(p, m, v=2), returning the Schedule the stretch's contract describes.
# EXERCISE: interleaved_one_f_one_b = None
# END SOLUTION

# %%
bound = [peak_activations_formula("interleaved", 4, 8, r, 2) for r in range(4)]
print("interleaved 1F1B, p = 4, m = 8: bubble", bubble_formula("interleaved", 4, 8, 2), "| peak per rank at most", bound)
if interleaved_one_f_one_b is not None:   # optional: None while you leave the stretch aside
    try:
        stretch = interleaved_one_f_one_b(4, 8)
        validate(stretch)
        print("yours: bubble", plan(stretch).bubble_fraction, "| peak per rank", plan(stretch).peak_activations)
    except ScheduleError as error:
        print("not a valid schedule:", error)

# %% [markdown]
# ## The grader

# %%
report = check_pipeline_schedule(one_f_one_b, interleaved_one_f_one_b, timeout=CHECK_TIMEOUT)
