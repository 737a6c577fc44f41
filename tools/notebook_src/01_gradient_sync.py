# ci_parameters: {"SIZES_KIB": [4, 64, 1024], "REPEATS": 5}
# %% [markdown]
# # 01 · How GPUs share what they learn: naive, single master, ring all-reduce
#
# > **The interview question (R1).** *"We must train an LLM on 1,000 GPUs. How do all the GPUs share what
# > they learn?"*
# >
# > Answering *"a central [parameter server](../docs/glossary.md#parameter-server) collects everyone's gradients, averages them
# > and sends the new weights back"* ends the interview.
#
# This chapter finds out why. It runs three ways to sum gradients across GPUs on real ranks. It counts every
# element that crosses a link, and it steps through the ring one transfer at a time. At the end it answers the
# interview with numbers.
#
# <details><summary>What runs where</summary>
#
# The runs are real `torch.distributed` ranks: processes talking through gloo on the CPU, or NCCL on GPUs. The
# counts at many world sizes come from the simulator, which runs the same code in one process. A cluster's
# times come from a network model that replays that code's messages. Naive and master live in
# `coursekit/collectives/__init__.py`, the ring in `coursekit/collectives/ring.py`. All are built only from
# [point-to-point](../docs/glossary.md#point-to-point) `send` and `recv`.
# </details>

# %% tags=["parameters"]
# Parameters: small so the notebook runs in well under a minute; raise them to see more.
WORLD_SIZE = 4                      # ranks for the real runs
SIZES_KIB = [4, 64, 1024, 4096]     # message sizes to time (learners: try up to 65536 = 64 MiB)
REPEATS = 10                        # timed iterations per point (the median is reported)
MODEL_PARAMS = 7e9                  # the interview: a 7-billion-parameter model ...
GPUS = 1000                         # ... on 1,000 GPUs
MODEL_RECORD_MAX_G = 64             # the network model replays recorded traces up to this G (try 256: slow)

# %%
# %matplotlib inline
from dataclasses import replace

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
# ## 1. Why gradients must be synchronised (R2)
#
# Why do GPUs need to talk at all? In data parallelism every GPU holds the **same model** but sees **different
# data**, so each computes different gradients. If each applied its own, the copies would drift apart. So
# before the update, the GPUs **[all-reduce](../docs/glossary.md#all-reduce)** their gradients: every GPU ends with the sum of
# all of them. This [synchronisation](../docs/glossary.md#gradient-synchronisation) is a major
# [bottleneck](../docs/glossary.md#bottleneck) of multi-GPU training (R2).
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
# **Takeaway:** after the all-reduce both ranks hold the same gradient, the one a single GPU computes on all
# the samples.
#
# ## 2. Three ways to all-reduce
#
# How can G GPUs, each holding N gradient elements, all end with the sum?
#
# | algorithm | how | elements moved | busiest GPU sends + receives |
# |---|---|---|---|
# | **[naive](../docs/glossary.md#naive-all-reduce)** (R3) | every GPU sends its whole tensor to every other GPU | `G·(G−1)·N` | `2·(G−1)·N` |
# | **[single master](../docs/glossary.md#single-master)** (R4) | all send to one GPU, it sums and sends the result back | `2·(G−1)·N` | `2·(G−1)·N`, the master |
# | **[ring](../docs/glossary.md#ring-all-reduce)** (R5, R6) | [segments](../docs/glossary.md#segment) travel round a ring: [reduce-scatter](../docs/glossary.md#reduce-scatter), then [all-gather](../docs/glossary.md#all-gather) | `2·(G−1)·N` | `≈ 4·(G−1)·N/G` |
#
# Here are the first two, as the library runs them. Each first checks that every rank passes a tensor of the
# same length, so a mismatch raises a clear error instead of a hang:

# %%
coursekit.show(naive_all_reduce)

# %%
coursekit.show(master_all_reduce)

# %% [markdown]
# Then the three run on real ranks against `torch.distributed.all_reduce`, every transfer recorded by
# `comm.record()`. `N = 1001` on purpose: it does not divide by 4, so the ring's segments are 251, 250, 250, 250.

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
# **Takeaway:** all three give the right sum, the same bits on every rank; the naive scheme moves G/2 times as
# much as the other two.
#
# Each sum is formed in one fixed order. Adding "the others" in each rank's own order would differ in the last
# bits between ranks, and the replicas would slowly [drift](../docs/glossary.md#silent-divergence). The master and the ring move
# **the same** total (R7). The difference is *who* carries it, in section 4.
#
# ## 3. The ring, step by step: the source's worked example (R5, R6)
#
# Four GPUs each split their gradients into four segments: GPU1 holds a₁ … a₄, GPU2 b₁ … b₄, and so on. Below
# is a recorded real run of `ring_all_reduce` on 4 ranks, replayed over those labels:

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
# These are the source's iterations. In iteration 1 "GPU1 sends a₁ to GPU2, added to b₁"; in iteration 2
# "GPU1 sends (d₄+a₄) to GPU2, added to b₄". After three iterations each GPU holds **one complete segment**.
# Three more iterations of passing complete segments round the same ring give every GPU every segment.
#
# **Takeaway:** in the first phase each GPU ends with one fully summed segment; in the second it passes them on
# until every GPU has all of them.
#
# ### Step through it yourself
#
# Move **step**, or press **Play**, to walk through both phases; change **GPUs** from 2 to 8. The drawing comes
# from the simulator running the very same `ring_all_reduce`, so it answers at once. Shade says how many GPUs'
# values a cell already sums; arrows are this step's transfers. First the widget's starting state as an image,
# then the widget:

# %%
_ = draw_ring_step(ring_walkthrough(WORLD_SIZE), 0)
plt.show()

# %%
ring_explorer(WORLD_SIZE)

# %% [markdown]
# ## 4. Traffic against G and N, counted
#
# How does the traffic grow with the number of GPUs? The simulator runs the same code, so it can count for many
# world sizes at once.

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
# **Takeaway:** the counts equal the formulas: the naive scheme grows with G², the master and the ring with G.
#
# <details><summary>The ring's count with uneven segments</summary>
#
# Rank `r` sends every segment but `(r+1) mod G` in the reduce-scatter, and every segment but `(r+2) mod G` in
# the all-gather: `2N − len((r+1) mod G) − len((r+2) mod G)` elements. Summed over ranks that is exactly
# `2·(G−1)·N`.
# </details>
#
# ## 5. Who carries the load: why one master does not scale (R4, R7)
#
# The same total, but who moves it? Here is each rank's load, counted, at G = 8:

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
# **Takeaway:** every gradient passes through the master's one interface, so its load grows with G; each ring
# rank carries less than 4N, whatever G is.
#
# Counted per *pair* of ranks, the ring's busiest pair carries more than the master's. A ring rank sends all its
# segments to one neighbour, while each master pair carries one tensor. That does not make the ring slower: a
# GPU has *one* network interface, and every pair it talks to shares it. So the per-GPU interface load limits
# the time, and the network model in section 7 times exactly that.
#
# This laptop cannot time it. Its "GPUs" are processes sharing two CPU cores, and its "links" are memory
# copies. With more ranks than cores, a timed run measures the scheduler: the ring hands work from rank to rank
# `2·(G−1)` times a call, and each hand-off waits for a core. So the counted loads carry R4 here, and the
# network model shows what a cluster makes of them.

# %% [markdown]
# ## 6. Time against message size
#
# How long does an all-reduce take? A message of `n` bytes takes about `α + β·n`: a fixed
# [latency](../docs/glossary.md#latency-and-bandwidth) `α` plus `n` over the bandwidth `1/β`. An algorithm with `s` steps, each
# rank moving `b` bytes, takes about `s·α + β·b`:
#
# | algorithm | steps `s` | bytes per rank on the critical path |
# |---|---|---|
# | naive | 1 (all at once) | `(G−1)·n` in, `(G−1)·n` out |
# | master | 2 | `(G−1)·n` through the master, each way |
# | ring | `2·(G−1)` | `2·(G−1)/G · n` |
#
# The ring pays more latency but the least bandwidth, so on a network it wins for large messages, which is
# what gradients are. Below, measured on real ranks with `torch.distributed.all_reduce` for reference, and a
# fitted `α + β·bytes`:

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
# **Takeaway:** on this machine every call pays a large fixed cost, and time grows with the bytes beyond it.
#
# Read the fit for what it measures here. With more single-thread ranks than cores, the fitted α is mostly the
# ranks waiting for a core and the per-call length check, not a link's latency. What carries over to a cluster
# is what the counts prove: the naive scheme moves G/2 times more, the master funnels everything through one
# link, and the ring spreads it evenly.
#
# <details><summary>algbw and busbw, as nccl-tests defines them</summary>
#
# [nccl-tests](https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md) reports two numbers.
# **[algbw](../docs/glossary.md#algbw-and-busbw)** is `bytes / time`: how fast the user's tensor got all-reduced. **busbw** is
# `algbw · 2(n−1)/n`: the bandwidth each link sustained in an optimal ring all-reduce. The factor takes the rank
# count out, so busbw compares directly with the hardware's link bandwidth.
# </details>

# %%
print(f"{'size':>8} {'ring algbw':>11} {'ring busbw':>11} {'torch busbw':>12}  (GB/s, {WORLD_SIZE} ranks)")
for kib in SIZES_KIB:
    ring = next(r for r in timing_rows if r["algorithm"] == "ring" and r["bytes"] == kib << 10)
    torch_row = next(r for r in timing_rows if r["algorithm"] == "torch" and r["bytes"] == kib << 10)
    print(f"{kib:>5} KiB {ring['algbw'] / 1e9:>11.3f} {ring['busbw'] / 1e9:>11.3f} {torch_row['busbw'] / 1e9:>12.3f}")
assert abs(busbw(1e6, 1e-3, 4) - algbw(1e6, 1e-3) * 1.5) < 1e-6  # 2(n-1)/n = 1.5 for n = 4

# %% [markdown]
# ## 7. What a cluster would do: the network model (R4, R7)
#
# What would 1,024 GPUs do? A laptop cannot show them, but it can replay the course's own messages on a modeled
# network. `coursekit.netsim` takes the transfers that the same [collective](../docs/glossary.md#collective) code records, step by
# step, and times them. Nothing about the algorithms is written into the model: it reads traces.
#
# Its assumptions: every GPU has one full-duplex link of bandwidth `B` and latency `α` to a switch, and GPUs of
# one node talk over a faster link. A step ends when its busiest link is done.
#
# A flat ring across nodes runs as NCCL runs it: as 8 rings at once, called **channels**. Each channel carries
# an eighth of the data and leaves the node through a different GPU, so all 8 network links of a node work
# ([NVIDIA/nccl#299](https://github.com/NVIDIA/nccl/issues/299), [#652](https://github.com/NVIDIA/nccl/issues/652)).
# One ring alone would push every byte through one link per node.
#
# The cluster uses published
# figures: **400 Gb/s InfiniBand** between nodes, 50 GB/s each way per GPU, and **NVLink 4** inside a node of 8,
# 450 GB/s each way. The latencies, 10 µs between nodes and 2 µs inside, are assumptions of the right order.
#
# <details><summary>Recorded traces and closed forms</summary>
#
# The model replays recorded traces up to `MODEL_RECORD_MAX_G` GPUs; a flat ring's trace holds 2·G·(G−1)
# messages, two million at 1,024 GPUs. Beyond, the lines are the closed forms derived in `netsim`'s docstring.
# `tests/test_netsim.py` checks them against the model on many recorded cases, and the cell below checks them
# again at every recorded G.
# </details>

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
# **Takeaway:** the master's time grows linearly with G, while the ring's bandwidth term stays flat: that is R4
# and R7 on a cluster.
#
# * **Master**: its InfiniBand interface takes in `(G−k)·N` and sends as much back. The jump after G = 8 is the
#   move from NVLink to InfiniBand.
# * **Ring**: its bandwidth term, dashed, stays flat whatever G is: about `2·N·b/(8·B)` across nodes, where its 8
#   channels share a node's 8 links. Its latency term, dotted, grows with `2·(G−1)` steps: for a 4 MiB
#   [bucket](../docs/glossary.md#bucket) at 1,024 GPUs it is nearly the whole time.
# * **[Hierarchical](../docs/glossary.md#hierarchical-all-reduce)**, section 8, pays far fewer latencies. Over InfiniBand it
#   sends what the ring's channels send.
#
# ### The same model with this machine's α and B
#
# `netsim.calibrate` fits `α` and `B` to a measured 2-rank ring, where each rank has a core. The same model then
# extrapolates to G GPUs on a switch made of this machine's "links":

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
# The shape is the cluster's: the master's line rises with G, the ring's bandwidth term is flat. This machine's
# `α` is far larger than a network's: it is mostly the collective's per-call work, not a wire. The fit rests on
# one world size and a few sizes on a noisy machine, so read its errors as those of a two-number model.
#
# ## 8. Hierarchical all-reduce: rings inside nodes, rings of shards across them
#
# What can a cluster do about a flat ring's `2(G−1)` steps? Use the two levels of the network. The hierarchical
# all-reduce works on a [mesh](../docs/glossary.md#mesh)'s two [axes](../docs/glossary.md#axis):
#
# 1. **Reduce-scatter inside each node**: each GPU ends with its node's sum of one [shard](../docs/glossary.md#shard).
# 2. **All-reduce of the shards across nodes**: `k` rings at once, one per local rank, each on its own link.
# 3. **All-gather inside each node.**
#
# Per GPU it sends `2(k−1)/k·N` elements inside its node and only `2(n−1)/n·N/k` across nodes. Run for real on a
# 2 × 2 mesh, counted per level against those formulas:

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
# **Takeaway:** the counts match per level: across nodes, each GPU sends only its shard's share.
#
# With N = 1001 the node's shards are 501 and 500 elements, so ranks differ by one element, as the formula says.
#
# **When does each win, at 1,024 GPUs in nodes of 8?** `netsim.crossover` finds the smallest message from which
# one algorithm beats another. The ring runs 8 channels, so sizes step by 8·G elements:

# %% tags=["nbval-check-output"]
G = 1024
GRID = [G * 2**j for j in range(31)]  # G to 2^30·G elements: where crossover() searches
UNIT = CLUSTER.channels(G) * G     # 8 channels · G: the sizes crossover() searches, 1 to 2^30 of them
GRID = [UNIT * 2**j for j in range(31)]
for first, second in (("ring", "naive"), ("hierarchical", "naive"), ("hierarchical", "master"),
                      ("ring", "hierarchical")):
    at = crossover(first, second, G, CLUSTER)
    # crossover() assumes one crossing; check it on the grid before saying "from ... on"
    wins = [closed_form_time(first, G, n, CLUSTER) < closed_form_time(second, G, n, CLUSTER) for n in GRID]
    assert wins == sorted(wins), f"{first} vs {second}: more than one crossing"
    print(f"{first:>12} beats {second:<12} " + ("never (up to 2^30·8·G elements)" if at is None else
          "at every size" if at == UNIT else f"from {size_label(at * 4)} (float32) on"))
ring_latency = closed_form_time("ring", G, UNIT, replace(CLUSTER, bandwidth=float("inf"), intra_bandwidth=float("inf")))
bytes_per_s = closed_form_time("ring", G, UNIT, replace(CLUSTER, latency=0.0, intra_latency=0.0)) / (UNIT * 4)
print(f"\nflat ring: {2 * (G - 1):,} steps, latency term {ring_latency * 1e3:.2f} ms; it equals the bandwidth term "
      f"at {ring_latency / bytes_per_s / 1e9:.1f} GB")
print(f"hierarchical: {2 * 7 + 2 * (G // 8 - 1)} steps")
for nbytes in (4 << 20, 16 << 30):
    ring, hier = (closed_form_time(name, G, nbytes // 4, CLUSTER) for name in ("ring", "hierarchical"))
    print(f"at {size_label(nbytes)}: hierarchical {hier * 1e3:.2f} ms, ring {ring * 1e3:.2f} ms")

# %% [markdown]
# **Takeaway:** the hierarchical all-reduce wins by latency, 268 steps against 2,046: 2.61 ms against 20.48 ms at
# 4 MiB. From 4.32 GiB on, the flat ring is the faster.
#
# Both send the same bytes over InfiniBand: the hierarchical one through its 8 outer rings, the flat ring through
# its 8 channels. So what the hierarchical all-reduce saves is steps, and each step costs a latency. It pays for
# them on large messages: its NVLink stages run before and after its network stage, while the ring's channels
# keep NVLink and InfiniBand busy in the same step. NCCL itself builds only flat rings, plus trees for small
# messages ([NVIDIA/nccl#471](https://github.com/NVIDIA/nccl/issues/471)). Below 128 KiB even the naive all-to-all
# wins, with its one step: that is why NCCL has low-latency protocols for small messages.
#
# ### Explore the model
#
# Five sliders: **G**, the **message size**, the **network link** between nodes and its **latency**, and **GPUs
# per node**. Left: time against G at this size; right: time against size at this G. Its default state first,
# as an image:

# %%
_ = draw_explorer(4 << 20, 1024, network(400, 10, 8))
plt.show()

# %%
network_explorer(nbytes=4 << 20, world_size=1024, bandwidth_gbps=400, latency_us=10, gpus_per_node=8)

# %% [markdown]
# ## 9. The interview, answered with numbers (R1)
#
# Take a 7-billion-parameter model with bf16 gradients, 2 bytes each: 14 GB of gradients per step. Put it on
# 1,000 GPUs in nodes of 8, on the cluster of the network model above. Every number below comes from that model.

# %% tags=["nbval-check-output"]
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
ring = closed_form_time("ring", GPUS, numel, CLUSTER, BYTES)                 # 8 channels, as NCCL runs it
one_ring = closed_form_time("ring", GPUS, numel, replace(CLUSTER, ring_channels=1), BYTES)   # as coded here
hier = closed_form_time("hierarchical", GPUS, numel, CLUSTER, BYTES)
root, k = master.steps[0], CLUSTER.gpus_per_node
side = "network interface" if root.bottleneck[1] == "net" else "NVLink side"
print(f"model: {MODEL_PARAMS / 1e9:.0f}B parameters, bf16 gradients = {psi / 1e9:.0f} GB per GPU per step, "
      f"{GPUS} GPUs in nodes of {k}")
print(f"parameter server: its {side} takes in {root.bytes / 1e12:.2f} TB, then sends as much")
print(f"   -> {master.total:,.0f} s per step if it receives everything before it sends; "
      f"{overlapped.total:,.0f} s if it forwards each chunk at once")
print(f"flat ring:        {2 * (GPUS - 1)} steps, {k} channels: every GPU sends "
      f"{2 * (GPUS - 1) / GPUS * psi / k / 1e9:.2f} GB over InfiniBand -> {ring:.3f} s")
print(f"   (one ring alone, through one network link per node: {one_ring:.3f} s)")
print(f"hierarchical:     {2 * (k - 1) + 2 * (GPUS // k - 1)} steps: every GPU sends "
      f"{2 * (GPUS // k - 1) / (GPUS // k) * psi / k / 1e9:.2f} GB over InfiniBand -> {hier:.3f} s")


def speed(slow: float, fast: float) -> str:
    """'959× faster' (or '1.3× slower' if the second time is the larger one)."""
    return f"{slow / fast:,.{0 if slow / fast >= 10 else 1}f}× faster" if slow >= fast else f"{fast / slow:,.1f}× slower"


print(f"the ring is {speed(master.total, ring)} than the first master and {speed(overlapped.total, ring)} "
      f"than the second; the hierarchical all-reduce {speed(ring, hier)} than the ring")

# %% [markdown]
# **Takeaway:** a single parameter server needs minutes per step; a ring on all of a node's links needs 0.09 s.
# The hierarchical all-reduce's 262 steps against 1,998 do not pay on one 14 GB message: it is 1.4× slower.
#
# So the answer that passes the interview: **all-reduce the gradients with a bandwidth-optimal collective**, a
# ring run as channels over every network link of a node. Fewer steps matter for small messages such as 4 MiB
# buckets: there a hierarchical or tree all-reduce wins (section 8). One parameter server would move about 14 TB in and 14 TB out
# through one network interface every step. Adding GPUs adds latency steps to a ring, not bandwidth. Sharded
# parameter servers split that one interface's load across many servers, which in effect rebuilds a
# reduce-scatter.
#
# **Next**: `exercises/01_ring_allreduce.ipynb`: write the two phases yourself, graded by `make grade`.
# Then chapter 02 builds data parallelism and [ZeRO](../docs/glossary.md#zero) on these very collectives.

