# ci_parameters: {"SIZES_KIB": [4, 64, 1024], "REPEATS": 5, "LOAD_WORLD_SIZES": [2, 3, 4], "MODEL_RECORD_MAX_G": 16}
# %% [markdown]
# # 01 · How GPUs share what they learn: naive, single master, ring all-reduce
#
# > **The interview question (R1).** *"We must train an LLM on 1,000 GPUs. How do all the GPUs share what
# > they learn?"*
# >
# > Answering *"a central [parameter server](../docs/glossary.md#parameter-server) collects everyone's gradients, averages them and sends the
# > new weights back"* ends the interview.
#
# This chapter finds out why, with real ranks: three ways to sum gradients across GPUs, each one
# **run**, **counted** (every element that crosses a link), **timed**, and for the ring, **stepped
# through** one transfer at a time. At the end we answer the interview with numbers.
#
# The runs and timings here are real `torch.distributed` ranks (processes talking through gloo on the
# CPU, or NCCL on GPUs); the counts at many world sizes come from the simulator, which runs the same
# code in one process, and the cluster's times from a network model that replays that code's traces.
# Naive and master live in `coursekit/collectives/__init__.py`, the ring in `coursekit/collectives/ring.py`, all built only
# from [point-to-point](../docs/glossary.md#point-to-point) `send`/`recv` (`coursekit/comm/__init__.py`, which also counts every transfer): read them
# next to this notebook.

# %% tags=["parameters"]
# Parameters: small so the notebook runs in well under a minute; raise them to see more.
WORLD_SIZE = 4                      # ranks for the real runs
SIZES_KIB = [4, 64, 1024, 4096]     # message sizes to time (learners: try up to 65536 = 64 MiB)
REPEATS = 10                        # timed iterations per point (the median is reported)
LOAD_WORLD_SIZES = [2, 3, 4]        # world sizes for "the master does not scale" (try up to 8)
MODEL_PARAMS = 7e9                  # the interview: a 7-billion-parameter model ...
GPUS = 1000                         # ... on 1,000 GPUs
MODEL_RECORD_MAX_G = 64             # the network model replays recorded traces up to this G (try 256: slow)

# %%
# %matplotlib inline
import matplotlib.pyplot as plt
import torch
import torch.distributed as dist

import coursekit
from coursekit import comm
from coursekit.bench.allreduce import algbw, busbw, measure
from coursekit.collectives import (master_all_reduce, naive_all_reduce, owned_segment, replay, ring_all_reduce,
                                   ring_traffic, segment_bounds)
from coursekit.collectives import ring_walkthrough
from coursekit.collectives.hierarchical import hierarchical_all_reduce, hierarchical_traffic
from coursekit.comm.mesh import Mesh
from coursekit.netsim import (Network, calibrate, closed_form_time, collective_time, collective_trace, crossover,
                              fit_alpha_beta, simulate_time)
from coursekit.viz.collectives import size_label, draw_ring_step, plot_rank_load, plot_timings, plot_traffic
from coursekit.viz.netsim import draw_explorer, plot_time_against_g
from coursekit.widgets.netsim import network, network_explorer
from coursekit.widgets.ring import ring_explorer

ALGORITHMS = {"naive": naive_all_reduce, "master": master_all_reduce, "ring": ring_all_reduce}

# %% [markdown]
# ## Why gradients must be synchronised (R2)
#
# In data parallelism every GPU holds the **same model** but sees **different data**, so each computes
# different gradients. If each applied its own, the copies would drift apart after one step. So before
# the update, the GPUs *[all-reduce](../docs/glossary.md#all-reduce)* their gradients: every GPU ends with the sum (here: the mean) of all
# of them. A major runtime [bottleneck](../docs/glossary.md#bottleneck) of multi-GPU training is exactly this [synchronisation](../docs/glossary.md#gradient-synchronisation) (R2).
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
# | **[naive](../docs/glossary.md#naive-all-reduce)** (R3) | every GPU sends its whole tensor to every other GPU | `G·(G−1)·N` | `2·(G−1)·N` |
# | **[single master](../docs/glossary.md#single-master)** (R4) | all send to one GPU, it sums and sends the result back | `2·(G−1)·N` | `2·(G−1)·N`, the master |
# | **[ring](../docs/glossary.md#ring-all-reduce)** (R5, R6) | [segments](../docs/glossary.md#segment) travel round a ring: [reduce-scatter](../docs/glossary.md#reduce-scatter), then [all-gather](../docs/glossary.md#all-gather) | `2·(G−1)·N` | `≈ 4·(G−1)·N/G` |
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
# replicas would slowly [drift](../docs/glossary.md#silent-divergence)). The counts match the formulas exactly. The naive scheme moves
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
# outlined cells just received something; arrows are this step's transfers. Every cell writes its sum
# out as the seed does (a₁+b₁+c₁, …), at any number of GPUs. First the widget's starting state as a
# plain image (it shows where widgets do not render), then the widget:

# %%
_ = draw_ring_step(ring_walkthrough(WORLD_SIZE), 0)
plt.show()

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
    total, per_rank, formula = traffic.total, list(traffic.sent.values()), list(ring_traffic(numel, 4).values())
    print(f"  N = {numel:>6}: moved {total:>6} {'=' if total == 2 * 3 * numel else '≠'} 2·(G−1)·N = {2 * 3 * numel:>6};"
          f"  per rank {per_rank} {'=' if per_rank == formula else '≠'} formula {formula}")

# %%
fig, ax = plt.subplots(figsize=(6, 3.6))
plot_traffic(rows, ax=ax)
ax.set_title("Elements moved per all-reduce: counted (markers) vs formula (lines)")
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
loads, interface, pair = {}, {}, {}
for name in ALGORITHMS:
    traffic = comm.simulate(count, 8, name, N).traffic
    loads[name] = {r: traffic.sent[r] + traffic.received[r] for r in traffic.sent}
    links = traffic.links
    # a GPU's one full-duplex interface: its busier direction (sends and receives overlap, they do not add)
    interface[name] = max(max(traffic.sent.values()), max(traffic.received.values()))
    pair[name] = max(links.values())          # the busiest (sender, receiver) pair, one direction
    print(f"{name:<7} total {traffic.total:>6}  busiest rank {traffic.busiest_rank} carries "
          f"{loads[name][traffic.busiest_rank]:>6} ({loads[name][traffic.busiest_rank] / (2 * traffic.total):.1%} of all "
          f"sends+receives)  busiest link {max(links.values()):>5} elements over {len(links)} links")
print(f"\n{'':<7} {'per pair (busiest)':>19} {'per GPU interface (busiest direction)':>38}")
for name in ALGORITHMS:
    print(f"{name:<7} {pair[name]:>19} {interface[name]:>38}")

# %%
fig, ax = plt.subplots(figsize=(6.5, 3.4))
plot_rank_load(loads, ax=ax)
ax.set_title(f"G = 8, N = {N}: elements each rank sends + receives (counted)")
plt.show()

# %% [markdown]
# The master (rank 0) sends and receives **half of everything** (with G = 8: 7N in, 7N out), and the
# others wait on it; its load grows with G. Each ring rank carries `≈ 4·(G−1)·N/G < 4N`, *whatever* G is.
#
# **Per pair or per GPU?** Counted per *pair of ranks*, the ring's busiest pair carries more than the
# master's (the table: 1,752 against 1,001 elements, since a ring rank sends all its segments to one
# neighbour while every master pair carries one tensor). That does not make the ring slower: a GPU has
# *one* network interface, and every pair it talks to shares it. The master's interface must take in
# 7 × 1,001 = 7,007 elements and then send as many back (a full-duplex link could overlap the two; this
# master does them one after the other, and the interview at the end times both), the ring's 1,752.
# **The per-GPU interface load limits the time**, and the network model below times exactly that: each
# GPU's send side and receive side, whatever the pairs.
# Now timed on real ranks, for a 4 MiB tensor as G grows. Read it with care: here every "GPU" is a
# process, and they share this machine's CPU cores (the first line of the output says how many).

# %%
import os

CORES = len(os.sched_getaffinity(0))
print(f"{CORES} CPU cores for {', '.join(map(str, LOAD_WORLD_SIZES))} rank processes")
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
# **What this measures.** With more rank processes than cores, ranks take turns on the CPU: a rank
# that has to forward a segment waits until the scheduler runs it, and the ring (2·(G−1) hand-offs per
# call) waits more often than the master (2 hand-offs). So beyond the number of cores the figure times
# the **scheduler**, not a network, and either algorithm may come out ahead from one run to the next.
# Only at G ≤ the number of cores does each rank have a core to itself; on a 2-core laptop that is
# G = 2, where master and ring move the same bytes between the same two processes, though not in the
# same order: the master's two messages of N go one after the other (in, then out), the ring's four
# messages of N/2 go two at a time, one each way, which a full-duplex link can carry in up to half the
# time. Nothing at G = 2 is about scaling yet. The loads counted above do not depend on the machine;
# what a cluster makes of them is the network model's job, next.

# %% [markdown]
# ## Time against message size, and the α–β model
#
# A message of `n` bytes takes about `α + β·n`: a fixed [latency](../docs/glossary.md#latency-and-bandwidth) `α` plus `n` over the bandwidth `1/β`.
# An algorithm with `s` sequential steps moving `b` bytes per rank takes about `s·α + β·b`:
#
# | algorithm | steps `s` | bytes per rank on the critical path |
# |---|---|---|
# | naive | 1 (all at once) | `(G−1)·n` in, `(G−1)·n` out |
# | master | 2 | `(G−1)·n` through the master, each way |
# | ring | `2·(G−1)` | `2·(G−1)/G · n` |
#
# The ring pays more latency (more steps) but the least bandwidth: on a network it wins for large
# messages, which is what gradients are (the network model below shows from which size). This laptop
# need not agree at the sizes it can run; the note after the figure says why. Measured on real ranks
# (median of `REPEATS`, slowest rank per iteration), with `torch.distributed.all_reduce` (gloo here,
# NCCL on GPUs) for reference, and a fitted `α + β·bytes`:

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
# * **[algbw](../docs/glossary.md#algbw-and-busbw)** = `bytes / time`: how fast the *user's* tensor got all-reduced.
# * **busbw** = `algbw · 2(n−1)/n` for all-reduce: the bandwidth each link actually sustained in an
#   optimal (ring) all-reduce, since each rank must send and receive `2(n−1)/n` of the tensor. The factor
#   takes the rank count out, so ideally busbw stays the same whatever `n`, and it compares directly
#   with the hardware's link bandwidth.

# %%
print(f"{'size':>8} {'ring algbw':>11} {'ring busbw':>11} {'torch busbw':>12}  (GB/s, {WORLD_SIZE} ranks)")
for kib in SIZES_KIB:
    ring = next(r for r in timing_rows if r["algorithm"] == "ring" and r["bytes"] == kib << 10)
    torch_row = next(r for r in timing_rows if r["algorithm"] == "torch" and r["bytes"] == kib << 10)
    print(f"{kib:>5} KiB {ring['algbw'] / 1e9:>11.3f} {ring['busbw'] / 1e9:>11.3f} {torch_row['busbw'] / 1e9:>12.3f}")
assert abs(busbw(1e6, 1e-3, 4) - algbw(1e6, 1e-3) * 1.5) < 1e-6  # 2(n-1)/n = 1.5 for n = 4

# %% [markdown]
# ## What a cluster would do: the network model (R4, R7)
#
# A laptop cannot show 1,024 GPUs, but the traces above can be *replayed* on a modeled network:
# `coursekit.netsim` takes the transfers that the very same [collective](../docs/glossary.md#collective) code records (per step, who
# sends how many bytes to whom) and times them. Its assumptions, stated once in its docstring: every
# GPU has one full-duplex link of bandwidth `B` each way and latency `α` to a non-blocking switch; GPUs
# of one node talk over a second, faster link; a link's send side (and its receive side) carries one
# byte stream at a time; a step ends when its busiest side is done, `α + bytes/B`. Nothing about the
# algorithms is written into the model: it reads traces.
#
# The cluster here uses published link figures: **400 Gb/s InfiniBand** between nodes (NDR, 50 GB/s
# each way per GPU) and **NVLink 4** inside a node of 8 (H100 SXM: 900 GB/s both ways, 450 GB/s each
# way). The latencies are assumptions of the right order for one NCCL step, not published figures:
# 10 µs between nodes, 2 µs inside (the widget below lets you change them).
#
# The model replays recorded traces up to `MODEL_RECORD_MAX_G` GPUs (the trace of a flat ring holds
# 2·G·(G−1) messages; at 1,024 GPUs that is two million, minutes of Python). Beyond, the lines are the
# closed forms derived in `netsim`'s docstring, which `tests/test_netsim.py` checks against the model
# on many recorded cases (exactly equal where G divides N; otherwise the ring's closed form is an upper
# bound), and which this cell checks again at every recorded G:

# %% tags=["nbval-check-output"]
CLUSTER = Network(bandwidth=400e9 / 8, latency=10e-6, gpus_per_node=8, intra_bandwidth=450e9, intra_latency=2e-6)
SIZES_MODEL = {"4 MiB (float32, measured above)": (4 << 20, 4),
               f"{MODEL_PARAMS * 2 / 1e9:.0f} GB (the interview's bf16 gradients)": (int(MODEL_PARAMS) * 2, 2)}
NAMES = ("master", "naive", "ring", "hierarchical")
recorded_g = [2 ** i for i in range(1, 11) if 2 ** i <= MODEL_RECORD_MAX_G]
replayed, agree = {}, True
for label, (nbytes, itemsize) in SIZES_MODEL.items():
    replayed[label] = {name: {} for name in NAMES}
    for G in recorded_g:
        for name in NAMES:
            if name == "hierarchical" and G <= CLUSTER.gpus_per_node:
                continue   # one node: nothing to do across nodes
            model = collective_time(name, G, nbytes // itemsize, CLUSTER, itemsize).total
            replayed[label][name][G] = model
            agree &= abs(model - closed_form_time(name, G, nbytes // itemsize, CLUSTER, itemsize)) <= 1e-9 * model
print(f"traces replayed at G = {recorded_g}: model = closed form at every one: {agree}\n")
for label, (nbytes, itemsize) in SIZES_MODEL.items():
    print(f"all-reduce of {label}")
    print(f"{'G':>6} " + " ".join(f"{name:>13}" for name in NAMES))
    for G in (2, 8, 64, 1024):
        row = [closed_form_time(name, G, nbytes // itemsize, CLUSTER, itemsize)
               if name != "hierarchical" or G > 8 else None for name in NAMES]
        print(f"{G:>6} " + " ".join(f"{t * 1e3:>10.3f} ms" if t is not None else f"{'-':>13}" for t in row))
    print()

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
for ax, (label, (nbytes, itemsize)) in zip(axes, SIZES_MODEL.items()):
    plot_time_against_g(nbytes, CLUSTER, ax=ax, recorded=replayed[label], itemsize=itemsize)
    ax.set_title(f"modeled all-reduce of {label.split(' (')[0]}: dots replay traces, lines closed forms", fontsize=10)
fig.suptitle("400 Gb/s InfiniBand between nodes, NVLink inside nodes of 8", fontsize=11)
fig.tight_layout()
plt.show()

# %% [markdown]
# Read the lines against the table above it:
#
# * **master** grows linearly in G: its InfiniBand interface takes in `(G−k)·N` (the other `k−1`
#   gradients of its node arrive over NVLink) and then sends as much back, so `2·α + 2·(G−k)·N·b/B`
#   (the jump after G = 8 is the move from NVLink to InfiniBand).
# * **ring**: its *bandwidth term* (dashed) is `2·(G−1)/G · N·b/B ≈ 2·N·b/B`: flat once the ring spans
#   nodes (G ≥ 16); like the master's, it jumps after G = 8, where NVLink gives way to InfiniBand.
#   Its *latency term* (dotted) grows with `2·(G−1)`: at 1,024 GPUs that is 2,046 steps, 20.46 ms,
#   over a hundred times its bandwidth term for a 4 MiB [bucket](../docs/glossary.md#bucket). For the 14 GB gradient the bandwidth
#   term still dominates.
# * **[hierarchical](../docs/glossary.md#hierarchical-all-reduce)** (next section) pays `2·(k−1) + 2·(n−1)` latencies, 268 at 1,024 GPUs in nodes
#   of 8, and sends only `1/k` of the bytes per GPU over InfiniBand.
#
# ### The same model with this machine's fitted α and B
#
# `netsim.calibrate` finds the `α` and `B` with which the model best fits a measured 2-rank ring (G = 2:
# the one world size where each rank has a core here), then the same model extrapolates to G GPUs on a
# switch made of this machine's "links" (loopback memory copies):

# %%
two_rank = measure(2, [k << 10 for k in SIZES_KIB], ["ring"], repeats=REPEATS)
HERE = calibrate([(r["bytes"], r["seconds"]) for r in two_rank], "ring", world_size=2)
print(f"fitted on 2 ranks: α = {HERE.latency * 1e6:.0f} µs, B = {HERE.bandwidth / 1e9:.2f} GB/s")
for r in two_rank:
    predicted = collective_time("ring", 2, r["bytes"] // 4, HERE).total
    print(f"  {size_label(r['bytes']):>8}: measured {r['seconds'] * 1e3:7.3f} ms, model {predicted * 1e3:7.3f} ms "
          f"({predicted / r['seconds'] - 1:+.0%})")
fig, ax = plt.subplots(figsize=(6.5, 4))
plot_time_against_g(4 << 20, HERE, ax=ax, world_sizes=tuple(2 ** i for i in range(1, 11)))
ax.set_title("modeled 4 MiB all-reduce with this machine's fitted α, B (one level)", fontsize=10)
plt.show()

# %% [markdown]
# The shape is the cluster's: the master's line rises linearly with G, the ring's bandwidth term is
# flat and its latency term climbs with `2·(G−1)·α`. This machine's `α` (fitted above) is far larger
# than a network's: it is mostly the per-call work of the collective and the wait for a core, not a
# wire. The fit rests on one world size and a few sizes on a shared, noisy machine (the same 4 MiB
# ring can time differently in this cell than in the one above), so read its percentages above as the
# error of a two-number model on such a machine, not as a calibration to trust at 1,024 GPUs.
#
# ## Hierarchical all-reduce: rings inside nodes, rings of shards across them
#
# What large clusters do beyond one flat ring (`coursekit/collectives/hierarchical.py`, built from the ring above
# on a [mesh](../docs/glossary.md#mesh)'s two [axes](../docs/glossary.md#axis)): **reduce-scatter inside each node** (local rank `l` ends with the node's sum
# of [shard](../docs/glossary.md#shard) `(l+1) mod k`), **all-reduce of the shards across nodes** (`k` rings at once, one per local
# rank, each over its own network link), **all-gather inside each node**. Per GPU it sends
# `2(k−1)/k·N` elements inside its node and only `2(n−1)/n·N/k` across nodes. Run for real on a
# 2 × 2 mesh (`Mesh({"node": 2, "local": 2})`, 4 ranks), counted per level against those formulas:

# %% tags=["nbval-check-output"]
def hierarchical_run(rank, world_size, numel):
    mesh = Mesh({"node": 2, "local": 2})
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    reference = x.clone()
    dist.all_reduce(reference)
    with comm.record() as traffic:
        hierarchical_all_reduce(x, inner=mesh["local"], outer=mesh["node"])
    return x, (x - reference).abs().max().item(), traffic


runs = coursekit.launch(hierarchical_run, 4, N)
traffic = comm.Traffic.merge([t for _, _, t in runs])
print(f"N = {N} on 2 nodes x 2 GPUs: same bits on all ranks {all(torch.equal(x, runs[0][0]) for x, _, _ in runs)}, "
      f"max |diff| vs dist.all_reduce {'< 1e-5' if max(d for _, d, _ in runs) < 1e-5 else max(d for _, d, _ in runs)}")
print("steps, in order:", ", ".join(f"{p} {s + 1}" for (p, s), _ in traffic.steps()))
print(f"{'rank':>4} {'sent inside':>12} {'formula':>8} {'sent across':>12} {'formula':>8}")
want = hierarchical_traffic(N, 2, 2)
for r in range(4):
    inside = sum(t.numel for t in traffic.payload if t.src == r and t.dst // 2 == r // 2)
    across = sum(t.numel for t in traffic.payload if t.src == r and t.dst // 2 != r // 2)
    print(f"{r:>4} {inside:>12} {want[r][0]:>8} {across:>12} {want[r][1]:>8}")

# %% [markdown]
# With N = 1001 the node's shards are 501 and 500 elements, so ranks differ by one element, exactly
# as the formula says. Each stage labels its steps apart ("inner reduce-scatter", "outer
# reduce-scatter", …): the network model runs one label as one step, so the stages are timed one after
# the other, as they run.
#
# **When each wins, at 1,024 GPUs in nodes of 8** (the model's closed forms; `netsim.crossover` finds
# the smallest message from which one algorithm is faster than another):

# %% tags=["nbval-check-output"]
G = 1024
GRID = [G * 2**j for j in range(31)]  # G to 2^30·G elements: where crossover() searches
for first, second in (("ring", "naive"), ("hierarchical", "naive"), ("hierarchical", "master"),
                      ("hierarchical", "ring"), ("ring", "hierarchical")):
    at = crossover(first, second, G, CLUSTER)
    # crossover() assumes one crossing; check it on the grid before saying "from ... on"
    wins = [closed_form_time(first, G, n, CLUSTER) < closed_form_time(second, G, n, CLUSTER) for n in GRID]
    assert wins == sorted(wins), f"{first} vs {second}: more than one crossing"
    print(f"{first:>12} beats {second:<12} " + ("never (up to 2^30·G elements)" if at is None else
          "at every size from G elements on" if at == G else f"from {size_label(at * 4)} (float32) on"))
ring_latency = closed_form_time("ring", G, G, Network(float("inf"), 10e-6, 8, float("inf"), 2e-6))
bytes_per_s = closed_form_time("ring", G, G * 2**20, Network(50e9, 0.0, 8, 450e9, 0.0)) / (G * 2**20 * 4)
print(f"\nflat ring: latency term {ring_latency * 1e3:.2f} ms; it equals the bandwidth term at "
      f"{ring_latency / bytes_per_s / 1e6:.0f} MB")
print(f"hierarchical at 4 MiB: {closed_form_time('hierarchical', G, 2**20, CLUSTER) * 1e3:.2f} ms, "
      f"ring {closed_form_time('ring', G, 2**20, CLUSTER) * 1e3:.2f} ms")

# %% [markdown]
# So on this cluster model the hierarchical all-reduce beats the flat ring at every message size: it
# pays 268 latencies instead of 2,046, and each GPU sends `1/k` of the bytes over InfiniBand because
# all 8 GPUs of a node drive their own network links at once (the flat ring crosses each node
# boundary on one link). Below about 124 KiB even the naive all-to-all (one step, one latency) beats
# it: tiny messages are all latency, which is why NCCL uses tree algorithms and its low-latency
# protocols (LL, LL128) for small messages.
# The flat ring stays latency-bound until half a gigabyte: its 20.46 ms of latency equal its
# bandwidth term only at 512 MB.
#
# ### Explore the model
#
# Five sliders: **G**, the **message size**, the **network link** between nodes and its **latency**,
# and **GPUs per node** (NVLink inside stays at 450 GB/s, 2 µs; with 1 GPU per node there is no
# hierarchy). Left: time against G at this size; right: time against size at this G; the sentence gives
# the numbers and the crossovers. Its default state first, as a plain image:

# %%
_ = draw_explorer(4 << 20, 1024, network(400, 10, 8))
plt.show()

# %%
network_explorer(nbytes=4 << 20, world_size=1024, bandwidth_gbps=400, latency_us=10, gpus_per_node=8)

# %% [markdown]
# ## The interview, answered with numbers (R1)
#
# Take a 7-billion-parameter model with bf16 gradients (2 bytes each: 14 GB of gradients per step) on
# 1,000 GPUs in nodes of 8: the cluster of the network model above (400 Gb/s InfiniBand between nodes,
# NVLink inside, 10 µs and 2 µs per step). Every number below comes from that model: the master's from
# its recorded trace replayed at G = 1,000, the rings' from the closed forms the model equals.

# %% tags=["nbval-check-output"]
from dataclasses import replace

BYTES = 2                                    # bf16 gradients
numel = int(MODEL_PARAMS)
psi = numel * BYTES                          # gradient bytes per GPU

# The master as coded in this chapter: it receives every gradient, *then* sends the sum back.
master_trace = collective_trace("master", GPUS, numel)
master = collective_time("master", GPUS, numel, CLUSTER, BYTES)
# A master that forwards each chunk as soon as it is summed overlaps its in and out (full duplex):
# the same transfers, replayed as one step.
overlapped = simulate_time(comm.Traffic([replace(t, phase="overlapped", step=0) for t in master_trace.transfers],
                                        GPUS), CLUSTER, BYTES)
ring = closed_form_time("ring", GPUS, numel, CLUSTER, BYTES)
hier = closed_form_time("hierarchical", GPUS, numel, CLUSTER, BYTES)
root, k = master.steps[0], CLUSTER.gpus_per_node
side = "network interface" if root.bottleneck[1] == "net" else "NVLink side"
print(f"model: {MODEL_PARAMS / 1e9:.0f}B parameters, bf16 gradients = {psi / 1e9:.0f} GB per GPU per step, "
      f"{GPUS} GPUs in nodes of {k}")
print(f"parameter server: its {side} takes in {root.bytes / 1e12:.2f} TB, then sends as much")
print(f"   -> {master.total:,.0f} s per step if it receives everything before it sends; "
      f"{overlapped.total:,.0f} s if it forwards each chunk at once")
print(f"flat ring:        every GPU sends {2 * (GPUS - 1) / GPUS * psi / 1e9:.2f} GB in {2 * (GPUS - 1)} steps"
      f" -> {ring:.3f} s")
print(f"hierarchical:     {2 * (k - 1) + 2 * (GPUS // k - 1)} steps, 1/{k} of the bytes over InfiniBand "
      f"-> {hier:.3f} s")


def speed(slow: float, fast: float) -> str:
    """'959x faster' (or '1.3x slower' if the second time is the larger one)."""
    return f"{slow / fast:,.{0 if slow / fast >= 10 else 1}f}x faster" if slow >= fast else f"{fast / slow:,.1f}x slower"


print(f"the ring is {speed(master.total, ring)} than the first master and {speed(overlapped.total, ring)} "
      f"than the second; the hierarchical all-reduce {speed(ring, hier)} than the ring")

# %% [markdown]
# So the answer that passes the interview: **all-reduce the gradients with a bandwidth-optimal
# collective**, a ring, and on a real cluster a hierarchical one (ring inside each node, rings of shards
# across nodes). One parameter server would have to move about 14 TB in and 14 TB out through one
# network interface every step: over nine minutes at 50 GB/s if it receives everything before sending,
# over four and a half if it overlaps in and out perfectly. The flat ring needs about half a second per
# step, of which 20 ms are its 1,998 latencies; the hierarchical all-reduce about 0.13 s,
# because each node's eight GPUs drive eight network links at once. Adding GPUs adds latency steps, not
# bandwidth. Sharded parameter servers split the one interface's load across many servers, effectively
# rebuilding a reduce-scatter.
#
# **Next**: `exercises/01_ring_allreduce.ipynb`: write the two phases yourself, graded by
# `coursekit grade`. Then chapter 02 builds data parallelism and [ZeRO](../docs/glossary.md#zero) on these very collectives.
