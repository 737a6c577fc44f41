# ci_parameters: {"STEPS": 4}
# %% [markdown]
# # 10 · The capstone: one trainer, any layout, under `torchrun`
#
# Chapters 02–06 each proved one parallelism equal to one process. Real trainers, such as torchtitan,
# Megatron-LM and picotron, are one script whose layout is a command-line choice. The seed calls these hybrids
# (**P1**); data × tensor is the common choice for large models (**P8**); sequence parallelism combines with the
# others (**P9**). This chapter is that script, `coursekit train`:
#
# 1. one [mesh](../docs/glossary.md#mesh) with four axes, `pp × dp × sp × tp`, built once (§1);
# 2. every layout that cannot run, refused before a rank starts (§2);
# 3. one layout trained live (§3), then eleven layouts whose loss curves match one process's (§4);
# 4. the same script under `torchrun`, on one "node" and on two (§5);
# 5. a checkpoint saved under one layout and resumed under another (§6);
# 6. what each rank holds, against chapter 08's cost model (§7), and the commands for a cluster (§8).
#
# **What composes with what.** Each chapter's parallelism is applied in turn to the course transformer.
# Tensor parallelism makes it Megatron's form on the `tp` axis, as in chapter 05. Sequence parallelism makes every
# attention a ring on the `sp` axis, as in chapter 06. The layers are cut into pipeline stages on the `pp` axis,
# run by chapter 04's executor. After the backward passes, the gradients are all-reduced once over `dp × sp`, the
# ranks that hold a part of the batch, with ZeRO-1 sharding Adam's state over `dp`. ZeRO-2 and -3 run on pure data
# parallelism here, and tensor and sequence parallelism together are refused.

# %% tags=["parameters"]
STEPS = 20     # training steps of every run
BATCH = 16     # sequences per step, over all the data-parallel ranks
EVERY_LAYOUT = True  # False: four of section 4's eleven layouts, the three-axis one among them (quicker)

# %%
# %matplotlib inline
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import coursekit
from coursekit.capstone import Config, check, one_process_losses, run
from coursekit.capstone import checkpoint
from coursekit.comm.mesh import coordinates_of
from coursekit.parallel.hybrid import mesh_shape

torch.set_num_threads(1)
ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
print(f"{STEPS} steps of {BATCH} sequences; torch {torch.__version__}, {os.cpu_count()} CPU cores")

# %% [markdown]
# ## 1. One mesh, four axes
#
# Which ranks talk to which? The ranks are numbered row-major over `pp, dp, sp, tp`, torchtitan's order, so `tp`
# is the innermost axis. Its ranks are neighbours: on a cluster, the GPUs of one node, where the links are
# fastest. Tensor parallelism all-reduces inside every layer; the pipeline sends one activation per
# micro-batch, so it gets the slowest links. Here is where each of 8 ranks sits in `pp = 2 × dp = 2 × tp = 2`:

# %% tags=["nbval-check-output"]
shape = mesh_shape(pp=2, dp=2, tp=2)
print("rank  " + "  ".join(shape))
for rank in range(8):
    print(f"{rank:>4}  " + "  ".join(f"{c:>2}" for c in coordinates_of(rank, shape).values()))

# %% [markdown]
# Ranks 0 and 1 differ only in `tp`: one tensor-parallel group. Ranks 0 and 2 are the two replicas of stage 0's
# shard, a data-parallel group. Ranks 0 and 4 are a pipeline, stage 0 then stage 1. Every part of the trainer
# takes its group from this one mesh by axis name.
#
# ## 2. A layout that cannot run never starts
#
# `check` runs before any rank starts. It names what does not fit, and a change that would, on a job of 4 ranks:

# %% tags=["nbval-check-output"]
for bad in (Config(dp=3, tp=2), Config(tp=2, sp=2), Config(pp=4, layers=1), Config(tp=3),
            Config(pp=2, zero=3), Config(pp=2, microbatches=1, schedule="interleaved", stages_per_rank=2)):
    try:
        check(bad, world_size=4)
    except ValueError as error:
        print(f"{bad.layout:>14}: {error}\n")

# %% [markdown]
# **Takeaway:** each refusal names its own reason, and its "e.g." is a layout `check` accepts.
#
# ## 3. One layout, trained live
#
# `run(rank, world_size, config)` is what every rank executes, under `torchrun` or here. It checks the layout,
# builds the mesh, and hands the composed strategy to chapter 02's training loop:

# %%
coursekit.show(run)

# %% [markdown]
# Started here by `coursekit.launch`, on 4 ranks. Rank 0 prints one line a step, live:

# %% tags=["nbval-skip"]
live = coursekit.launch(run, 4, Config(dp=2, tp=2, steps=STEPS, batch=BATCH))[0]

# %% [markdown]
# Tokens per second say little here: 4 ranks share 2 cores, and this model of 202,368 parameters spends more time
# in every collective than in the compute it splits. Chapter 08 prices the same layouts on a real cluster.
#
# ## 4. Eleven layouts, one curve
#
# Every layout trains the same model, from the same seed, on the same batches, so every curve must match one
# process's, to rounding. The reference is chapter 02's one-process loop, which shares only the model and the
# data with the trainer. The last layout uses three axes at once, pipeline × data × tensor, on 8 ranks:

# %%
one = one_process_losses(Config(steps=STEPS, batch=BATCH))

LAYOUTS = [dict(dp=4), dict(dp=4, zero=1), dict(dp=4, zero=3), dict(dp=2, tp=2), dict(tp=4),
           dict(dp=2, pp=2, microbatches=2), dict(tp=2, pp=2, microbatches=2),
           dict(pp=2, sp=2, microbatches=2), dict(dp=2, sp=2),
           dict(pp=2, microbatches=4, schedule="interleaved", stages_per_rank=2, dp=2),
           dict(pp=2, dp=2, tp=2, microbatches=2)]                  # three axes on 8 ranks
if not EVERY_LAYOUT:
    LAYOUTS = [LAYOUTS[i] for i in (2, 3, 7, 10)]
curves, peaks = {}, {}  # peaks: each layout's peak bytes on every rank, for section 7
for degrees in LAYOUTS:
    c = Config(steps=STEPS, batch=BATCH, quiet=True, **degrees)
    ranks = coursekit.launch(run, c.world_size, c)
    curves[c.layout + (f" {c.schedule}" if c.pp > 1 else "")] = ranks[0]["losses"]
    peaks[c.layout] = [r["peak_memory"] for r in ranks]
worst = {name: max(abs(a - b) / b for a, b in zip(losses, one)) for name, losses in curves.items()}

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
for name, losses in curves.items():
    left.plot(range(1, STEPS + 1), losses, alpha=0.6, lw=1.5, label=name)
left.plot(range(1, STEPS + 1), one, "k:", lw=2, label="one process")
left.set(xlabel="step", ylabel="loss (nats)", title="every layout's loss curve")
left.legend(fontsize=8, ncol=2)
right.barh(list(worst), [max(w, 1e-9) for w in worst.values()], color="tab:blue")
right.axvline(1e-5, color="tab:red", ls="--", label="tolerance (1e-5)")
right.set(xscale="log", xlabel="largest relative difference from one process, over the steps",
          title="how far from one process")
right.legend(fontsize=8)
fig.tight_layout()
plt.show()
print(f"largest relative difference over {len(curves)} layouts and {STEPS} steps: {max(worst.values()):.1e}")

# %% [markdown]
# **Takeaway:** all eleven curves, the three-axis layout among them, match one process's within float32
# rounding.
#
# The layouts add the same numbers in different orders, through a ring all-reduce or a vocabulary split over
# ranks, so they differ in the last digits.
#
# ## 5. Under `torchrun`: one node, then two
#
# On a cluster, `torchrun` starts the same script. Each process reads its rank from the environment: `RANK`,
# `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`. It joins the process group and calls `run`. On one
# machine, `--standalone` does the [rendezvous](../docs/glossary.md#rendezvous):

# %% tags=["nbval-skip"]
log = Path(tempfile.mkdtemp()) / "curve.json"
command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
           "-m", "coursekit.capstone", "--dp", "2", "--tp", "2", "--steps", str(STEPS), "--batch", str(BATCH),
           "--quiet", "--log-json", str(log)]
print("$ torchrun " + " ".join(command[3:]))
done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
assert done.returncode == 0, done.stderr[-2000:]
under_torchrun = json.loads(log.read_text())
print(f"exit status {done.returncode}; its curve against the launch in §3: largest difference "
      f"{max(abs(a - b) for a, b in zip(under_torchrun['losses'], live['losses'])):.1e}")

# %% [markdown]
# Two "nodes" on this machine are two `torchrun` agents that meet at one c10d rendezvous endpoint, each starting
# 2 processes. Node 1 is started first:

# %% tags=["nbval-skip"]
import socket  # noqa: E402

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
agents = {}
for node in (1, 0):
    agents[node] = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
         "--node-rank", str(node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "-m", "coursekit.capstone", "--dp", "2", "--tp", "2", "--steps", str(STEPS), "--batch", str(BATCH),
         "--log-json", str(log)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if node == 1:
        import time  # noqa: E402
        time.sleep(3)
outputs = {node: agent.communicate(timeout=300) for node, agent in agents.items()}
two_nodes = json.loads(log.read_text())
for node in (1, 0):
    says = "prints rank 0's lines" if "coursekit capstone" in outputs[node][0] else "prints nothing (ranks 2, 3)"
    print(f"agent started with --node-rank {node}: exit status {agents[node].returncode}, {says}")
print("each rank's agent, as c10d numbered the agents (GROUP_RANK):", [p["node"] for p in two_nodes["placement"]])
print("tp groups:", two_nodes["tp_groups"])
print(f"its curve against the launch in §3: largest difference "
      f"{max(abs(a - b) for a, b in zip(two_nodes['losses'], live['losses'])):.1e}")

# %% [markdown]
# **Takeaway:** under `torchrun`, on one "node" or two, the curve is the same as the launch in §3.
#
# With the c10d rendezvous, the ranks go to the agents in the order they *join*, not by `--node-rank`: the agent
# started first got ranks 0 and 1. Either way each agent's ranks are consecutive, and `tp` is the innermost axis,
# so each tensor-parallel group lies inside one "node".
#
# ## 6. A checkpoint saved under one layout, resumed under another
#
# `--checkpoint-dir` saves the model and Adam's state with `torch.distributed.checkpoint`,
# [DCP](../docs/glossary.md#distributed-checkpoint). A rank holds plain
# tensors: its stage's parameters, whole or, under tensor parallelism, its share of them. The trainer *describes*
# each as a DTensor: `Shard` along `tp`, `Replicate` along `dp` and `sp`. DCP writes each piece once, with its
# place in the whole tensor. At load, every rank of the *new* layout reads the region it holds. Below: half the
# steps under `dp2 × tp2`, saved; the rest under `pp2 × dp2`, resumed:

# %% tags=["nbval-skip"]
folder = Path(tempfile.mkdtemp())
half = max(STEPS // 2, 1)
saved = Config(dp=2, tp=2, steps=half, batch=BATCH, checkpoint_dir=str(folder), checkpoint_every=half)
first = coursekit.launch(run, 4, saved)[0]
resumed = Config(pp=2, dp=2, microbatches=2, steps=STEPS, batch=BATCH, checkpoint_dir=str(folder), resume=True)
second = coursekit.launch(run, 4, resumed)[0]
stitched = first["losses"] + second["losses"]
print(f"\nsteps 1-{half} under {saved.layout}, {half + 1}-{STEPS} under {resumed.layout}: largest relative difference "
      f"from one process {max(abs(a - b) / b for a, b in zip(stitched, one)):.1e}")

# %% [markdown]
# The stitched curve is one process's. The parameters, Adam's moments and its step counter came back in another
# layout, and the data reads on from the saved step.
#
# Now a job that dies while saving. The save writes `step-NNNNNN.tmp/`, and only when every rank has finished does
# rank 0 rename it, in one atomic step. Here rank 1 is killed in the middle of the last save:

# %% tags=["nbval-skip"]
folder = Path(tempfile.mkdtemp())                # a new job, saving every `half` steps
os.environ[checkpoint.KILL_ENV] = f"1:{STEPS}"  # rank 1 SIGKILLs itself inside the save after the last step
try:
    coursekit.launch(run, 2, Config(dp=2, steps=STEPS, batch=BATCH, quiet=True, checkpoint_dir=str(folder),
                                    checkpoint_every=half), timeout=30)
except (coursekit.RankError, coursekit.LaunchTimeout) as error:
    print(f"the job died: {type(error).__name__}: {str(error).splitlines()[0]}")
finally:
    del os.environ[checkpoint.KILL_ENV]
print("in the folder:", sorted(p.name for p in folder.iterdir()))
again = coursekit.launch(run, 2, Config(dp=2, steps=STEPS, batch=BATCH, checkpoint_dir=str(folder), resume=True,
                                        quiet=False))[0]
print(f"\nresumed at step {again['first_step'] + 1}; steps {again['first_step'] + 1}-{STEPS} against one process: "
      f"largest relative difference {max(abs(a - b) / b for a, b in zip(again['losses'], one[again['first_step']:])):.1e}")

# %% [markdown]
# **Takeaway:** a checkpoint resumes under another layout as if training never stopped, and a torn save is
# skipped.
#
# ## 7. What each rank holds, against the cost model
#
# Chapter 08's cost model never ran anything: it counts bytes from the model's shape and the layout. Here it is
# beside what each layout's largest rank really held at its peak: parameters, gradients and Adam's two moments,
# 4 + 4 + 8 bytes a parameter. One exception to expect: ZeRO-3 gathers one layer at a time, as FSDP does, and
# the cost model counts only the shards it keeps.

# %%
from coursekit.bench.capstone import STATE, modeled_state  # noqa: E402

alone = Config(steps=2, batch=BATCH, quiet=True)
peaks[alone.layout] = [coursekit.launch(run, 1, alone)[0]["peak_memory"]]
rows = []
for degrees in [{}] + [d for d in LAYOUTS if Config(**d).world_size == 4 and "schedule" not in d]:  # from section 4
    c = Config(steps=2, batch=BATCH, quiet=True, **degrees)
    held = max(sum(p.get(k, 0) for k in STATE) for p in peaks[c.layout])  # the largest rank's model state
    rows.append((c.layout, held, modeled_state(c)))
fig, ax = plt.subplots(figsize=(9, 3.6))
x = range(len(rows))
ax.bar([i - 0.2 for i in x], [r[1] / 1e6 for r in rows], 0.4, label="measured peak (largest rank)")
ax.bar([i + 0.2 for i in x], [r[2] / 1e6 for r in rows], 0.4, label="cost model")
ax.set_xticks(list(x), [r[0] for r in rows], rotation=30, ha="right", fontsize=8)
ax.set(ylabel="model state per rank (MB)", title="parameters + gradients + Adam per rank, fp32")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% tags=["nbval-check-output"]
for name, measured, modeled in rows:
    print(f"{name:>12}: measured {measured:>9,} B   cost model {modeled:>9,} B   difference {measured - modeled:>9,} B")

# %% [markdown]
# **Takeaway:** every layout but dp4 zero3 holds the cost model's bytes, give or take Adam's step counters.
#
# Those counters, one per parameter tensor, are the few hundred bytes of difference. ZeRO-3 holds more than its
# shards for a moment: two layers, the embeddings and the norms gathered, and the full gradients of the layers
# being reduced.
# Tensor and pipeline parallelism cut what a rank holds. Data and sequence parallelism alone do not, and ZeRO-1
# cuts Adam's moments.
#
# ## 8. To a cluster
#
# On real machines three things change. The rendezvous endpoint is a host every node can reach. There is one
# process per GPU. And the process group is `cpu:gloo,cuda:nccl`: NCCL for the GPU tensors, gloo for the few CPU
# tensors of the bookkeeping.
#
# On each of N nodes of 8 GPUs, you start one `torchrun`. `--nnodes N` says how many agents to wait for,
# `--nproc-per-node gpu` starts one process per GPU, and every agent meets at `--rdzv-endpoint`, under one job
# name, `--rdzv-id`. The degrees must multiply to N × 8; here tp = 8 fills a node, as §1 wants:
#
# ```bash
# # on each node; HEAD is one node's address
# torchrun --nnodes N --nproc-per-node gpu --rdzv-backend c10d --rdzv-endpoint HEAD:29400 --rdzv-id job42 \
#          -m coursekit.capstone --pp 2 --dp $((N * 8 / 16)) --tp 8 --microbatches 8
# ```
#
# Under Slurm, `srun` starts the agents for you, one task per node. The first node of the allocation serves as the
# endpoint, and the job's id names the rendezvous:
#
# ```bash
# srun --nodes N --ntasks-per-node 1 torchrun --nnodes N --nproc-per-node gpu --rdzv-backend c10d \
#      --rdzv-endpoint "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1):29400" \
#      --rdzv-id "$SLURM_JOB_ID" -m coursekit.capstone --dp $((N * 8 / 8)) --tp 8
# ```
#
# A mixture of experts trains the same way (chapter 07). `--experts 8 --ep 8` spreads each layer's 8 experts over
# 8 ranks of data parallelism: ep borrows from dp, so it adds no GPUs, and each rank still takes its own slice of
# the batch. Beside tensor, pipeline or sequence parallelism the trainer refuses it, and says why:
#
# ```bash
# torchrun --nnodes N --nproc-per-node gpu --rdzv-backend c10d --rdzv-endpoint HEAD:29400 --rdzv-id job43 \
#          -m coursekit.capstone --dp $((N * 8)) --experts 8 --ep 8 --top-k 2 --aux-weight 0.01
# ```
#
# At this model's size every layout is slower than one process: the layouts exist for models that do not fit one
# GPU. On a machine with two or more GPUs, `make gpu-check` trains the layouts over NCCL and compares each with one
# process.
