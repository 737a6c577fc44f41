# ci_parameters: {"STEPS": 5}
# %% [markdown]
# # 09 · Debugging distributed programs: every classic hang and desync, made on purpose
#
# Writing the ring was chapter 01. The hard part in practice is the job that [hangs](../docs/glossary.md#hang) at step 3,000
# without a word. Or it dies with a connection error on a rank that did nothing wrong. Or it trains on with a
# loss that is slightly off. This chapter makes each of those bugs on purpose, in a few lines, and runs it for
# real. For each one you see:
#
# 1. the buggy program, a plain function launched with `coursekit.launch`;
# 2. what plain `torch.distributed` says about it: gloo's own message, or silence until a
#    [timeout](../docs/glossary.md#timeout), set short here so the cell ends. A real job's default is 30 minutes
#    on gloo and 10 minutes on NCCL;
# 3. what coursekit reports;
# 4. how to read that report back to the bug.
#
# The cases:
#
# * §1, a [collective](../docs/glossary.md#collective) that only some ranks call;
# * §2, a rank that dies;
# * §3, tensors of different sizes;
# * §4, collectives in a different order: a [desync](../docs/glossary.md#desync);
# * §5, [point-to-point](../docs/glossary.md#point-to-point) [deadlocks](../docs/glossary.md#deadlock);
# * §6, a pipeline that cannot work;
# * §7, replicas that drift apart without a sound: a [silent divergence](../docs/glossary.md#silent-divergence);
# * §8, a NaN that spreads to every rank;
# * §9, PyTorch's own tools: `TORCH_DISTRIBUTED_DEBUG=DETAIL`, the [monitored barrier](../docs/glossary.md#monitored-barrier)
#   and the [Flight Recorder](../docs/glossary.md#flight-recorder).
#
# **How to read coursekit's two reports.** A launch that cannot return results raises one of two errors:
#
# * `RankError`: a rank raised, or its process died. `.rank` is the rank to blame. After a failure the launcher
#   waits at most 5 s for the other ranks to fail, return or get stuck. Then it names the lowest rank that *died*
#   without a word, else the lowest that raised, so the same bug always reads the same.
# * `LaunchTimeout`: ranks still running at the deadline. For each, it shows what the rank waits on and its
#   innermost Python frames, your line among them. It also lists the ranks that had already returned.

# %% tags=["parameters"]
# Parameters: every hang is cut short by one of these two timeouts (seconds).
TIMEOUT_S = 2.0        # the launcher's timeout, in the cases that hang
GLOO_TIMEOUT_S = 1.0   # plain gloo's own timeout, on a process group of its own (see as_plain_torch)
STEPS = 8              # training steps of the data-parallel cases (§7, §8)
NAN_STEP = 2           # the step at which rank 1 reads a bad sample (§8)

# %%
# %matplotlib inline
import os
import pickle
import time
from datetime import timedelta

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
import torch.nn.functional as F

import coursekit
from coursekit import check_replicas, comm, nonfinite_ranks, tiny_mlp
from coursekit.collectives import ring_all_reduce
from coursekit.models import TeacherData
from coursekit.parallel.pipeline.schedules import Action

torch.set_num_threads(1)


def as_plain_torch(program):
    """``program(rank, world_size, group)`` as a plain torch.distributed job meets its bug.

    Its collectives go to a gloo group that gives up after GLOO_TIMEOUT_S; each rank prints the error it gets
    (what a torchrun log would show) and returns its name.
    """
    def each_rank(rank, world_size):
        group = dist.new_group(timeout=timedelta(seconds=GLOO_TIMEOUT_S))
        try:
            return program(rank, world_size, group)
        except RuntimeError as error:
            print(f"{type(error).__name__}: {error}")
            return f"raised {type(error).__name__}"
    return each_rank


def run(program, world_size=2, **options):
    """Launch ``program`` and print what comes back: the results, or the launcher's report."""
    try:
        print("results:", coursekit.launch(program, world_size, **options))
    except coursekit.LaunchTimeout as error:
        print(f"LaunchTimeout: {error}")
    except coursekit.RankError as error:  # its first line, and the exception at the end of the rank's traceback
        print(f"RankError: {str(error).splitlines()[0]}\n  {exception_of(error.remote_traceback)}")


def exception_of(traceback_text):
    """The exception a traceback ends with: the lines after its last frame (the indented lines)."""
    lines = traceback_text.rstrip().splitlines()
    last_frame = max((i for i, line in enumerate(lines) if line.startswith("  ")), default=-1)
    return "\n  ".join(lines[last_frame + 1:])


def run_plain(program, world_size=2):
    """``program`` as plain torch.distributed runs it (see as_plain_torch), each rank's outcome in rank order."""
    started = time.monotonic()
    run(as_plain_torch(program), world_size, timeout=10 * GLOO_TIMEOUT_S + 10, output="ordered")
    print(f"(after {time.monotonic() - started:.1f} s)")


print("torch", torch.__version__, "| gloo's default timeout:", dist.constants.default_pg_timeout)

# %% [markdown]
# `as_plain_torch` gives the program a process group whose timeout is `GLOO_TIMEOUT_S`, not the default printed
# above, so plain gloo gives up before the launcher does. `run` prints each launch's outcome.
#
# ## 1. A collective that only some ranks call
#
# The classic: a collective inside an `if`. Here only rank 0 all-reduces, like a metric logged "on rank 0 only"
# but computed with an all-reduce.

# %%
def only_rank_0_reduces(rank, world_size, group=None):
    t = torch.ones(4)
    if rank == 0:                      # the bug: rank 1 never calls the all-reduce
        dist.all_reduce(t, group=group)
    return t.tolist()


run_plain(only_rank_0_reduces)

# %% [markdown]
# **Plain gloo**: rank 1 returned its result. Rank 0 waited the whole timeout for a message that never came, then
# raised `Timed out waiting 1000ms for recv operation to complete`. The error names a *recv*, though the program
# never called recv: the all-reduce is built of sends and receives. It does not say which peer, nor why. With the
# default timeout a real job sits there for 30 minutes first, gloo's default printed above. NCCL's default is 10
# minutes (`init_process_group`'s documentation).
#
# **coursekit**, the same program:

# %%
run(only_rank_0_reduces, timeout=TIMEOUT_S)

# %% [markdown]
# **Reading it back**: one rank is still running, rank 0, inside `torch.distributed.all_reduce`, at the line of
# `only_rank_0_reduces` shown in its frames. Rank 1 *had returned*. A collective that some ranks are inside while
# others have moved on is a collective that not every rank calls: look for the `if` around it.
#
# ## 2. A rank that dies while the others wait
#
# A rank's process can end without a Python exception: the out-of-memory killer, a segfault in a data loader, a
# stray `os._exit`. Here rank 1 exits before the all-reduce.

# %%
def rank_1_dies(rank, world_size, group=None):
    t = torch.ones(4)
    if rank == 1:
        os._exit(3)                    # the bug: stands for an OOM kill or a crash in C++
    dist.all_reduce(t, group=group)
    return t.tolist()


run_plain(rank_1_dies)

# %% [markdown]
# **Plain gloo**: the error is on **rank 0**, the innocent one. Its read from rank 1 failed, here with `Connection
# reset by peer`. In a job of 1,000 ranks, every rank that was talking to the dead one prints such a line. They
# point at the ranks that lost a peer, not at the one that died.
#
# **coursekit** reports the rank that died, with its exit code. A death without a word explains its peers'
# errors, not the other way round:

# %%
run(rank_1_dies, timeout=TIMEOUT_S)

# %% [markdown]
# **Reading it back**: "rank 1 exited with code 3 before returning a result". Look at rank 1's own log, whose last
# lines are in `error.output`, and at the machine's: `dmesg` shows the OOM killer. Rank 0's connection error is
# only the echo.
#
# ## 3. Tensors of different sizes in one collective
#
# Every rank must pass a tensor of the same length and dtype to a collective. A rank that builds its gradient
# buffer differently, with an extra parameter or another padding, breaks that.

# %%
def lengths_differ(rank, world_size, group=None):
    t = torch.ones(4 if rank == 0 else 3)   # the bug: rank 1's tensor is one element short
    dist.all_reduce(t, group=group)
    return t.tolist()


run_plain(lengths_differ)

# %% [markdown]
# **Plain gloo**, torch 2.13 on the CPU: no size error at all. Rank 1 *returned* a wrong sum, all 2.0, and rank 0
# waited until its timeout. So a size mismatch in gloo's all-reduce shows up as a hang on one rank and a silently
# wrong tensor on the other.
#
# The same mismatch in a point-to-point message is louder: gloo *aborts* the receiving process. The message below,
# on a red background, is written by gloo's C++ straight to the rank's standard error, and the rank dies of
# `SIGABRT`:

# %%
def receive_too_small(rank, world_size):
    if rank == 0:
        comm.send(torch.ones(4), dst=1)
    else:
        comm.recv(torch.empty(3), src=0)   # the bug: room for 3 elements, 4 are sent
    return rank


run(receive_too_small, timeout=TIMEOUT_S)
try:
    comm.simulate(receive_too_small, 2)
except comm.SimulatorError as error:
    print("simulator:", exception_of(error.remote_traceback))

# %% [markdown]
# `Received data size doesn't match expected size`, with the two sizes in bytes, is gloo's whole explanation. The
# launcher adds which rank died and how. The simulator, running the same function, says it in a sentence before
# any process could die.
#
# **coursekit**'s collectives check lengths before any payload moves: each rank first tells its peers its length
# and dtype.

# %%
run(lambda rank, world_size: ring_all_reduce(torch.ones(4 if rank == 0 else 3)), timeout=TIMEOUT_S)

# %% [markdown]
# **Reading it back**: both lengths, both ranks, before anything was summed. Find where rank 1 builds its tensor.
#
# ## 4. Collectives in a different order on different ranks
#
# Rank 0 all-reduces then broadcasts; rank 1 broadcasts then all-reduces. Think of two branches of an `if` that
# call the same two collectives, each in its own order.

# %%
def order_differs(rank, world_size, group=None):
    t = torch.ones(4)
    if rank == 0:
        dist.all_reduce(t, group=group)
        dist.broadcast(t, src=0, group=group)
    else:                              # the bug: the same two collectives, the other way round
        dist.broadcast(t, src=0, group=group)
        dist.all_reduce(t, group=group)
    return t.tolist()


run_plain(order_differs)

# %% [markdown]
# **Plain gloo**: both ranks time out, each with the same message as in §1. Nothing says the two ranks were in two
# *different* collectives.
#
# **coursekit**:

# %%
run(order_differs, timeout=TIMEOUT_S)

# %% [markdown]
# **Reading it back**: both ranks are stuck, rank 0 inside `all_reduce` and rank 1 inside `broadcast`, each at its
# own line. Two ranks in two different collectives at once: the order differs. §9 shows PyTorch's own check
# catching this at the first mismatched call.
#
# ## 5. Point-to-point deadlocks: the simulator and the real ranks side by side
#
# `coursekit.comm`'s `send` and `recv` run on two transports: real ranks over gloo, and chapter 01's
# single-process simulator. The simulator is as strict as gloo about waiting: a send completes only once its
# receive is posted. So a deadlock is a deadlock in both, and both name each stuck rank's call in the same words.
#
# **A send without its receive:**

# %%
def send_without_receive(rank, world_size):
    t = torch.full((4,), float(rank))
    if rank == 0:
        comm.send(t, dst=1)            # the bug: rank 1 never posts the matching recv
    return t.tolist()


try:
    comm.simulate(send_without_receive, 2)
except comm.Deadlock as deadlock:
    print("simulator:", deadlock)
run(send_without_receive, timeout=TIMEOUT_S)

# %% [markdown]
# The simulator answers at once: "rank 0 waits in send to rank 1, 4 elements". The real ranks answer at the
# timeout, with the same note and the same "rank 1 had returned". A send to a rank that has moved on means the
# receive is missing, or sits on a path rank 1 did not take.
#
# **A receive posted to the wrong peer**, on a ring of 3: each rank sends to its right neighbour, and should
# receive from its left one, but receives from the right too.

# %%
def receive_from_the_wrong_side(rank, world_size):
    right = (rank + 1) % world_size
    out, inbox = torch.full((4,), float(rank)), torch.empty(4)
    sending = comm.isend(out, dst=right)
    comm.recv(inbox, src=right)        # the bug: the message comes from the left, (rank - 1) % world_size
    sending.wait()
    return inbox.tolist()


try:
    comm.simulate(receive_from_the_wrong_side, 3)
except comm.Deadlock as deadlock:
    print("simulator:", deadlock)
run(receive_from_the_wrong_side, 3, timeout=TIMEOUT_S)

# %% [markdown]
# **Reading it back**: every rank waits on a recv from `rank + 1`, the rank it *sends* to. On a ring, messages go
# one way; a rank that receives from the rank it sends to is looking the wrong way. The simulator found it in
# milliseconds, without starting a process. When a real run hangs in point-to-point code, running the same
# function under `comm.simulate` is the quickest way to see who waits on whom.
#
# ## 6. A pipeline that cannot work: refused before anything runs
#
# A [pipeline schedule](../docs/glossary.md#pipeline-schedule) that waits for a message nobody sends hangs like any other deadlock.
# Chapter 04's schedules are data, so they are checked before anything runs. `coursekit.make_schedule` refuses an
# interleaved schedule with fewer micro-batches than ranks, and `coursekit.validate` finds a missing receive.

# %% tags=["nbval-check-output"]
try:
    coursekit.make_schedule("interleaved", 4, 2, v=2)       # p = 4 ranks, m = 2 micro-batches
except ValueError as error:
    print("make_schedule:", error)

schedule = coursekit.make_schedule("1f1b", 2, 2)
schedule.actions[1].remove(Action("RECV_F", 1, 1))          # rank 1 forgets to receive micro-batch 1's input
try:
    coursekit.validate(schedule)
except coursekit.ScheduleError as error:
    print("validate:", error)

# %% [markdown]
# **Reading it back**: the validator names the rank, the action that would wait forever, and what is missing
# before it. `F1@s1` is the forward of micro-batch 1 on stage 1. With GPipe and 1F1B, fewer micro-batches than
# stages is allowed, only slow: chapter 04's bubble.
#
# ## 7. Silent divergence: nothing hangs, the loss is just off
#
# Data parallelism is the same training as one process only while every replica holds the same weights. Claim
# **R2**: before updating, the gradients are communicated "so that all devices agree". Averaging the gradients is
# not enough: the replicas must also *start* equal. Here each rank draws its own initial weights, as with a seed
# from the rank, or a forgotten broadcast of rank 0's weights. [DDP](../docs/glossary.md#ddp) does that broadcast in its
# constructor. The helpers are plain data parallelism, as in chapter 02.

# %%
from coursekit.parallel.data import broadcast_parameters

data = TeacherData()


def average_gradients(model, world_size):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world_size


def my_slice(rank, world_size, x, y):
    return x.chunk(world_size)[rank], y.chunk(world_size)[rank]


def seeded_by_rank(rank, world_size, steps, broadcast):
    model = tiny_mlp(seed=rank)                      # the bug: each rank draws its own initial weights
    if broadcast:                                    # the fix: every rank starts from rank 0's weights,
        broadcast_parameters(model)                  # as DDP's constructor does (chapter 02's library)
    at_start = check_replicas(model)
    optimizer, losses = torch.optim.SGD(model.parameters(), lr=0.2), []
    for step in range(steps):
        x, y = my_slice(rank, world_size, *data.batch(step, 32))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        average_gradients(model, world_size)
        optimizer.step()
        losses.append(loss.item())
    return losses, at_start, check_replicas(model)


def one_process(steps):
    model = tiny_mlp(seed=0)
    optimizer, losses = torch.optim.SGD(model.parameters(), lr=0.2), []
    for step in range(steps):
        x, y = data.batch(step, 32)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


reference = one_process(STEPS)
buggy = coursekit.launch(seeded_by_rank, 2, STEPS, False)
fixed = coursekit.launch(seeded_by_rank, 2, STEPS, True)
for name, runs in (("seeded by rank", buggy), ("broadcast first", fixed)):
    print(f"{name:>15}: at the start {runs[0][1]}\n{'':>15}  after {STEPS} steps {runs[0][2]}")

# %% [markdown]
# Nothing hung and nothing raised: both runs trained. `check_replicas` gathers every rank's copy of each
# parameter. It says the seeded-by-rank replicas differ, first in `layers.0.weight`, and by as much after training
# as at the start. Every rank applies the same averaged update to its own weights, so the difference never
# shrinks. What the loss shows, averaged over the two ranks as a logger would print it, beside one process:

# %%
def global_loss(runs):
    return [sum(run[0][step] for run in runs) / len(runs) for step in range(STEPS)]


fig, ax = plt.subplots(figsize=(7, 3.2))
ax.plot(reference, "k-", lw=3, alpha=0.3, label="one process (the reference)")
ax.plot(global_loss(fixed), "o-", ms=4, label="data parallel, weights broadcast first")
ax.plot(global_loss(buggy), "s--", ms=4, label="data parallel, each rank seeded by its rank")
ax.set_xlabel("step")
ax.set_ylabel("loss (mean over the ranks)")
ax.set_title("silent divergence: both runs train, only one is the reference's training")
ax.legend(fontsize=8)
plt.show()
gap = max(abs(a - b) for a, b in zip(global_loss(fixed), reference))
print(f"broadcast first: largest gap to the reference {gap:.2g}; seeded by rank: "
      f"{max(abs(a - b) for a, b in zip(global_loss(buggy), reference)):.2g}")

# %% [markdown]
# **Reading it back**: a loss curve that falls is no proof; only the comparison says the run is the reference's
# training. A real job has no one-process reference at scale, but the replicas can always be compared with each
# other. `check_replicas(model)` after the first step finds a missing broadcast at once, naming the first
# parameter whose copies differ.
#
# ## 8. A NaN on one rank spreads to every rank
#
# One bad sample, such as a corrupt record, makes one rank's loss NaN, and so its gradients. The all-reduce adds
# them to everyone's, and from the next step on every rank's weights are NaN. Asked afterwards, every rank is
# guilty. `nonfinite_ranks` asks *before* the all-reduce. Each rank says whether its own gradients are finite, in
# one small all-reduce of one number per rank, and every rank gets the same answer.

# %%
def bad_sample_on_rank_1(rank, world_size, steps):
    model, first_bad = tiny_mlp(seed=0), None
    optimizer, losses = torch.optim.SGD(model.parameters(), lr=0.2), []
    for step in range(steps):
        x, y = my_slice(rank, world_size, *data.batch(step, 32))
        if rank == 1 and step == NAN_STEP:
            x[0, 0] = float("nan")                   # the bug: one bad sample in rank 1's slice
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        bad = nonfinite_ranks({name: p.grad for name, p in model.named_parameters()})  # before the all-reduce
        if bad and first_bad is None:
            first_bad = (step, bad)
        average_gradients(model, world_size)
        optimizer.step()
        losses.append(loss.item())
    return losses, first_bad


nan_runs = coursekit.launch(bad_sample_on_rank_1, 2, STEPS)
for rank, (losses, first_bad) in enumerate(nan_runs):
    print(f"rank {rank}: losses {[round(x, 3) for x in losses]}\n        first non-finite gradients: step, "
          f"{{rank: tensor}} = {first_bad}")

# %%
fig, ax = plt.subplots(figsize=(7, 1.8))
nan = torch.tensor([[float(torch.isnan(torch.tensor(x))) for x in losses] for losses, _ in nan_runs])
ax.imshow(nan, cmap="Reds", vmin=0, vmax=1.5, aspect="auto")
ax.set_yticks(range(len(nan_runs)), [f"rank {r}" for r in range(len(nan_runs))])
ax.set_xticks(range(STEPS))
ax.set_xlabel("step")
ax.set_title("local loss NaN (red): rank 1 first, then every rank")
plt.show()

# %% [markdown]
# **Reading it back**: the losses show the spread. Rank 1 is NaN at step `NAN_STEP`, rank 0 one step later, after
# the all-reduce. But the later steps cannot tell who started it. The check before the all-reduce names the step
# and the rank, with its first non-finite gradient: look at rank 1's batch of that step. In a real job, put the
# check before the update. Every rank gets the same answer, so they all stop at the same step, and none is left
# waiting in a collective.
#
# ## 9. The same bugs with PyTorch's own tools
#
# Three tools come with `torch.distributed`; all three run with gloo on the CPU.
#
# **`TORCH_DISTRIBUTED_DEBUG=DETAIL`** wraps every process group. Before each collective, the ranks compare what
# they are about to call: op, sizes, dtypes. It must be set in every rank *before* `init_process_group`, and torch
# reads it when `torch.distributed` is imported. So setting it in a notebook that already imported torch does
# nothing. `coursekit.launch(..., env={...})` sets variables in every rank before the process group exists. §4's
# program:

# %%
run(order_differs, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, timeout=TIMEOUT_S)

# %% [markdown]
# The first mismatched call raises on the spot instead of hanging: rank 0 runs `OpType=ALLREDUCE` while rank 1 runs
# `OpType=BROADCAST`, both as collective number 0. The price is an extra exchange before every collective, so
# DETAIL is for debugging runs.
#
# **`dist.monitored_barrier(timeout=...)`**, gloo only, is a barrier where rank 0 waits for each other rank in turn
# and says which one did not arrive. Here rank 1 is stuck elsewhere; a sleep stands for a deadlock or a slow disk:

# %%
def rank_1_never_arrives(rank, world_size):
    if rank == 1:
        time.sleep(60)                 # the bug: rank 1 is somewhere else
    dist.monitored_barrier(timeout=timedelta(seconds=GLOO_TIMEOUT_S))
    return rank


run(rank_1_never_arrives, timeout=10 * TIMEOUT_S)

# %% [markdown]
# Rank 0 raises "Rank 1 failed to pass monitoredBarrier in 1000 ms" after `GLOO_TIMEOUT_S`. The line on a red
# background is gloo's log of the same, from C++. The launcher then finds rank 1 idle, reports rank 0's error and
# stops both. A `monitored_barrier` every N steps cheaply turns "the job hangs" into "rank 1 is late".
#
# **The Flight Recorder** keeps, in every rank, a ring buffer of the last collectives it enqueued: op, sizes,
# sequence number, Python frames. It is dumped when a job hangs and compared across ranks. PyTorch's tutorial
# describes it for NCCL. On this build, torch 2.13 on the CPU, it records for gloo too, with no setting, and
# `torch._C._distributed_c10d._dump_fr_trace()` returns it as pickled bytes. Below, §1's bug with one matched
# all-reduce before it, and a timeout per call so that rank 0 can dump its buffer after waiting:

# %%
def flight_recorded(rank, world_size):
    t = torch.ones(4)
    dist.all_reduce(t)                                # collective 1: every rank
    if rank == 0:                                     # collective 2: the bug of §1, rank 0 only
        try:
            dist.all_reduce(t, async_op=True).wait(timedelta(seconds=GLOO_TIMEOUT_S))
        except RuntimeError as error:
            print(f"RuntimeError: {error}")
    return torch._C._distributed_c10d._dump_fr_trace()


print("TORCH_FR_BUFFER_SIZE:", os.environ.get("TORCH_FR_BUFFER_SIZE"))
dumps = coursekit.launch(flight_recorded, 2, timeout=10 * TIMEOUT_S)
for rank, dump in enumerate(dumps):
    trace = pickle.loads(dump)
    print(f"rank {rank}: version {trace['version']}, last enqueued collective "
          f"{trace['pg_status']['0']['last_enqueued_collective']}, pg_config {trace['pg_config']}")
    for entry in trace["entries"]:
        line = next(f for f in entry["frames"] if f["name"] == "flight_recorded")["line"]
        print(f"   #{entry['collective_seq_id']} {entry['profiling_name']} {entry['input_sizes']} at line {line} "
              f"of the cell; process_group {entry['process_group']}, state {entry['state']!r}, "
              f"started {entry['time_discovered_started_ns']}, completed {entry['time_discovered_completed_ns']}")

# %% [markdown]
# Read across the ranks: rank 0 enqueued collective #2, an all-reduce of 4 elements at the line inside the `if`.
# Rank 1's last is #1. The first sequence number one rank has and another lacks is the collective that not every
# rank called: the same answer as §1's report.
#
# ## What to remember
#
# | symptom | what coursekit says | the bug |
# |---|---|---|
# | hang; one rank inside a collective, others returned | `LaunchTimeout`: ranks still running, "ranks [...] had returned" | a collective not every rank calls (§1) |
# | "Connection reset by peer" on a healthy rank | `RankError` on the rank that died, with its exit code | a crash, an OOM kill (§2) |
# | hang on one rank, a wrong result on another; or a `SIGABRT` | the length check: both lengths, both ranks; the simulator's sentence | tensors of different sizes (§3) |
# | hang; ranks inside different collectives | `LaunchTimeout`: each rank's call at its line; DETAIL: both fingerprints | collectives in a different order (§4) |
# | hang in send/recv | the simulator's deadlock and the real ranks' notes: who waits in which call, on whom | a missing or misdirected message (§5) |
# | a pipeline that would hang | `make_schedule`/`validate` refuse it before it runs | too few micro-batches, a missing receive (§6) |
# | no error, the loss is off | `check_replicas`: the first parameter whose copies differ | replicas that did not start equal (§7) |
# | NaN everywhere | `nonfinite_ranks` before the all-reduce: the first rank and step | one rank's bad data (§8) |
#
# **Exercise** `exercises/09_find_the_bug.ipynb`: three broken programs; name each bug from its report, then fix it.
