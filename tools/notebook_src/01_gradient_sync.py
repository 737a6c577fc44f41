# ci_parameters: {"SIZES_KIB": [4, 64, 1024], "REPEATS": 5, "LOAD_WORLD_SIZES": [2, 3, 4]}
# %% [markdown]
# # 01 · How GPUs share what they learn: naive, single master, ring all-reduce
#
# > **The interview question (R1).** *"We must train an LLM on 1,000 GPUs. How do all the GPUs share what
# > they learn?"*
# >
# > Answering *"a central parameter server collects everyone's gradients, averages them and sends the
# > new weights back"* ends the interview.
#
# This chapter finds out why, with real ranks: three ways to sum gradients across GPUs, each one
# **run**, **counted** (every element that crosses a link), **timed**, and for the ring, **stepped
# through** one transfer at a time. At the end we answer the interview with numbers.
#
# Everything here runs on real `torch.distributed` ranks (processes talking through gloo on the CPU, or
# NCCL on GPUs). The three algorithms live in `coursekit/collectives.py`, built only from point-to-point
# `send`/`recv` (`coursekit/comm.py`, which also counts every transfer): read them next to this notebook.

# %% tags=["parameters"]
# Parameters: small so the notebook runs in well under a minute; raise them to see more.
WORLD_SIZE = 4                      # ranks for the real runs
SIZES_KIB = [4, 64, 1024, 4096]     # message sizes to time (learners: try up to 65536 = 64 MiB)
REPEATS = 10                        # timed iterations per point (the median is reported)
LOAD_WORLD_SIZES = [2, 3, 4]        # world sizes for "the master does not scale" (try up to 8)
MODEL_PARAMS = 7e9                  # the interview: a 7-billion-parameter model ...
GPUS = 1000                         # ... on 1,000 GPUs

# %%
# %matplotlib inline
import matplotlib.pyplot as plt
import torch
import torch.distributed as dist

import coursekit
from coursekit import comm
from coursekit.bench.allreduce import algbw, busbw, fit_alpha_beta, measure
from coursekit.collectives import (master_all_reduce, naive_all_reduce, owned_segment, replay, ring_all_reduce,
                                   ring_traffic, segment_bounds)
from coursekit.viz.collectives import plot_rank_load, plot_timings, plot_traffic
from coursekit.widgets.ring import ring_explorer

ALGORITHMS = {"naive": naive_all_reduce, "master": master_all_reduce, "ring": ring_all_reduce}

# %% [markdown]
# ## Why gradients must be synchronised (R2)
#
# In data parallelism every GPU holds the **same model** but sees **different data**, so each computes
# different gradients. If each applied its own, the copies would drift apart after one step. So before
# the update, the GPUs *all-reduce* their gradients: every GPU ends with the sum (here: the mean) of all
# of them. A major runtime bottleneck of multi-GPU training is exactly this synchronisation (R2).
#
# Two real ranks, one tiny linear model, four samples each:

# %% tags=["nbval-check-output"]
def two_gpus(rank, world_size):
    torch.manual_seed(0)                                   # the same initial model on every rank
    model = torch.nn.Linear(3, 1)
    data = torch.Generator().manual_seed(100 + rank)       # but different data
    x = torch.randn(4, 3, generator=data)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    loss.backward()
    before = model.weight.grad.clone()
    ring_all_reduce(model.weight.grad)                     # sum over ranks, in place ...
    model.weight.grad /= world_size                        # ... then the mean
    return before, model.weight.grad


def one_gpu_all_data():
    """The reference: one process, both ranks' samples in one batch."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x = torch.cat([torch.randn(4, 3, generator=torch.Generator().manual_seed(100 + r)) for r in range(2)])
    torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    return model.weight.grad


results = coursekit.launch(two_gpus, 2)
for rank, (before, after) in enumerate(results):
    print(f"rank {rank}: gradient before {[round(v, 4) for v in before.flatten().tolist()]}"
          f"  after {[round(v, 4) for v in after.flatten().tolist()]}")
print("after: identical on both ranks:", torch.equal(results[0][1], results[1][1]))
print("after: equal to one GPU on all 8 samples:", torch.allclose(results[0][1], one_gpu_all_data(), atol=1e-6))

# %% [markdown]
# Before: two different gradients. After: the same numbers on both ranks, and they equal the gradient
# one GPU would compute on all eight samples. That is the whole point of the all-reduce.
#
# ## Three ways to all-reduce, run for real
#
# With `G` GPUs, each holding `N` gradient elements:
#
# | algorithm | how | elements moved | busiest GPU sends + receives |
# |---|---|---|---|
# | **naive** (R3) | every GPU sends its whole tensor to every other GPU | `G·(G−1)·N` | `2·(G−1)·N` |
# | **single master** (R4) | all send to one GPU, it sums and sends the result back | `2·(G−1)·N` | `2·(G−1)·N`, the master |
# | **ring** (R5, R6) | segments travel round a ring: reduce-scatter, then all-gather | `2·(G−1)·N` | `≈ 4·(G−1)·N/G` |
#
# Each runs below on real ranks against `torch.distributed.all_reduce`, with every transfer recorded by
# `comm.record()`. `N = 1001` on purpose: it does not divide by 4 (the ring's segments are 251, 250, 250, 250).

# %% tags=["nbval-check-output"]
N = 1001


def run_all_three(rank, world_size, numel):
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    reference = x.clone()
    dist.all_reduce(reference)
    out = {}
    for name, fn in ALGORITHMS.items():
        mine = x.clone()
        with comm.record() as traffic:
            fn(mine)
        out[name] = (mine, traffic, (mine - reference).abs().max().item())
    return out


results = coursekit.launch(run_all_three, WORLD_SIZE, N)
G = WORLD_SIZE
formula = {"naive": G * (G - 1) * N, "master": 2 * (G - 1) * N, "ring": 2 * (G - 1) * N}
print(f"G = {G}, N = {N}")
print(f"{'algorithm':<9} {'same bits on all ranks':>22} {'max |diff| vs torch':>20} {'elements moved':>15} "
      f"{'formula':>8} {'busiest rank':>13}")
traffic_real = {}
for name in ALGORITHMS:
    traffic = traffic_real[name] = comm.Traffic.merge([r[name][1] for r in results])
    same = all(torch.equal(r[name][0], results[0][name][0]) for r in results)
    diff = max(r[name][2] for r in results)
    print(f"{name:<9} {str(same):>22} {diff < 1e-5 and '< 1e-5' or diff:>20} {traffic.total:>15} "
          f"{formula[name]:>8} {traffic.busiest_rank:>13}")

# %% [markdown]
# All three give the right sum, bit for bit the same on every rank (each sum is formed in one fixed
# order; adding "the others" in each rank's own order differs in the last bits between ranks, and
# replicas would slowly drift). The counts match the formulas exactly. The naive scheme moves
# G·(G−1)·N against the others' 2·(G−1)·N: **G/2 times** as much (2× at G = 4, and growing with
# G). The master and the ring move **the same** total (R7); the difference is *who* carries it, below.
#
# ## The ring, step by step: the seed's worked example (R5, R6)
#
# Four GPUs, each splits its gradients into four segments: GPU1 holds a₁ … a₄, GPU2 b₁ … b₄, and so on.
# Below is a **recorded real run** of `ring_all_reduce` on 4 ranks, replayed over those labels (each
# transfer recorded which segment it carried; the replay says what that segment held):

# %% tags=["nbval-check-output"]
def record_ring(rank, world_size):
    with comm.record() as traffic:
        ring_all_reduce(torch.full((world_size,), float(rank + 1)))
    return traffic


seed_run = comm.Traffic.merge(coursekit.launch(record_ring, 4))
for step in replay(seed_run, 4):
    name = "share-reduce (reduce-scatter)" if step.phase == "reduce-scatter" else "share-only (all-gather)"
    print(f"{name}, iteration {step.step + 1}:")
    for line in step.describe():
        print("   ", line)

# %% [markdown]
# Exactly the seed's iterations: in iteration 1 "GPU1 sends a₁ to GPU2, added to b₁", in iteration 2
# "GPU1 sends (d₄+a₄) to GPU2, added to b₄", … After three iterations each GPU holds **one complete
# segment** (GPU1 holds b₂+c₂+d₂+a₂: rank `r` owns segment `(r+1) mod G`), and three more iterations of
# passing complete segments round the same ring give every GPU every segment.
#
# ### Step through it yourself
#
# Move **step** (or press **Play**) to walk through every step of both phases; change **GPUs** (2 to 8).
# The drawing comes from the single-process simulator running the very same `ring_all_reduce` code
# (one thread per rank), so it answers instantly. Shade = how many GPUs' values a cell already sums;
# outlined cells just received something; arrows are this step's transfers.

# %%
ring_explorer(WORLD_SIZE)

# %% [markdown]
# ## Traffic against G and N, counted
#
# The simulator runs the same code, so it can count for many world sizes in a blink. (A test in
# `tests/test_collectives.py` checks that the simulator's trace equals a real run's, transfer by transfer.)

# %% tags=["nbval-check-output"]
def count(rank, world_size, name, numel):
    ALGORITHMS[name](torch.zeros(numel))


rows = []
for G in range(2, 9):
    for name in ALGORITHMS:
        traffic = comm.simulate(count, G, name, N).traffic
        rows.append({"algorithm": name, "G": G, "N": N, "measured": traffic.total,
                     "formula": (G * (G - 1) if name == "naive" else 2 * (G - 1)) * N,
                     "busiest": traffic.sent[traffic.busiest_rank] + traffic.received[traffic.busiest_rank]})
print(f"N = {N}: elements moved (counted = formula everywhere: {all(r['measured'] == r['formula'] for r in rows)})")
print(f"{'G':>2} " + " ".join(f"{name:>9}" for name in ALGORITHMS) + "   busiest GPU's load: "
      + " ".join(f"{name:>7}" for name in ALGORITHMS))
for G in range(2, 9):
    mine = {r["algorithm"]: r for r in rows if r["G"] == G}
    print(f"{G:>2} " + " ".join(f"{mine[n]['measured']:>9}" for n in ALGORITHMS) + "                       "
          + " ".join(f"{mine[n]['busiest']:>7}" for n in ALGORITHMS))

print("\nG = 4, the ring against N (exact, uneven segments included):")
for numel in (3, 4, 10, 1001, 100_000):
    traffic = comm.simulate(count, 4, "ring", numel).traffic
    print(f"  N = {numel:>6}: moved {traffic.total:>6} = 2·(G−1)·N = {6 * numel:>6};"
          f"  per rank {list(traffic.sent.values())} = formula {list(ring_traffic(numel, 4).values())}")

# %%
fig, ax = plt.subplots(figsize=(6, 3.6))
plot_traffic(rows, ax=ax)
ax.set_title("Elements moved per all-reduce: counted (dots) vs formula (lines)")
plt.show()

# %% [markdown]
# For uneven segments the ring's per-rank count is exact too: rank `r` sends every segment but
# `(r+1) mod G` in the reduce-scatter and every segment but `(r+2) mod G` in the all-gather, so
# `2N − len((r+1) mod G) − len((r+2) mod G)` elements; summed over ranks that is exactly `2·(G−1)·N`.
#
# ## Who carries the load: why one master does not scale (R4, R7)
#
# Same total traffic, very different distribution. Per-rank load, counted, at G = 8:

# %% tags=["nbval-check-output"]
loads = {}
for name in ALGORITHMS:
    traffic = comm.simulate(count, 8, name, N).traffic
    loads[name] = {r: traffic.sent[r] + traffic.received[r] for r in traffic.sent}
    links = traffic.links
    print(f"{name:<7} total {traffic.total:>6}  busiest rank {traffic.busiest_rank} carries "
          f"{loads[name][traffic.busiest_rank]:>6} ({loads[name][traffic.busiest_rank] / (2 * traffic.total):.0%} of all "
          f"sends+receives)  busiest link {max(links.values()):>5} elements over {len(links)} links")

# %%
fig, ax = plt.subplots(figsize=(6.5, 3.4))
plot_rank_load(loads, ax=ax)
ax.set_title(f"G = 8, N = {N}: elements each rank sends + receives (counted)")
plt.show()

# %% [markdown]
# The master (rank 0) sends and receives **half of everything** (with G = 8: 7N in, 7N out), and the
# others wait on it; its load grows with G. Each ring rank carries `≈ 4·(G−1)·N/G < 4N`, *whatever* G is.
# Now timed on real ranks, for a 4 MiB tensor as G grows. A caveat for laptops: here every "GPU" is a
# process sharing the same few CPU cores, so all times rise with G and single runs are noisy; the counted
# loads above are the robust evidence, these timings show how much of it survives on your machine.

# %%
load_rows = []
for G in LOAD_WORLD_SIZES:
    load_rows += measure(G, [4 << 20], ["master", "ring"], repeats=REPEATS)
for name in ("master", "ring"):
    print(f"{name:<7}" + "  ".join(f"G={r['world_size']}: {r['seconds'] * 1e3:6.2f} ms"
                                  for r in load_rows if r["algorithm"] == name))
fig, ax = plt.subplots(figsize=(5, 3))
for name, colour in (("master", "#edae49"), ("ring", "#2e86ab")):
    mine = [r for r in load_rows if r["algorithm"] == name]
    ax.plot([r["world_size"] for r in mine], [r["seconds"] * 1e3 for r in mine], "o-", color=colour, label=name)
ax.set_xticks(LOAD_WORLD_SIZES)  # whole numbers of ranks
ax.set_xlabel("G (ranks)"); ax.set_ylabel("median ms (4 MiB)"); ax.legend(); ax.grid(alpha=0.3)
ax.set_title("Measured: all-reduce of 4 MiB as G grows")
plt.show()

# %% [markdown]
# ## Time against message size, and the α–β model
#
# A message of `n` bytes takes about `α + β·n`: a fixed latency `α` plus `n` over the bandwidth `1/β`.
# An algorithm with `s` sequential steps moving `b` bytes per rank takes about `s·α + β·b`:
#
# | algorithm | steps `s` | bytes per rank on the critical path |
# |---|---|---|
# | naive | 1 (all at once) | `(G−1)·n` in, `(G−1)·n` out |
# | master | 2 | `(G−1)·n` through the master, each way |
# | ring | `2·(G−1)` | `2·(G−1)/G · n` |
#
# The ring pays more latency (more steps) but the least bandwidth: it wins for large messages, which
# is what gradients are. Measured on real ranks (median of `REPEATS`, slowest rank per iteration), with
# `torch.distributed.all_reduce` (gloo here, NCCL on GPUs) for reference, and a fitted `α + β·bytes`:

# %%
timing_rows = measure(WORLD_SIZE, [k << 10 for k in SIZES_KIB], ["torch", "ring", "master", "naive"],
                      repeats=REPEATS)
fits = fit_alpha_beta(timing_rows)
print(f"{'size':>8} " + " ".join(f"{n:>9}" for n in ("torch", "ring", "master", "naive")) + "   (median ms)")
for kib in SIZES_KIB:
    t = {r["algorithm"]: r["seconds"] for r in timing_rows if r["bytes"] == kib << 10}
    print(f"{kib:>5} KiB " + " ".join(f"{t[n] * 1e3:>9.3f}" for n in ("torch", "ring", "master", "naive")))
print("\nfit  time = α + β·bytes:")
for name, (alpha, beta) in sorted(fits.items()):
    print(f"  {name:<7} α = {alpha * 1e6:8.0f} µs   1/β = {(1 / beta / 1e9 if beta else float('inf')):6.2f} GB/s")

# %%
fig, ax = plt.subplots(figsize=(6.5, 4))
plot_timings(timing_rows, fits, ax=ax)
ax.set_title(f"{WORLD_SIZE} ranks: measured (dots) and fitted α + β·bytes (lines)")
plt.show()

# %% [markdown]
# Read the fit for what it measures here. On a laptop every "GPU" shares a few CPU cores and "links"
# are memory copies through the kernel: with more single-thread ranks than cores, the fitted α is
# mostly the ranks waiting for a core and the per-call length check, not a link latency, so do not read
# the ring's intercept as "2·(G−1) network latencies". What carries over to a cluster is what the
# counts above prove exactly: the naive scheme moves G/2 times more data, the master funnels all of it
# through one GPU's link, and the ring spreads it evenly, so at large messages, where bandwidth
# dominates, the ring's per-GPU traffic `2·(G−1)/G · n` is what sets the time.
#
# ## algbw and busbw, as nccl-tests defines them
#
# [nccl-tests](https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md) reports two numbers:
#
# * **algbw** = `bytes / time`: how fast the *user's* tensor got all-reduced.
# * **busbw** = `algbw · 2(n−1)/n` for all-reduce: the bandwidth each link actually sustained in an
#   optimal (ring) all-reduce, since each rank must send and receive `2(n−1)/n` of the tensor. It does not
#   depend on `n`, so it compares directly with the hardware's link bandwidth.

# %%
print(f"{'size':>8} {'ring algbw':>11} {'ring busbw':>11} {'torch busbw':>12}  (GB/s, {WORLD_SIZE} ranks)")
for kib in SIZES_KIB:
    ring = next(r for r in timing_rows if r["algorithm"] == "ring" and r["bytes"] == kib << 10)
    torch_row = next(r for r in timing_rows if r["algorithm"] == "torch" and r["bytes"] == kib << 10)
    print(f"{kib:>5} KiB {ring['algbw'] / 1e9:>11.3f} {ring['busbw'] / 1e9:>11.3f} {torch_row['busbw'] / 1e9:>12.3f}")
assert abs(busbw(1e6, 1e-3, 4) - algbw(1e6, 1e-3) * 1.5) < 1e-6  # 2(n-1)/n = 1.5 for n = 4

# %% [markdown]
# ## The interview, answered with numbers (R1)
#
# Take a 7-billion-parameter model with bf16 gradients (2 bytes each: 14 GB of gradients per step),
# 1,000 GPUs, and give every GPU a 400 Gb/s network link (50 GB/s each way) with 10 µs latency per message.
# The traffic formulas are the ones counted exactly above; here they are checked once more, by counting
# a simulated ring and master at G = 16, before being used at G = 1,000.

# %% tags=["nbval-check-output"]
BYTES = 2                 # bf16 gradients
LINK = 50e9               # bytes per second, each direction, per GPU
ALPHA = 10e-6             # seconds per message
psi = MODEL_PARAMS * BYTES  # gradient bytes per GPU

check = comm.simulate(count, 16, "ring", 16_000).traffic
assert check.total == 2 * 15 * 16_000 and max(check.sent.values()) == 2 * 15 * 16_000 // 16
check = comm.simulate(count, 16, "master", 16_000).traffic
assert check.received[0] == check.sent[0] == 15 * 16_000
print("formulas re-checked by counting at G = 16: ok\n")

master_in = (GPUS - 1) * psi                      # the master receives everyone's gradients ...
master_time = 2 * master_in / LINK + 2 * ALPHA     # ... and only then sends the result back to everyone
# a master that forwards each chunk as soon as it is summed overlaps its in and out (full duplex):
master_overlapped = master_in / LINK + 2 * ALPHA
ring_per_gpu = 2 * (GPUS - 1) / GPUS * psi        # each GPU sends this much (and receives as much)
ring_time = ring_per_gpu / LINK + 2 * (GPUS - 1) * ALPHA
print(f"model: {MODEL_PARAMS / 1e9:.0f}B parameters, bf16 gradients = {psi / 1e9:.0f} GB per GPU per step, "
      f"{GPUS} GPUs")
print(f"parameter server: its one link must take in {master_in / 1e12:.2f} TB and send out "
      f"{master_in / 1e12:.2f} TB per step")
print(f"   -> at {LINK / 1e9:.0f} GB/s: {master_time:,.0f} s per step just to synchronise, if it receives "
      f"everything before it sends;\n      {master_overlapped:,.0f} s if it forwards each chunk as soon as it is summed")
print(f"ring all-reduce:  every GPU sends {ring_per_gpu / 1e9:.2f} GB and receives as much, "
      f"in {2 * (GPUS - 1)} steps")
print(f"   -> {ring_per_gpu / LINK:.2f} s of bandwidth + {2 * (GPUS - 1) * ALPHA * 1e3:.0f} ms of latency "
      f"= {ring_time:.2f} s per step")
print(f"the ring is {master_time / ring_time:,.0f}x faster than the first master and "
      f"{master_overlapped / ring_time:,.0f}x faster than the second, and its per-GPU traffic stays below "
      f"2 x {psi / 1e9:.0f} GB however many GPUs join")

# %% [markdown]
# So the answer that passes the interview: **all-reduce the gradients with a bandwidth-optimal
# collective such as the ring**. One parameter server would have to move about 28 TB through one link
# every step (almost 10 minutes at 50 GB/s if it receives everything before sending, about 5 if it
# overlaps in and out perfectly); with a ring each GPU moves under 28 GB (about half a second),
# and adding GPUs adds latency steps, not bandwidth. At 1,000 GPUs the ring's `2·(G−1)` latency steps
# start to matter (20 ms here, more on slow links), which is why NCCL also uses trees and hierarchical
# (within-node, then across-node) rings at that scale. Sharded parameter servers split the one link's
# load across many servers, effectively rebuilding a reduce-scatter.
#
# **Next**: `exercises/01_ring_allreduce.ipynb`: write the two phases yourself, graded by
# `coursekit grade`. Then chapter 02 builds data parallelism and ZeRO on these very collectives.
