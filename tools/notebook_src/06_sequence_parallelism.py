# ci_parameters: {"CHUNKS": [1, 4], "ACCURACY_STEPS": 20, "COPY_CHUNKS": [1, 2], "COPY_SEEDS": [0], "SWEEP_LENGTHS": [8, 16, 32], "OVERLAP_SEQ": [512, 2048]}
# %% [markdown]
# # 06 · Sequence parallelism: split the sequence, keep attention exact
#
# [Self-attention](../docs/glossary.md#self-attention) compares every token with every other. Its score matrix is S × S, so its
# memory and time grow **quadratically** with the sequence length S: claim **P9**.
# **[Sequence parallelism](../docs/glossary.md#sequence-parallelism)** cuts each sequence into chunks, one per GPU. Every GPU keeps
# a whole copy of the model, as in data parallelism, but works on its own tokens of the *same* sequences.
#
# Everything in a transformer except attention works token by token, so it runs on a chunk unchanged. Attention
# is where the chunks must meet. P9 warns that "splitting a sequence into sub-sequences may reduce accuracy".
# This chapter shows four ways to meet:
#
# * **[chunk-local attention](../docs/glossary.md#chunk-local-attention)**: each GPU attends only inside its chunk. Cheap, and
#   inexact.
# * **[ring attention](../docs/glossary.md#ring-attention)**, Liu et al. 2023: key and value blocks travel around a ring of GPUs
#   and merge with the [online softmax](../docs/glossary.md#online-softmax). Exact.
# * **[all-to-all](../docs/glossary.md#all-to-all)**, [DeepSpeed Ulysses](../docs/glossary.md#ulysses), Jacobs et al. 2023: each GPU swaps
#   "my tokens, all heads" for "all tokens, my heads". Exact.
# * **[Megatron-style sequence parallelism](../docs/glossary.md#megatron-sp)**, Korthikanti et al. 2022: inside tensor
#   parallelism, the LayerNorm regions split along the sequence.

# %% tags=["parameters"]
# Parameters: small by default so the notebook runs in under a minute; raise them freely.
SEQ_LENGTHS = [256, 512, 1024]   # for the quadratic cost of attention
COPY_CHUNKS = [1, 2, 4]          # the copy task: chunks per sequence (1 = full attention)
COPY_SEEDS = [0, 1, 2]           # one model per seed and chunk count (a seed draws weights and data)
COPY_STEPS = 150                 # training steps per model (the copy is learned in about 100)
SWEEP_LENGTHS = [8, 16, 32, 64]  # sequence lengths for chunks of a fixed length
CHUNK_TOKENS = 8                 # ... that length
CHUNKS = [1, 2, 4, 8]            # the course's language: chunks per sequence (1 = full attention)
ACCURACY_STEPS = 150             # training steps per row of that table
RANKS = 4                        # simulated ranks for ring attention and Ulysses
OVERLAP_SEQ = [512, 2048, 8192]  # sequence lengths for the ring's transfers hidden behind its compute (2 ranks)
CAPACITY_MIB = 8                 # memory budget per rank for the longest sequence each method fits (2 ranks)
CAPACITY_STEP = 128              # ... searched on multiples of this many tokens

# %%
# %matplotlib inline
import time

import matplotlib.pyplot as plt
import torch

import coursekit
from coursekit import comm
from coursekit.models import LanguageData, loss_fn, tiny_transformer
from coursekit.parallel import sequence  # noqa: F401  (registers "ring_attention", "ulysses", "chunk_local")
from coursekit.experiments import (CopyData, chunk_local_losses, copy_task_losses, needs_other_chunk,
                                   per_position_loss, train_one_process)
from coursekit.parallel.sequence import (SequenceTensorParallelBlock, attention_work, chunk_bounds, chunked_attention,
                                         full_attention, megatron_sp_saved_bytes, megatron_sp_traffic, merge,
                                         ring_attention, ring_traffic, saved_bytes, shard_sequence, ulysses_attention,
                                         ulysses_traffic)
from coursekit.train import train
from coursekit.measure.verify import compare

torch.set_num_threads(1)

# %% [markdown]
# ## 1. Why attention is quadratic, measured
#
# How fast does attention's memory grow with S? We measure what autograd saves for backward in one causal call
# of the textbook `softmax(q kᵀ/√d) v`, 4 heads of 16. Then we time forward and backward.

# %% tags=["nbval-check-output"]
heads, head_dim = 4, 16
print(" S      saved by full attention   of which S×S probabilities")
for s in SEQ_LENGTHS:
    q, k, v = (torch.randn(1, heads, s, head_dim, requires_grad=True) for _ in range(3))
    with saved_bytes() as meter:
        full_attention(q, k, v, causal=True)
    print(f"{s:>5}  {meter.bytes / 2**20:>10.2f} MiB            {4 * heads * s * s / 2**20:>8.2f} MiB")

# %% [markdown]
# **Takeaway:** from S = 512 to 1,024 the saved bytes grow from 4.62 to 17.75 MiB, almost four times for twice
# the tokens: the S × S probabilities dominate.
#
# The time grows the same way, though timings on a shared machine are noisy. A linear cost would double per
# doubling of S, a quadratic one quadruple:

# %% tags=["nbval-ignore-output"]
previous = None
for s in SEQ_LENGTHS:
    q, k, v = (torch.randn(1, heads, s, head_dim, requires_grad=True) for _ in range(3))
    full_attention(q, k, v, causal=True).sum().backward()  # warm-up
    begin = time.perf_counter()
    full_attention(q, k, v, causal=True).sum().backward()
    ms = 1e3 * (time.perf_counter() - begin)
    growth = "" if previous is None else f"   ×{ms / previous[1]:.1f} for S ×{s / previous[0]:g}"
    print(f"S = {s:>5}: forward + backward {ms:7.1f} ms{growth}")
    previous = s, ms

# %% [markdown]
# P9 adds that **linear-cost alternatives exist but are less used**. Linear, sparse and sliding-window
# attention and state-space layers cost O(S), but they are different models: each replaces the exact softmax
# over every earlier token. Most large language models keep exact attention. They fit it with a fused kernel on
# one device, such as FlashAttention, and with sequence parallelism across devices. P9 also calls sequence
# parallelism **less studied**: its methods appeared from 2021 to 2023, after data, pipeline and tensor
# parallelism, and PyTorch 2.13 still keeps its own under `experimental`.
#
# ## 2. The naive split loses accuracy
#
# What if each GPU simply attends inside its own chunk? No communication at all. In one process, that is a
# block-diagonal causal mask:

# %%
coursekit.show(chunked_attention)


# %% [markdown]
# But a token can no longer see anything before its chunk, so it is a different model. To see what that costs,
# we build a task where it must cost: a **copy task**. Each sequence is 16 random tokens, then the same 16 again.
# The random first half cannot be predicted better than a guess, ln V = ln 16 = 2.77 nats. Each token of the
# second half copies the token 16 positions back.
#
# We train the course transformer with full attention and with 2 and 4 chunks, once per seed. Then we measure
# the loss at every position, on sequences no step trained on:

# %% tags=["nbval-skip"]
copy_data = CopyData(seq_len=32)
copy_losses = copy_task_losses(COPY_CHUNKS, COPY_SEEDS, steps=COPY_STEPS, seq_len=32)  # about 5 s a model
chance, first_half = copy_data.chance, copy_data.sources() < 0


def group_loss(values, mask):
    """Mean loss over the masked positions: the mean over the seeds [lowest, highest]; '—' for no position."""
    if not mask.any():
        return f"{'—':^22}"
    per_seed = values[:, mask].mean(1)
    return f"{per_seed.mean():6.3f} [{per_seed.min():.3f}, {per_seed.max():.3f}]"


print(f"loss by position group, {len(COPY_SEEDS)} seed(s): mean over the seeds [lowest, highest]; ln V = {chance:.3f}")
print("chunks  source in another chunk    copy, source in its chunk   random first half")
for n, values in copy_losses.items():
    crosses = needs_other_chunk(copy_data, n)
    within = (copy_data.sources() >= 0) & ~crosses
    print(f"{n:>6}  {group_loss(values, crosses)}     {group_loss(values, within)}      "
          f"{group_loss(values, first_half)}")

fig, ax = plt.subplots(figsize=(9, 3.6))
colours = {1: "black", 2: "tab:blue", 4: "tab:orange", 8: "tab:green"}
where = torch.arange(copy_data.seq_len - 1)
for n, values in copy_losses.items():
    label = "full attention" if n == 1 else f"chunk-local, {n} chunks (dotted: its boundaries)"
    ax.plot(where, values.median(0).values, color=colours.get(n), lw=2, label=label)
    if len(COPY_SEEDS) > 1:  # the band: lowest to highest over the seeds
        ax.fill_between(where, values.min(0).values, values.max(0).values, color=colours.get(n), alpha=0.25, lw=0)
    for (start, _), in chunk_bounds(copy_data.seq_len - 1, n)[1:]:
        ax.axvline(start - 0.5, color=colours.get(n), ls=":", lw=1.2)
ax.axhline(chance, color="grey", ls="--", lw=1, label=f"ln V = {chance:.2f}: a guess")
ax.axvspan(-0.5, copy_data.half - 1.5, color="grey", alpha=0.08)
ax.text(copy_data.half / 2 - 1, 0.4, "targets: random tokens", ha="center", color="dimgrey")
ax.text(1.5 * copy_data.half - 1, 0.4, "targets: copies of the first half", ha="center", color="dimgrey")
ax.set(xlabel="position (input token)", ylabel="loss (nats)", ylim=(-0.1, chance + 0.6),
       title=f"Copy task, {COPY_STEPS} steps, {len(COPY_SEEDS)} seed(s) (median; band: lowest to highest)")
ax.legend(loc="center left", fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** where the source lies in another chunk, chunk-local attention stays at 2.773 nats, a pure guess;
# full attention copies at 0.067.
#
# The band between seeds is far narrower than the gap, so this is P9's loss of accuracy with nothing to hide it.
#
# Does it get worse on longer sequences? Below, chunks of a fixed 8 tokens, and longer sequences, so more chunks.
# *Out of reach* is the share of predictions whose source sits in another chunk:

# %% tags=["nbval-skip"]
print(f"chunks of {CHUNK_TOKENS} tokens; mean loss over every position after {COPY_STEPS} steps (seed 0)")
print("   S  chunks  out of reach  full attention  chunk-local     gap  share × ln V")
for length in SWEEP_LENGTHS:
    task, n = CopyData(seq_len=length), max(1, length // CHUNK_TOKENS)
    share = needs_other_chunk(task, n).float().mean().item()
    full = per_position_loss(train_one_process(task, 1, steps=COPY_STEPS)[0], task, 1).mean().item()
    local = per_position_loss(train_one_process(task, n, steps=COPY_STEPS)[0], task, n).mean().item()
    print(f"{length:>4}  {n:>6}  {share:>12.0%}  {full:>14.3f}  {local:>11.3f}  {local - full:+.3f}  "
          f"{share * task.chance:>12.3f}")

# %% [markdown]
# As soon as a sequence needs two chunks, about half its predictions are out of reach, and the gap follows
# share × ln V. It does not grow further, because this task's copy distance grows with S too. P9's "especially on
# long sequences" needs data whose useful context keeps growing with length, like text; a model that learns such
# context is beyond what this laptop can train.
#
# On the course's own language, the same split barely shows. Each token there needs only the two before it:

# %% tags=["nbval-skip"]
losses = chunk_local_losses(CHUNKS, steps=ACCURACY_STEPS)
print("chunks  tokens per chunk  final loss   vs full attention")
for n, loss in losses.items():
    sizes = sorted({b - a for (a, b), in chunk_bounds(31, n)})
    print(f"{n:>6}  {'-'.join(map(str, sizes)):>16}  {loss:>10.3f}   {loss - losses[CHUNKS[0]]:+.3f}")
floor, above = LanguageData().loss_floor, [n for n in CHUNKS[1:] if losses[n] > losses[CHUNKS[0]]]
print(f"\nfull attention itself ends {losses[CHUNKS[0]] - floor:.3f} nats above the floor ({floor:.2f}) after "
      f"{ACCURACY_STEPS} steps; chunk counts above full attention: {', '.join(map(str, above)) or 'none'}")

# %% [markdown]
# Only the first two predictions of each chunk lose context, 2(n − 1) of 31. With 2 chunks the cost is lost in
# training noise; with 8 chunks of 3 or 4 tokens, about half the predictions lose context and the loss rises by
# about 0.3 nats. A real cost can hide on data whose dependencies are short.
#
# ## 3. Ring attention: exact, with the online softmax
#
# Two partial attention results over *disjoint* sets of keys merge exactly. Each part is normalised within its
# own keys and carries its log-sum-exp, `lse`. The merge rule is:
#
# $$\mathrm{lse} = \log(e^{\mathrm{lse}_1} + e^{\mathrm{lse}_2}), \qquad
#   o = e^{\mathrm{lse}_1 - \mathrm{lse}}\,o_1 + e^{\mathrm{lse}_2 - \mathrm{lse}}\,o_2 .$$
#
# Writing it is exercise 06. Here the library's `merge` combines two parts of 5 keys, one with scores 40 higher
# than the other, against plain averaging:

# %% tags=["nbval-check-output"]
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
scores = q @ k.transpose(-1, -2)
scores[..., :2] += 40.0
exact = scores.softmax(-1) @ v


def part(s, vv):
    lse = s.logsumexp(-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ vv, lse


(o1, lse1), (o2, lse2) = part(scores[..., :2], v[:, :2]), part(scores[..., 2:], v[:, 2:])
print("merge equals softmax over all keys:", torch.allclose(merge(o1, lse1, o2, lse2)[0], exact))
print("averaging the parts does:          ", torch.allclose((o1 + o2) / 2, exact))

# %% [markdown]
# On G ranks, rank r starts with its own keys and values. At every step it computes its queries against the
# block it holds, merges, and passes the block to rank r + 1. After G steps each query has met every key:

# %% tags=["nbval-check-output"]
for step in range(RANKS):
    print(f"step {step}: " + "   ".join(f"rank {r} holds rank {(r - step) % RANKS}'s block" for r in range(RANKS)))

# %% [markdown]
# Follow one query, the last of rank 1, through the 4 steps, in the form FlashAttention keeps: a running maximum
# m, a running sum l of exp(score − m), and a running weighted sum of values. Each block brings its own maximum
# and sum. When the running maximum rises, the old sum and values are rescaled by exp(m_old − m_new). The
# `merge` above does the same in one number, lse = m + log l:

# %% tags=["nbval-check-output"]
gen = torch.Generator().manual_seed(12)
tokens = 4
qs, ks, vs = (torch.randn(RANKS * tokens, 8, generator=gen, dtype=torch.float64) * 2 for _ in range(3))
query, blocks_met = 2 * tokens - 1, [1, 0, 3, 2]   # rank 1's last query; the blocks rank 1 holds, step by step
m, l, acc = torch.tensor(float("-inf"), dtype=torch.float64), 0.0, torch.zeros(8, dtype=torch.float64)
for step, owner in enumerate(blocks_met):
    scores = qs[query] @ ks[owner * tokens:(owner + 1) * tokens].T / 8 ** 0.5
    m_new = torch.maximum(m, scores.max())
    rescale = torch.exp(m - m_new)                  # 0 at the first block, 1 when the maximum did not rise
    l = l * rescale + torch.exp(scores - m_new).sum()
    acc = acc * rescale + torch.exp(scores - m_new) @ vs[owner * tokens:(owner + 1) * tokens]
    m = m_new
    print(f"step {step}: block of rank {owner}: m_blk = {scores.max():6.3f}, l_blk = {torch.exp(scores - scores.max()).sum():6.3f}"
          f"  ->  running m = {m:6.3f}, l = {l:6.3f}")
full_scores = qs[query] @ ks.T / 8 ** 0.5
print("equal to full attention over all keys:", torch.allclose(acc / l, torch.softmax(full_scores, -1) @ vs),
      torch.allclose(m + torch.log(l), full_scores.logsumexp(-1)))

# %% [markdown]
# The same code runs on real ranks and, here, on a single-process simulator. Outputs and gradients are checked
# against full attention, causal or not, on 2 to 4 ranks, with 19 tokens that no rank count divides:

# %% tags=["nbval-check-output"]
def against_full(attention, world_size, seq, causal, layout="contiguous"):
    """Largest |difference| from full attention over outputs and q, k, v gradients (float64), and the traffic."""
    gen = torch.Generator().manual_seed(1)
    q, k, v, grad = (torch.randn(2, 4, seq, 8, generator=gen, dtype=torch.float64) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = full_attention(*leaves, causal)
    (out * grad).sum().backward()
    expected = [out.detach()] + [t.grad for t in leaves]

    def run(rank, size):
        mine = [shard_sequence(t, 2, rank, size, layout).requires_grad_() for t in (q, k, v)]
        o = attention(*mine)
        (o * shard_sequence(grad, 2, rank, size, layout)).sum().backward()
        return [o.detach()] + [t.grad for t in mine]
    results, traffic = comm.simulate(run, world_size)
    worst = max((got - shard_sequence(e, 2, r, world_size, layout)).abs().max().item()
                for r, res in enumerate(results) for got, e in zip(res, expected))
    return worst, traffic


for world_size in range(2, RANKS + 1):
    for causal in (True, False):
        for layout in ("contiguous", "zigzag"):
            worst, _ = against_full(lambda q, k, v: ring_attention(q, k, v, causal, layout, 19), world_size, 19,
                                    causal, layout)
            print(f"G={world_size} causal={causal!s:<5} {layout:<10}  equal to full attention: {worst < 1e-12}")

# %% [markdown]
# **Takeaway:** the ring gives exactly full attention's outputs and gradients, at every G, layout and mask.
#
# ### Causal masks and load balance: zig-zag
#
# With a causal mask, a block entirely in a query's future is skipped. Cut contiguously, rank 0 skips almost
# everything while the last rank skips nothing, and the ring waits for the slowest.
# [Zig-zag](../docs/glossary.md#zig-zag) cuts the sequence into 2G chunks and gives rank r chunks r and 2G − 1 − r, one early and
# one late. Score elements each rank computes, S = 64, G = 4:

# %% tags=["nbval-check-output"]
def work_per_rank(layout, seq=64):
    """Each rank's (score elements, per ring step): the chunk pairs the ring's forward walks, counted."""
    counts = [attention_work(seq, rank, RANKS, layout, causal=True) for rank in range(RANKS)]
    return [(work.score_elements, work.per_step) for work in counts]


for layout in ("contiguous", "zigzag"):
    print(f"{layout:<10} chunks {[c for c in chunk_bounds(64, RANKS, layout)]}")
    for rank, (total, per_step) in enumerate(work_per_rank(layout)):
        print(f"   rank {rank}: {total:>5} score elements   per ring step {per_step}")

# %% [markdown]
# Contiguous, the last rank does 4 times the first's work; zig-zag, every rank does the same. Right, the bytes
# that backward keeps as S grows:

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
for offset, layout in ((-0.2, "contiguous"), (0.2, "zigzag")):
    totals = [total for total, _ in work_per_rank(layout)]
    left.bar([r + offset for r in range(RANKS)], totals, width=0.4, label=layout)
left.set(xlabel="rank", ylabel="score elements computed", title=f"causal ring attention, S = 64, G = {RANKS}",
         xticks=range(RANKS))
left.legend()
saved = {"full attention": [], "ring attention (blockwise)": []}
for s in SEQ_LENGTHS:
    q, k, v = (torch.randn(1, heads, s, head_dim, requires_grad=True) for _ in range(3))
    for name, fn in (("full attention", full_attention), ("ring attention (blockwise)", ring_attention)):
        with saved_bytes() as meter:
            fn(q, k, v, True)
        saved[name].append(meter.bytes / 2**20)
for name, values in saved.items():
    right.plot(SEQ_LENGTHS, values, "o-", label=name)
right.set(xlabel="sequence length S", ylabel="saved for backward (MiB)", title="what backward keeps")
right.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** zig-zag gives every rank the same work, and the ring's backward keeps bytes that grow linearly
# in S, because it [recomputes](../docs/glossary.md#activation-recomputation) the score blocks.
#
# ### The ring's rotation, round by round
#
# The figure runs the library's `ring_attention` on 4 ranks and 16 tokens, causal, zig-zag, at round 2.
# Left: the blocks met so far, in the colour of the rank that computed them; hatched blocks were skipped. Middle:
# what each rank holds this round. Right: query 7's running max and sum against full attention's.
#
# <details><summary>What round 2 shows</summary>
#
# In round 2 rank 3 holds rank 1's block, chunks 1 and 6. Its query chunk 3 meets chunk 1 and skips chunk 6, its
# future. Query 7's max rises from −0.11 to 5.76, so its old sum is rescaled by e^(−0.11 − 5.76) and l falls
# from 2.92 to 1.02. So far every rank has computed 28 score elements with zig-zag; contiguous gives 16, 32,
# 48, 48.
# </details>

# %%
from coursekit.viz.ring_attention import draw_rounds
from coursekit.widgets.ring_attention import record_rounds, ring_attention_explorer

_ = draw_rounds(record_rounds(4, 16, True, "zigzag"), 2, 7, other=record_rounds(4, 16, True, "contiguous"))
plt.show()

# %% [markdown]
# The widget below draws the same figure for any G, length, mask, layout, round and query. Try contiguous: rank 0
# skips everything after round 0 while rank 3 computes in every round.

# %%
ring_attention_explorer(world_size=4, seq_len=16, causal=True, layout="zigzag", round_=2, query=7)

# %% [markdown]
# ### Backward, blockwise too
#
# The ring's backward saves no S × S matrix either. It recomputes each block's probabilities from the saved
# log-sum-exp and sends the key and value blocks around once more, each with its gradients. Elements sent per
# call, with n the whole sequence's keys:

# %% tags=["nbval-check-output"]
seq = 16
n = 2 * 4 * seq * 8
for world_size in range(2, RANKS + 1):
    _, traffic = against_full(lambda q, k, v: ring_attention(q, k, v, True, "zigzag", seq), world_size, seq, True,
                              "zigzag")
    forward = sum(t.numel for t in traffic.payload if t.phase == "ring kv")
    backward = traffic.total - forward
    print(f"G={world_size}: forward {forward:>6} (formula 2(G-1)n = {ring_traffic(n, world_size)['forward']:>6}), "
          f"backward {backward:>6} (formula (4G-2)n = {ring_traffic(n, world_size)['backward']:>6}); "
          f"all to the right-hand neighbour: {all(t.dst == (t.src + 1) % world_size for t in traffic.payload)}")

# %% [markdown]
# **Takeaway:** forward sends 2(G − 1)·n elements and backward (4G − 2)·n, always to the right-hand neighbour.
#
# ## 4. All-to-all: DeepSpeed Ulysses
#
# Ulysses re-shards instead of circulating. One all-to-all turns each rank's tokens with all heads into all
# tokens with a share of the heads. Ordinary attention then runs on whole sequences. A second all-to-all turns
# the output back:

# %%
coursekit.show(ulysses_attention)


# %% [markdown]
# Each all-to-all keeps 1/G of the data and sends the rest. On 2 and 4 ranks, against full attention; then on 3,
# which 4 heads cannot divide:

# %% tags=["nbval-check-output"]
for world_size in (2, 4):
    worst, traffic = against_full(lambda q, k, v: ulysses_attention(q, k, v, True, 19), world_size, 19, True)
    formula = ulysses_traffic(2, 19, 4 * 8, world_size)
    print(f"G={world_size}: equal to full attention: {worst < 1e-12}; elements sent {traffic.total} "
          f"(formula {formula['forward'] + formula['backward']})")
try:
    against_full(lambda q, k, v: ulysses_attention(q, k, v, True, 18), 3, 18, True)
except comm.SimulatorError as error:
    print(str(error).strip().splitlines()[-1])

# %% [markdown]
# **Which sends less per rank, as G grows?** Let L = S/G be the tokens per rank and h the hidden width. Per call,
# forward and backward, each rank sends:
#
# * ring attention: (6G − 4) · b·L·h, since its key and value block visits every rank;
# * Ulysses: 8(G − 1)/G · b·L·h, four tensors each way, of which it keeps 1/G.
#
# Below, both against G, with L = 512 tokens fixed, and counted on simulated ranks at G = 2, 3 and 4:

# %%
L_tokens, h_width, a_heads = 512, 64, 4
gs = [2, 3, 4, 8, 16, 32, 64]


def per_rank(method, g, seq, batch=1, width=h_width):
    if method == "ring":
        t = ring_traffic(batch * seq * width, g)
    else:
        t = ulysses_traffic(batch, seq, width, g)
    return (t["forward"] + t["backward"]) / g


fig, ax = plt.subplots(figsize=(6.4, 3.4))
for method, marker in (("ring", "o"), ("ulysses", "s")):
    ax.plot(gs, [per_rank(method, g, g * L_tokens) / 1e6 for g in gs], marker=marker, ms=4,
            label="ring attention" if method == "ring" else "all-to-all (Ulysses)")
counted = {}
for g in (2, 3, 4):
    seq = 12 * g
    for method, fn in (("ring", lambda q, k, v, seq=seq: ring_attention(q, k, v, True, "zigzag", seq)),
                       ("ulysses", lambda q, k, v, seq=seq: ulysses_attention(q, k, v, True, seq))):
        if method == "ulysses" and a_heads % g:
            continue
        _, traffic = against_full(fn, g, seq, True, "zigzag" if method == "ring" else "contiguous")
        counted[method, g] = traffic.total / g
        ax.plot([g], [traffic.total / g / (2 * seq * 32) * L_tokens * g * h_width / 1e6], "kx", ms=7)
ax.plot([], [], "kx", label="counted on simulated ranks, scaled")
ax.set_xscale("log", base=2)
ax.minorticks_off()
ax.set_xticks(gs, [str(g) for g in gs])
ax.set(xlabel="ranks G (S = G × 512 tokens)", ylabel="elements sent per rank (millions)",
       title="per attention call, forward + backward, b = 1, h = 64")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
for (method, g), value in counted.items():
    print(f"{method:<8} G={g}: counted {value:,.0f} elements per rank, formula "
          f"{per_rank(method, g, 12 * g, batch=2, width=32):,.0f}")

# %% [markdown]
# **Takeaway:** the ring's volume per rank grows with G; Ulysses' stays nearly flat.
#
# On bandwidth alone Ulysses wins. The ring's case is elsewhere. Its transfers go to a neighbour while the block
# in hand is computed, so they can hide. It works for any number of heads and any G. Ulysses needs the heads
# divisible by G, and each all-to-all crosses every rank at once. So the usual choice is Ulysses inside a node
# and the ring across nodes.
#
# ## 5. Memory per rank, and when the ring's transfers hide
#
# What does each rank keep? The whole course transformer on 32 tokens, every rank running its own tokens:
# bytes saved for backward per rank, parameters excluded.

# %% tags=["nbval-check-output"]
from coursekit.parallel.sequence import positions, sequence_forward

seq = 32
x = torch.randint(16, (2, seq), generator=torch.Generator().manual_seed(0))
for name, layout, attend in (
        ("ring, zig-zag", "zigzag", lambda q, k, v: ring_attention(q, k, v, True, "zigzag", seq)),
        ("all-to-all", "contiguous", lambda q, k, v: ulysses_attention(q, k, v, True, seq))):
    row = []
    for world_size in (1, 2, 4):
        def run(rank, size):
            model = tiny_transformer(seed=0)
            with saved_bytes(model.parameters()) as meter:
                sequence_forward(model, shard_sequence(x, 1, rank, size, layout), positions(seq, rank, size, layout),
                                 attend)
            return meter.bytes
        row.append(max(comm.simulate(run, world_size).results))
    print(f"{name:<14} " + "   ".join(f"G={g}: {b:>7} bytes" for g, b in zip((1, 2, 4), row)))

# %% [markdown]
# Exactly half at G = 2 and a quarter at G = 4. But what must fit is the **[peak](../docs/glossary.md#peak-memory)**, not only what backward keeps.
# `capacity_table` measures the peak of one causal call, forward and backward, on each rank exactly. It then
# finds the longest sequence each method fits in a budget per rank, every candidate measured:

# %% tags=["nbval-check-output"]
from coursekit.experiments import capacity_table

table = capacity_table(int(CAPACITY_MIB * 2**20), world_size=2, step=CAPACITY_STEP)
print(f"longest S (a multiple of {CAPACITY_STEP}) whose peak per rank stays within {CAPACITY_MIB:g} MiB: one causal "
      f"call, batch 1, 4 heads of 16, fp32, 2 ranks (full attention: 1)")
print(f"{'method':<16}{'longest S':>10}{'its peak':>13}{'S + step':>10}{'its peak':>13}{'lengths run':>13}")
for method, (longest, measured) in table.items():
    over = longest + CAPACITY_STEP
    print(f"{method:<16}{longest:>10,}{measured.get(longest, 0) / 2**20:>9.2f} MiB{over:>10,}"
          f"{measured[over] / 2**20:>9.2f} MiB{len(measured):>13}")

# %% [markdown]
# In the same 8 MiB per rank, full attention fits 384 tokens, the textbook ring 1,152, the fused ring 4,224
# and Ulysses 5,888.
#
# The textbook ring still holds a score block, (S/2G)² per head, quadratic again. The fused ring computes each
# block with torch's flash kernel and keeps no score block. Ulysses runs the fused kernel on whole sequences of
# its heads.
#
# **When do the ring's transfers hide?** At each step a rank computes its L queries against the block it holds,
# 4·L²·h operations, while the next block travels, 2·L·h numbers. With F operations per second, a link of B
# bytes per second and s bytes per number, the transfer hides when
#
# $$L \;\ge\; \frac{s\,F}{2\,B}.$$
#
# Compute grows as L², the transfer as L, so long enough chunks always hide it. Measured on 2 real ranks:

# %% tags=["nbval-ignore-output"]
from coursekit.experiments import hidden_share

print("    S   chunk L   forward    transfers alone   waited after computing   hidden")
shares = {}
for seq in OVERLAP_SEQ:
    ranks = coursekit.launch(hidden_share, 2, seq, 4, 16, 9)
    mean = {key: sum(r[key] for r in ranks) / len(ranks) for key in ranks[0]}
    shares[seq // 2] = mean["hidden"]
    print(f"{seq:>5}   {seq // 2:>7}   {mean['forward'] * 1e3:6.2f} ms   {mean['transfer'] * 1e3:9.2f} ms   "
          f"{mean['waited'] * 1e3:16.2f} ms   {mean['hidden']:6.0%}")
shortest, longest = min(shares), max(shares)
print(f"chunks of {longest} tokens hid {shares[longest]:.0%} of their transfers, chunks of {shortest} "
      f"{shares[shortest]:.0%}")
flops, nvlink, infiniband = 989e12, 450e9, 50e9  # assumed: H100 dense bf16 peak; NVLink and InfiniBand, each way
print(f"\nH100 (assumed {flops / 1e12:.0f} TFLOP/s bf16), s = 2 bytes: L ≥ {2 * flops / (2 * nvlink):,.0f} tokens a "
      f"rank over NVLink ({nvlink / 1e9:.0f} GB/s), L ≥ {2 * flops / (2 * infiniband):,.0f} over InfiniBand "
      f"({infiniband / 1e9:.0f} GB/s)")

# %% [markdown]
# **Takeaway:** the long chunks hide their transfers: here, chunks of 4,096 tokens hid almost all of theirs.
#
# On one CPU core compute is slow and loopback is fast, so the crossing comes early. On a GPU it is the other
# way round: a chunk must hold about 2,200 tokens a rank over NVLink, and 20,000 across nodes. That is why ring
# attention is a method for long sequences.
#
# <details><summary>How this was measured</summary>
#
# One causal forward with the fused kernel, zig-zag, 4 heads of 16: the transfers alone, the whole forward, and
# how long the forward still waited for a block after computing the one it held, the mean over the 2 ranks of
# their medians. At short chunks a step's compute is a fraction of a millisecond, and the wait is mostly the
# other rank's timing on 2 shared cores, so that share varies from run to run.
# </details>
#
# ## 6. Training equals one process
#
# In the training loop, a sequence-parallel strategy gives every rank the whole batch and a whole copy of the
# model. Each rank computes the loss of its own tokens only, divided by all b·S tokens, so the ranks' gradients
# sum to the batch's. No logits travel. Three SGD steps on 2 real ranks, against one process:

# %% tags=["nbval-check-output"]
CONFIG = dict(model="transformer", steps=3, global_batch=5, optimizer="sgd", lr=0.1)


def train_all(rank, world_size):
    out = {}
    for name, strategy, options in (("ring attention (zig-zag)", "ring_attention", {"layout": "zigzag"}),
                                    ("all-to-all (Ulysses)", "ulysses", {}), ("chunk-local", "chunk_local", {})):
        result = train(rank, world_size, strategy, **CONFIG, **options)
        out[name] = result["records"], result["memory"]["params"]  # bytes of parameters this rank holds
    return out


single = train(0, 1, "single", **CONFIG)
reference = single["records"]
runs = coursekit.launch(train_all, 2)
for name in runs[0]:
    same = compare(reference, [runs[0][name][0]]).ok
    note = " (as expected: chunk-local attention is a different model)" if name == "chunk-local" and not same else ""
    print(f"{name:<26} same outputs, loss, gradients and parameters as one process: {same}{note}")
held = {runs[r][name][1] for r in range(2) for name in runs[r]}
print(f"parameter bytes held per rank, every strategy, both ranks: {', '.join(f'{b:,}' for b in sorted(held))} "
      f"(one process: {single['memory']['params']:,}): "
      + ("every rank holds the whole model, as in data parallelism" if held == {single["memory"]["params"]}
         else "not the whole model on every rank"))

# %% [markdown]
# **Takeaway:** ring attention and Ulysses train exactly like one process, with the whole model on each rank;
# chunk-local attention does not, because it is a different model.
#
# ## 7. Megatron-style sequence parallelism, beside tensor parallelism
#
# Chapter 05's tensor parallelism runs the LayerNorms and residual adds on the whole activations, on every rank.
# Korthikanti et al. split those regions along the sequence. The all-reduce after a row-parallel layer becomes a
# **reduce-scatter**: each rank gets the sum for its own tokens. An **all-gather** rebuilds the whole input
# before the next column-parallel layer. A ring all-reduce *is* a reduce-scatter plus an all-gather, so forward
# sends the same. One block, t = 2 and 4, against the dense block:

# %% tags=["nbval-check-output"]
from coursekit.collectives import ring_all_reduce

dense = tiny_transformer(seed=0).blocks[0]
gen = torch.Generator().manual_seed(0)
xb, gb = torch.randn(2, 31, 64, generator=gen), torch.randn(2, 31, 64, generator=gen)
xd = xb.clone().requires_grad_()
(dense(xd) * gb).sum().backward()
for t in (2, 4):
    def run(rank, size):
        block = SequenceTensorParallelBlock(tiny_transformer(seed=0).blocks[0], seq_len=31)
        mine = shard_sequence(xb, 1, rank, size).requires_grad_()
        (block(mine) * shard_sequence(gb, 1, rank, size)).sum().backward()
        return (mine.grad - shard_sequence(xd.grad, 1, rank, size)).abs().max().item()
    diffs, traffic = comm.simulate(run, t)
    ring = comm.simulate(lambda r, n: ring_all_reduce(torch.ones(2 * 31 * 64)), t).traffic.total
    back = sum(x.numel for x in traffic.payload if "backward" in x.phase)
    fwd = traffic.total - back
    print(f"t={t}: input gradient equal to the dense block's: {max(diffs) < 1e-5}; elements sent forward "
          f"{fwd} {'=' if fwd == 2 * ring else '≠'} 2 ring all-reduces of b·s·h ({2 * ring}), "
          f"backward {back} {'=' if back == 3 * ring else '≠'} 3 ({3 * ring}); "
          f"formula {megatron_sp_traffic(2, 31, 64, t)}")

# %% [markdown]
# Backward adds two all-gathers per block, the third all-reduce's worth above. The column-parallel layers, qkv and
# fc, keep only their rank's tokens, and gather them again for their weight gradients.
#
# One more all-reduce comes once a step, over the tensor group. The LayerNorms' weights are whole on every rank,
# but each rank saw only its own tokens, so their gradients are summed. Megatron-LM does the same in
# `finalize_model_grads`, and so does the course's trainer.
#
# What each rank keeps for backward, on 32 tokens:

# %% tags=["nbval-check-output"]
x32 = torch.randn(2, 32, 64, generator=gen)
with saved_bytes(dense.parameters()) as meter:
    dense(x32.clone().requires_grad_())
print(f"dense block: {meter.bytes:,} bytes")
for t in (1, 2, 4):
    def held(rank, size):
        block = SequenceTensorParallelBlock(tiny_transformer(seed=0).blocks[0])
        with saved_bytes(block.parameters()) as m:
            block(shard_sequence(x32, 1, rank, size).requires_grad_())
        return m.bytes
    per_rank = comm.simulate(held, t).results
    print(f"t={t}: {per_rank[0]:,} bytes on each rank; every rank exactly dense / t: "
          f"{per_rank == [meter.bytes // t] * t and meter.bytes % t == 0}; "
          f"formula {megatron_sp_saved_bytes(2, 32, 64, 4, 256, t):,}")

# %% [markdown]
# Every rank keeps exactly 1/t. Plain tensor parallelism at the same t keeps the LayerNorm regions whole. Below,
# both against the course's count and Korthikanti et al.'s Table 2, evaluated at this block's sizes:

# %% tags=["nbval-check-output"]
from coursekit.parallel.tensor import ParallelBlock, korthikanti_table2_bytes, tensor_parallel_saved_bytes


def plain_tp_held(rank, size):  # chapter 05's block: norms replicated; its all-reduces need real ranks
    block = ParallelBlock(tiny_transformer(seed=0).blocks[0])
    with saved_bytes(block.parameters()) as m:
        block(x32.clone().requires_grad_())
    return m.bytes


sizes, d_ff, tokens = (2, 32, 64, 4), 256, 2 * 32  # b, S, h, a of the block above
table2 = {t: korthikanti_table2_bytes(*sizes, t) for t in (1, 2, 4)}
rows = [("dense", [meter.bytes],  # meter: the dense block, measured above
         tensor_parallel_saved_bytes(*sizes, d_ff, 1), table2[1]["dense"])]
rows += [(f"TP, t={t}", coursekit.launch(plain_tp_held, t), tensor_parallel_saved_bytes(*sizes, d_ff, t),
          table2[t]["tensor"]) for t in (2, 4)]
rows += [(f"TP + SP, t={t}", comm.simulate(held, t).results, megatron_sp_saved_bytes(*sizes, d_ff, t),
          table2[t]["sequence_tensor"]) for t in (2, 4)]
print(f"{'one block,':<14}{'measured':>10}{'elements':>10}{'course':>10}{'share':>10}{'Table 2':>10}{'share':>10}")
print(f"{'per rank':<14}{'bytes':>10}{'a token':>10}{'formula':>10}{'of dense':>10}{'(paper)':>10}{'of dense':>10}")
for name, measured, course, paper in rows:  # measured: every rank's bytes
    print(f"{name:<14}{measured[0]:>10,}{measured[0] // (4 * tokens):>10}{course:>10,}{course / rows[0][2]:>10.3f}"
          f"{paper:>10,}{paper / rows[0][3]:>10.3f}{'' if len(set(measured)) == 1 else '  (ranks differ)'}")

# %% [markdown]
# Plain tensor parallelism's share falls only to 0.626 and 0.439; with sequence parallelism it is exactly 1/t.
# Table 2 has the same shape with other bytes: it counts 16-bit values, dropout masks and the softmax scores.
#
# The peak adds what is alive at the worst moment, such as the gathered inputs:

# %% tags=["nbval-check-output"]
from coursekit.experiments import block_memory

peaks = block_memory(2, 32, sizes=(2, 4))
course = {("dense", 1): tensor_parallel_saved_bytes(*sizes, d_ff, 1)}
course |= {("tensor", t): tensor_parallel_saved_bytes(*sizes, d_ff, t) for t in (2, 4)}
course |= {("sequence_tensor", t): megatron_sp_saved_bytes(*sizes, d_ff, t) for t in (2, 4)}
names = {"dense": "dense", "tensor": "TP", "sequence_tensor": "TP + SP"}
print(f"one block, bytes per rank (every rank the same: {all(r == runs[0] for runs in peaks.values() for r in runs)})")
print(f"{'':<14}{'plateau':>10}{'course':>10}{'Table 2':>10}{'peak':>10}{'peak −':>10}{'born in':>10}")
print(f"{'':<14}{'measured':>10}{'count':>10}{'(paper)':>10}{'measured':>10}{'plateau':>10}{'backward':>10}")
for (kind, t), runs in sorted(peaks.items(), key=lambda kv: (kv[0][1], kv[0][0] != "tensor")):
    run, paper = runs[0], table2[t][kind]
    print(f"{names[kind] + ('' if t == 1 else f', t={t}'):<14}{run.plateau:>10,}{course[kind, t]:>10,}{paper:>10,}"
          f"{run.peak:>10,}{run.peak - run.plateau:>10,}{run.transient:>10,}")
for t in (2, 4):
    sp, tp = peaks["sequence_tensor", t][0], peaks["tensor", t][0]
    print(f"t={t}: TP + SP against plain TP, plateau {sp.plateau / tp.plateau:.2f}, peak {sp.peak / tp.peak:.2f}")

# %% [markdown]
# **Takeaway:** against plain tensor parallelism at t = 4, sequence parallelism cuts the plateau to 0.57 but the
# peak only to 0.81, because the gathered tensors are whole.
#
# <details><summary>Where each peak comes from</summary>
#
# The dense block and plain TP at t = 2 peak at the first gradient of backward, entering the MLP's hidden layer,
# made while everything the forward kept is alive. At t = 4, where d_ff/t = h, a forward moment of the same size
# comes first. With sequence parallelism the output's gradient is all-gathered whole beside that hidden
# gradient; at t = 4, fc's input is gathered again beside its input's gradient before the reduce-scatter.
# </details>
#
# The whole transformer this way is the strategy `"sequence_tensor"`. Three SGD steps on 2 ranks:

# %% tags=["nbval-check-output"]
def train_sp_tp(rank, world_size):
    return train(rank, world_size, "sequence_tensor", **CONFIG)["records"]


runs = coursekit.launch(train_sp_tp, 2)
print("Megatron-style SP x TP, t=2: same outputs, loss, gradients and parameters as one process:",
      compare(reference, [runs[0]]).ok and compare(reference, runs, check_output=False).ok)

# %% [markdown]
# ## 8. Sequence × data on a mesh
#
# Sequence parallelism combines with data parallelism (P9). On `Mesh({"dp": 2, "sp": 2})`, the `dp`
# [axis](../docs/glossary.md#axis) cuts the batch of 5 into 3 and 2, and the 2 ranks of each slice split every sequence with
# zig-zag ring attention. The gradients are summed over `sp` and averaged over `dp` in **one** ring all-reduce
# over all four ranks, as torchtitan flattens its data and context axes. Every message is counted and assigned
# to the axes it crossed:

# %% tags=["nbval-check-output"]
from coursekit.parallel.sequence import sequence_data_traffic, traffic_per_axis
from coursekit.comm.traffic import Traffic


def train_sp_dp(rank, world_size):
    result = train(rank, world_size, "sequence_data", sp=2, count_traffic=True, **CONFIG)
    return result["records"], result["traffic"], result["numel"]


runs = coursekit.launch(train_sp_dp, 4)
records = [r[0] for r in runs]
print("sequence x data, 2 x 2: same outputs, loss, gradients and parameters as one process:",
      compare(reference, [records[0], records[2]]).ok and compare(reference, records, check_output=False).ok)
traffic = Traffic.merge([r[1] for r in runs])
per_axis = traffic_per_axis(traffic, {"dp": 2, "sp": 2})
formula = sequence_data_traffic(5, 31, 64, 2, runs[0][2], 2, 2)


def axis_of(x):  # rank = 2·dp + sp: same dp coordinate -> along sp; same sp coordinate -> along dp
    return "sp" if x.src // 2 == x.dst // 2 else "dp" if x.src % 2 == x.dst % 2 else "dp×sp"


print(f"{'axis':<6}{'elements sent, 3 steps':>24}{'formula':>12}   what travelled")
for axis in ("sp", "dp", "dp×sp"):
    phases = sorted({x.phase for x in traffic.payload if axis_of(x) == axis})
    print(f"{axis:<6}{per_axis[axis]:>24,}{CONFIG['steps'] * formula[axis]:>12,}   {', '.join(phases) or '-'}")

# %% [markdown]
# **Takeaway:** sequence × data trains like one process, and nothing travels along `dp` alone.
#
# Along `sp` travel ring attention's blocks and part of the gradients' ring. The ring's other links join one
# slice to the other, so they cross both axes. One ring over the 4 ranks sends 6Ψ elements a step; reducing
# twice, over `sp` and then over `dp`, would send 8Ψ.
#
# ## 9. The same thing in production
#
# PyTorch's API is `torch.distributed.tensor.experimental.context_parallel`. It shards the given buffers along
# their sequence dimension, reordered for load balance, and runs `scaled_dot_product_attention` blockwise over
# the ranks with the GPU kernels, merging by log-sum-exp as here. On CPU with torch 2.13.0 it does not run: the
# CPU attention kernel has no sharding rule. Its own message:

# %% tags=["nbval-ignore-output"]
def context_parallel_on_cpu(rank, world_size):
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cpu", (world_size,))
    q, k, v = (torch.randn(1, 4, 16, 8) for _ in range(3))
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return "ran"
    except NotImplementedError as error:
        return f"NotImplementedError: {error}"


print(coursekit.launch(context_parallel_on_cpu, 2)[0])

# %% [markdown]
# That is why this chapter builds its own: the same code runs on a laptop, in the simulator and on GPUs.
#
# **Exercise** `exercises/06_ring_attention.ipynb`: write the merge, the pass that carries the gradients back,
# and the ring loop.
