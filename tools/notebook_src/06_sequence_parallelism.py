# ci_parameters: {"CHUNKS": [1, 4], "ACCURACY_STEPS": 20, "SEQ_LENGTHS": [128, 256, 512], "COPY_CHUNKS": [1, 2], "COPY_SEEDS": [0], "SWEEP_LENGTHS": [8, 16, 32], "OVERLAP_SEQ": [512, 2048], "CAPACITY_MIB": 2}
# %% [markdown]
# # 06 · Sequence parallelism: split the sequence, keep attention exact
#
# [Self-attention](../docs/glossary.md#self-attention) compares every token with every other: its score matrix is S×S, so its memory and time
# grow **quadratically** with the sequence length S (claim **P9**). [Sequence parallelism](../docs/glossary.md#sequence-parallelism) cuts the input
# sequence into chunks, one per GPU. Like data parallelism, every GPU holds a full copy of the model (except
# in the Megatron-style variant below, which runs inside tensor parallelism and shards the weights); unlike
# it, the GPUs work on the *same* sequences, each on its own tokens. Everything in a transformer except
# attention works token by token, so it runs on the local chunk unchanged. Attention is where the chunks
# must meet, and P9 warns that, depending on how that is done, "splitting a sequence into sub-sequences may
# reduce accuracy". This chapter shows both sides:
#
# * **[chunk-local attention](../docs/glossary.md#chunk-local-attention)**: each GPU attends only inside its chunk — cheap, and it loses accuracy
#   wherever a prediction needs a token in another chunk (a copy task shows how much);
# * **[ring attention](../docs/glossary.md#ring-attention)** (Liu et al. 2023, "Ring Attention with Blockwise Transformers"): key/value blocks
#   travel around a ring of GPUs and are combined with the [online softmax](../docs/glossary.md#online-softmax) — exact;
# * **[all-to-all](../docs/glossary.md#all-to-all)** (Jacobs et al. 2023, "[DeepSpeed Ulysses](../docs/glossary.md#ulysses)"): re-shard from "my tokens, all heads" to
#   "all tokens, my heads" for attention and back — exact;
# * **[Megatron-style sequence parallelism](../docs/glossary.md#megatron-sp)** (Korthikanti et al. 2022): inside tensor parallelism, the
#   LayerNorm regions split along the sequence — the same forward traffic, 1/t of the activations.

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
from coursekit.parallel.sequence import (SequenceTensorParallelBlock, attention_work, chunk_bounds, full_attention,
                                         megatron_sp_saved_bytes, megatron_sp_traffic, merge, ring_attention,
                                         ring_traffic, saved_bytes, shard_sequence, ulysses_attention, ulysses_traffic)
from coursekit.train import train
from coursekit.measure.verify import compare

torch.set_num_threads(1)

# %% [markdown]
# ## 1. Why attention is quadratic, measured
#
# One causal attention call, 4 heads of 16 dimensions. We measure what autograd **saves for backward**
# (every saved tensor, each storage once) for the textbook `softmax(q kᵀ/√d) v`, and time forward +
# backward. The saved bytes are q, k, v, the S×S probabilities of every head and the S×S boolean causal mask
# (one byte per element).

# %% tags=["nbval-check-output"]
heads, head_dim = 4, 16
print(" S      saved by full attention   of which S×S probabilities")
for s in SEQ_LENGTHS:
    q, k, v = (torch.randn(1, heads, s, head_dim, requires_grad=True) for _ in range(3))
    with saved_bytes() as meter:
        full_attention(q, k, v, causal=True)
    print(f"{s:>5}  {meter.bytes / 2**20:>10.2f} MiB            {4 * heads * s * s / 2**20:>8.2f} MiB")

# %% [markdown]
# Each doubling of S multiplies the saved bytes by almost four: the probabilities dominate. The time of
# forward + backward, after one warm-up call, and its growth from the previous length (a cost linear in S
# would double per doubling, a quadratic one quadruple; these timings vary from run to run on a shared
# machine):

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
# P9 adds that **linear-cost alternatives exist but are less used**. Linear attention, sparse and sliding-window
# attention, and state-space or recurrent layers cost O(S) (or O(S·w) for a window w) instead of O(S²), but
# they are different models: each replaces the exact softmax over every earlier token by an approximation or
# another way of mixing tokens, so a model trained with one is not the model trained with full attention, and
# what they give up shows on tasks that need an exact lookup far back (the copy task of the next section is
# one). Most large language models keep exact attention, and make it fit with a fused kernel on one device
# (torch's `scaled_dot_product_attention`, FlashAttention) and sequence parallelism across devices — this
# chapter's subject.
#
# P9 also calls sequence parallelism **less studied**. It came after data, pipeline and tensor parallelism:
# the methods of this chapter were published from 2021 to 2023 (Li et al. 2021, "Sequence Parallelism: Long
# Sequence Training from System Perspective"; Korthikanti et al. 2022;
# Jacobs et al. 2023; Liu et al. 2023), and PyTorch 2.13, installed here, still keeps its own under
# `torch.distributed.tensor.experimental` (the last section imports it from there).
#
# ## 2. The naive split loses accuracy — where a prediction needs another chunk
#
# Cut every sequence into chunks and let each GPU attend only within its own chunk: no communication at all.
# But it is no longer the same model: a token cannot see anything before its chunk. Whether that costs
# accuracy depends on what the predictions need, so we first build a task where it must: a **copy task**
# (`CopyData`). Each sequence is 16 random tokens followed by the same 16 again. Nothing can predict the
# random first half better than a uniform guess, ln V = ln 16 = 2.77 nats; every token of the second half is
# a copy of the token 16 positions earlier. Full attention can learn to look back 16 positions. A chunk-local
# model over 2 chunks cannot, from the first position of the second chunk on: the source lies in the other
# chunk, and a uniformly random token one cannot see is worth ln V to anyone.
#
# We train the course transformer (Adam, `COPY_STEPS` steps, one process, the block-diagonal mask of
# `chunked_attention(n)`) with full attention and with 2 and 4 chunks, once per seed (a seed draws the weights
# and the data), and measure the loss at **every position** on 256 sequences no step has trained on.

# %%
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
# Read the curves left to right. On the random first half every model sits at ln V: no attention helps there.
# At the first copy (position 15, whose source is position 0) full attention's curve falls to almost zero and
# stays there: it learned to look 16 positions back. The chunk-local curves stay at ln V from each chunk
# boundary on (the dotted lines; with 2 and 4 chunks the two curves lie on top of each other): there the
# source is in an earlier chunk. With 2 chunks
# one copy has its source in its own chunk (position 15, in chunk 0 with position 0); the middle column says how
# far the model got on that single position. This is P9's "splitting a sequence into sub-sequences may reduce
# accuracy", with nothing to hide it: the gap on the positions whose source lies in another chunk is close to
# the whole ln V, far beyond the spread between seeds (the band). The tests assert at least ½·ln V on the
# model trained at CI size (`tests/test_parallel_sequence_copy.py`), and that ring attention, its zig-zag layout
# and Ulysses train on this task exactly as full attention does.
#
# **Longer sequences, chunks of a fixed length.** The memory per GPU fixes the chunk length; a longer
# sequence then needs more chunks. Here chunks of `CHUNK_TOKENS` tokens, sequences of `SWEEP_LENGTHS` tokens,
# one seed, the loss averaged over all positions; *out of reach* is the share of predictions whose source is
# in another chunk (`needs_other_chunk`), and *share × ln V* what those alone would cost a model that guesses
# them and gets the rest right.

# %%
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
# A sequence that fits in one chunk loses nothing (its row's gap is zero). As soon as it needs two, about half
# of its predictions are out of reach and the gap follows share × ln V. On this task it does not grow further
# with S: the copy distance is half the sequence, so it grows with S too, and a copy is out of reach as soon as
# it is longer than a chunk. That is as far as this run shows P9's "especially on long sequences": the longer
# the sequence at a fixed chunk length, the more chunks, and a chunk-local token still sees at most
# `CHUNK_TOKENS` − 1 tokens back while full attention sees all S − 1. Whether that costs more on longer
# sequences depends on how far the data's dependencies reach: on text, whose dependencies reach further the more
# context there is, it does; on this task, once they reach beyond a chunk, it stays at about half.
#
# **The course's own language.** The same experiment on `LanguageData` (the data of every other chapter),
# with 1 (full attention), 2, 4, … chunks per sequence of 31 tokens, `ACCURACY_STEPS` steps, one seed, the
# final loss the mean of the last 10 steps (the best possible, `LanguageData.loss_floor`, under the table):

# %%
losses = chunk_local_losses(CHUNKS, steps=ACCURACY_STEPS)
print("chunks  tokens per chunk  final loss   vs full attention")
for n, loss in losses.items():
    sizes = sorted({b - a for (a, b), in chunk_bounds(31, n)})
    print(f"{n:>6}  {'-'.join(map(str, sizes)):>16}  {loss:>10.3f}   {loss - losses[CHUNKS[0]]:+.3f}")
floor, above = LanguageData().loss_floor, [n for n in CHUNKS[1:] if losses[n] > losses[CHUNKS[0]]]
print(f"\nfull attention itself ends {losses[CHUNKS[0]] - floor:.3f} nats above the floor ({floor:.2f}) after "
      f"{ACCURACY_STEPS} steps; chunk counts above full attention: {', '.join(map(str, above)) or 'none'}")

# %% [markdown]
# This table shows little, and that is the lesson of the task above: each token of this language needs only
# the two tokens before it, so only the first two predictions of each chunk lose context, 2(n − 1) of 31.
# Their cost is a fraction of a nat spread over the sequence, while full attention itself is still far from
# the floor after `ACCURACY_STEPS` steps (the line under the table) and one seed measures no spread: the
# effect is mixed with how far training got and how each run happened to go. A real cost can hide on data
# whose dependencies are short; it shows on data built so that predictions need what lies in another chunk.

# %% [markdown]
# ## 3. Ring attention: exact, with the online softmax
#
# Two partial attention results over *disjoint* sets of keys — each normalised within its own keys, with its
# log-sum-exp `lse = m + log l` (running max m, sum of exponentials l) — merge exactly:
#
# $$\mathrm{lse} = \log(e^{\mathrm{lse}_1} + e^{\mathrm{lse}_2}), \qquad
#   o = e^{\mathrm{lse}_1 - \mathrm{lse}}\,o_1 + e^{\mathrm{lse}_2 - \mathrm{lse}}\,o_2 .$$
#
# Here two parts of the keys (2 of the 5 keys and the other 3), one with scores 40 higher than the other: the
# merge equals the softmax over all keys, while simply averaging the two parts (forgetting the rescale) does not.

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
# On G ranks, rank r starts with its own keys and values; at every step it computes its queries against the
# block it holds, merges, and passes the block to rank r+1 while receiving the next from rank r−1. After G
# steps each query has met every key. Which block each rank holds at each step (G = `RANKS`):

# %% tags=["nbval-check-output"]
for step in range(RANKS):
    print(f"step {step}: " + "   ".join(f"rank {r} holds rank {(r - step) % RANKS}'s block" for r in range(RANKS)))

# %% [markdown]
# How the running max and sum update, for the last query of rank 1 (G = `RANKS`, 4 tokens per rank, no mask):
# at each step it meets the block it holds, whose own max m_blk and sum l_blk (of e^(score − m_blk)) are
# merged into the running m and l — the old sum rescaled by e^(m_old − m) when the max rises (steps 1 and 2
# here: l then drops back towards 1, the old keys now weigh little). After the last step, log-sum-exp and
# output equal those of full attention over all keys.

# %% tags=["nbval-check-output"]
gen = torch.Generator().manual_seed(12)
tokens = 4
qs, ks, vs = (torch.randn(RANKS * tokens, 8, generator=gen, dtype=torch.float64) * 2 for _ in range(3))
me, query = 1, 2 * tokens - 1                       # rank 1's last query
o = lse = None
for step in range(RANKS):
    owner = (me - step) % RANKS
    block = slice(owner * tokens, (owner + 1) * tokens)
    scores = qs[query] @ ks[block].T / 8 ** 0.5
    o_blk, lse_blk = torch.softmax(scores, -1) @ vs[block], scores.logsumexp(-1)
    o, lse = (o_blk, lse_blk) if o is None else merge(o, lse, o_blk, lse_blk)
    seen = torch.cat([torch.arange(((me - s) % RANKS) * tokens, ((me - s) % RANKS + 1) * tokens)
                      for s in range(step + 1)])
    m = (qs[query] @ ks[seen].T / 8 ** 0.5).max()
    print(f"step {step}: block of rank {owner}: m_blk = {scores.max():6.3f}, l_blk = {torch.exp(scores - scores.max()).sum():6.3f}"
          f"  ->  running m = {m:6.3f}, l = {torch.exp(lse - m):6.3f}")
full_scores = qs[query] @ ks.T / 8 ** 0.5
print("equal to full attention over all keys:", torch.allclose(o, torch.softmax(full_scores, -1) @ vs),
      torch.allclose(lse, full_scores.logsumexp(-1)))

# %% [markdown]
# The same code runs on real ranks and, here, on the single-process simulator (`comm.simulate`). Outputs
# and gradients of q, k and v equal full attention's, causal and not, on 2 to `RANKS` ranks, with a sequence
# length (19) that no rank count divides evenly:


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
# ### Causal masks and load balance: zig-zag
#
# With a causal mask a query never looks at later keys, so a block entirely in the future is skipped. Cut
# contiguously, rank 0 holds the first tokens and skips almost everything, while the last rank skips
# nothing: the ring waits for the slowest. [Zig-zag](../docs/glossary.md#zig-zag) cuts the sequence into 2G chunks and gives rank r chunks
# r and 2G−1−r: an early and a late one. Score elements each rank computes (S = 64, G = `RANKS`):

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
# Contiguous: rank r computes r+1 blocks, so the last rank does G times the first's work. Zig-zag: every
# rank computes the same number of score elements, at every step. The same counts drawn, beside the bytes
# full attention and ring attention (one process, G = 1) save for backward as S grows:

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
# Full attention's saved bytes grow quadratically, the blockwise one's linearly: it keeps q, k, v, the
# output and one log-sum-exp per query, and [recomputes](../docs/glossary.md#activation-recomputation) the score blocks in backward.
#
# ### Step through the rounds yourself
#
# The widget below runs the library's `ring_attention` on tiny tensors in the simulator (one thread per
# rank; a run takes a fraction of a second) and notes everything it does round by round, so any setting redraws at once.
# Choose **G** (2 to 8), the sequence length **S**, the causal mask, the **layout** and the **round**, and a
# **query token**. Left: the (query chunk, key chunk) blocks met so far, in the colour of the rank that
# computed them, with their round written in where there is room (this round's solid); hatched grey blocks were skipped, their
# keys all in the queries' future. Middle: what each rank holds this round — its own queries (pale) and the
# key/value block that has reached it — and the score elements each rank has computed so far, zig-zag beside
# contiguous (dashed outlines: the whole call's). Right: the chosen query's running max m and sum
# l = Σ e^(score − m) round by round, against full attention's (dashed); a hollow point marks a round in
# which that query met only skipped blocks.
#
# Its starting state here, first as a plain image (so it shows where widgets do not render): G = 4, S = 16,
# causal, zig-zag, round 2, query 7 — the same q, k, v as the running-max cell above (seed 12), now with the
# causal mask. In round 2 rank 3 holds rank 1's key/value block (chunks 1 and 6): its query chunk 3
# (tokens 6–7) meets chunk 1 (tokens 2–3) and skips chunk 6 (tokens 12–13, its future). Query 7's max rises
# from −0.11 to 5.76, already full attention's, so its old sum is rescaled by e^(−0.11 − 5.76) and l falls
# from 2.92 to 1.02. So far every rank has computed 28 score elements with zig-zag; contiguous gives 16,
# 32, 48, 48 (and 16, 32, 48, 64 over all four rounds).

# %%
from coursekit.viz.ring_attention import draw_rounds
from coursekit.widgets.ring_attention import record_rounds, ring_attention_explorer

_ = draw_rounds(record_rounds(4, 16, True, "zigzag"), 2, 7, other=record_rounds(4, 16, True, "contiguous"))
plt.show()

# %% [markdown]
# Move **round** to 3 and l rises again (to 1.13, full attention's) while m stays; switch the layout to
# contiguous and rank 0 skips everything after round 0 while rank 3 computes in every round. Untick the mask
# as well and query 7's m and l are those of the running-max cell above, round for round (m = −0.111,
# 5.756, 9.582, 9.582).

# %%
ring_attention_explorer(world_size=4, seq_len=16, causal=True, layout="zigzag", round_=2, query=7)

# %% [markdown]
# ### Backward, blockwise too
#
# Ring attention's backward saves no S×S matrix: it recomputes each block's probabilities from the saved
# log-sum-exp, sends the key/value blocks around the ring once more, and with each block its gradients
# dk, dv, which arrive back at their owner after the last step. Elements sent, over all ranks, per call
# (n = b·h·S·d = the whole sequence's keys), counted against the formula:

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
# ## 4. All-to-all (DeepSpeed Ulysses)
#
# Ulysses re-shards instead of circulating: one all-to-all turns each rank's (its tokens, all H heads) into
# (all tokens, H/G heads), ordinary attention runs on whole sequences, and a second all-to-all turns the
# output back. Each all-to-all keeps 1/G of the data and sends the rest. The first carries q, k and v stacked,
# the second the output: four tensors of b·(S/G)·h elements per rank, so forward each rank sends
# 4·(G−1)/G·b·(S/G)·h elements, and backward as much again (`ulysses_traffic`; DeepSpeed-Ulysses' 4Nh/P per
# link, N the sequence length, P the GPUs). With S/G fixed, the volume per rank stays bounded (nearly
# constant) when S and G grow together — but the heads must divide among the ranks.

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
# **Ring or all-to-all: the volume per rank as G grows.** One letter per quantity from here: b sequences,
# S tokens, h the hidden width (all heads together, h = a·d for a heads of d), G ranks, L = S/G tokens per
# rank. Per attention call, forward + backward, each rank sends
#
# * ring attention: (6G − 4)/G · b·S·h = (6G − 4)·b·L·h — its key/value block makes G − 1 hops forward, and
#   G − 1 again in backward beside its gradients, plus one hop home;
# * Ulysses: 8·(G − 1)/G · b·L·h — four tensors of b·L·h (q, k, v, then the output) each way, of which it
#   keeps 1/G.
#
# Below, both against G with L fixed (the sequence grows with the ranks: S = G·L, L = 512 tokens, h = 64), from
# `ring_traffic` and `ulysses_traffic`, and, at G = 2, 3 and 4, counted on simulated ranks (S = 12·G: 3 or 6
# tokens per chunk; the counts are per token, so they scale).

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
# The ring's volume per rank grows with G (every block visits every rank), Ulysses' stays below 8·b·L·h
# however many ranks: on bandwidth alone Ulysses wins as soon as G ≥ 2. The ring's case is elsewhere: its
# transfers go to a neighbour while the block in hand is computed (hidden when a block's compute outlasts
# its transfer), it works for any number of heads and any G, and it never needs the whole sequence of a head
# on one rank. Ulysses needs the heads divisible by G (here a = 4 heads allows G = 2 and 4, not 3: the refusal
# above), so G ≤ a, and each all-to-all crosses every rank of the group at once. Hence the usual choice:
# Ulysses inside a node (fast all-to-all, G up to the heads), the ring across nodes, or both at once
# (section 8's last paragraph).
#
# ## 5. Memory per rank: 1/G of the activations
#
# The whole course transformer on 32 tokens, every rank running its tokens (`sequence_forward`): bytes
# saved for backward per rank (parameters excluded), for one process and for 2 and 4 ranks.

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
# Exactly half at G = 2 and a quarter at G = 4. What backward keeps is not all of the memory: while a block is
# computed, the ring as drawn in section 3 holds its score matrix, (S/G)² per head (or (S/2G)² with zig-zag),
# quadratic still. The library's ring can compute each block with torch's fused flash kernel instead
# (`ring_attention(..., kernel="fused")`, or the strategy option `kernel="fused"`), which returns the block's
# log-sum-exp for the merge and never holds a whole score block; exact all the same
# (`tests/test_parallel_sequence_fused.py`). The benchmark `python -m coursekit.bench sequence --check`
# measures the whole peak per rank, temporaries included, on real ranks, for every method and both kernels,
# and extrapolates from those peaks, by a fit a + b·S + c·S² through the measured lengths, the longest
# sequence each method would fit under a memory cap (docs/benchmarks.md: with the fused kernel the zig-zag
# ring's peak per rank is within 1.5× of Ulysses').
#
# Here the longest sequence is **measured**, not extrapolated. `capacity_table` counts the peak of one causal
# attention call, forward and backward, on each rank exactly: every tensor the ops create, from its creation
# until it is freed (`coursekit.measure.live_memory.LiveMemory`; the rank's inputs q, k, v and the output's gradient
# left out), each of the 2 ranks run in turn in this process with a *fake* process group
# (`coursekit.measure.live_memory.as_rank`: the collectives move nothing, the shapes are each rank's). It doubles S
# until the peak exceeds the budget, then bisects, every candidate measured:

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
# Each S fits and S + step does not, both measured. Full attention's S × S scores on one rank allow the
# shortest; the textbook ring, whose (S/2G)² score blocks are quadratic again, comes next; Ulysses, whose
# attention is the fused kernel on whole sequences of H/G heads, fits the longest, and the fused ring comes
# second: it keeps no score block, only the key and value blocks in flight and the merge's running output
# and log-sum-exp. The count is of the tensors the ops return, not of a kernel's internal
# workspace, which the benchmark's resident-set peak also sees.
#
# **When the ring's transfers hide** (Liu et al. 2023). At each ring step a rank computes its L = S/G queries
# against the block it holds while the next block travels. Forward, per step: compute 4·L²·h floating-point
# operations (q kᵀ and p v, h the hidden width), transfer 2·L·h numbers (the keys and the values). The
# transfer hides when it takes no longer than the compute, 4L²h/F ≥ 2Lh·s/B, that is
#
# $$L \;\ge\; \frac{s\,F}{2\,B}$$
#
# (F FLOP/s of a device, B bytes per second of the link, s bytes per number): compute grows as L², the
# transfer as L, so long enough chunks always hide it. Measured on 2 real ranks, one causal forward with
# the fused kernel, zig-zag, 4 heads of 16 (`hidden_share`): the transfers of the forward alone (the same
# blocks to the same neighbours, nothing computed), the whole forward, and how long the forward still waited
# for a block after computing the one it held; the mean over the 2 ranks of their medians.

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
print(f"this run: chunks of {longest} tokens hid {shares[longest]:.0%} of their transfers, chunks of {shortest} "
      f"{shares[shortest]:.0%}")
flops, nvlink, infiniband = 989e12, 450e9, 50e9  # assumed: H100 dense bf16 peak; NVLink and InfiniBand, each way
print(f"\nH100 (assumed {flops / 1e12:.0f} TFLOP/s bf16), s = 2 bytes: L ≥ {2 * flops / (2 * nvlink):,.0f} tokens a "
      f"rank over NVLink ({nvlink / 1e9:.0f} GB/s), L ≥ {2 * flops / (2 * infiniband):,.0f} over InfiniBand "
      f"({infiniband / 1e9:.0f} GB/s)")

# %% [markdown]
# Compute grows as L² and the transfers as L, so the long chunks are where the transfers hide (the line under
# the table says how much in this run; chunks of 4,096 tokens hid 95–97% in every run while this chapter was
# written). One CPU core computes slowly and loopback moves bytes fast, so here the crossing comes early. At
# the short chunks a step's compute is a fraction of a millisecond, and what the forward waits is then mostly
# the other rank's timing on 2 shared cores — wherever the wait is longer than the transfers alone, it
# cannot be the transfers — so that share varies from run to run. On GPUs the balance is the other way
# round: a device computes thousands of times faster while links grow far less, so the chunk must be long —
# about 2,200 tokens a rank over NVLink and 20,000 across nodes at peak FLOP/s (real attention kernels reach
# less than peak, which lowers these). That is why ring attention is a method for long sequences, and why,
# across nodes, it needs them long enough per GPU to hide its transfers.
#
# ## 6. Training equals one process
#
# In the training loop, a sequence-parallel strategy takes the **whole** batch on every rank (no data split)
# and keeps a whole copy of the model on each (P9's "like data parallelism each GPU holds a full model copy":
# the last line below measures it), and its part of every sequence. Each rank computes the logits and the
# loss of **its own tokens only**: its summed cross-entropy divided by the batch's b·S tokens (a count every
# rank knows), so its gradients hold its
# tokens' share of the loss and are summed over the ranks. No logits travel; to report the loss, each rank
# sends two numbers (its summed loss and its token count). So the 1/G of the activations of section 5 holds
# for what is trained, the logits included (`tests/test_parallel_sequence_loss.py` measures it in a training
# step). Three SGD steps on 2 real ranks against one process:

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
# ## 7. Megatron-style sequence parallelism, beside tensor parallelism
#
# Chapter 05's tensor parallelism splits attention's heads and the MLP, but every rank runs the LayerNorms
# and residual adds on the whole (b, s, h) activations. Korthikanti et al. (2022) split those regions along
# the sequence: the all-reduce after a row-parallel layer becomes a **reduce-scatter** (each rank gets the
# sum for its own tokens) and an **all-gather** rebuilds the whole input before the next column-parallel
# layer. A ring all-reduce *is* a reduce-scatter plus an all-gather, so the forward traffic is the same. As in
# Megatron, the all-gather and the column-parallel layer after it are one autograd function
# (`gather_linear`) that keeps only this rank's tokens for backward and all-gathers them again there: two
# more all-gathers of b·s·h per block in backward, and no whole (b, s, h) tensor kept. One block on 31 tokens,
# t = 2 and 4, against the dense block, with the elements sent against chapter 01's ring all-reduce of b·s·h:

# %% tags=["nbval-check-output"]
from coursekit.collectives import ring_all_reduce

dense = tiny_transformer(seed=0).blocks[0]
gen = torch.Generator().manual_seed(0)
xb, gb = torch.randn(2, 31, 64, generator=gen), torch.randn(2, 31, 64, generator=gen)
xd = xb.clone().requires_grad_()
(dense(xd) * gb).sum().backward()
for t in (2, 4):
    def run(rank, size):
        block = SequenceTensorParallelBlock(tiny_transformer(seed=0).blocks[0])
        mine = shard_sequence(xb, 1, rank, size).requires_grad_()
        (block(mine, 31) * shard_sequence(gb, 1, rank, size)).sum().backward()
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
# What each rank keeps for backward (parameters excluded), on 32 tokens so that every t divides them: the
# activations of the sequence-split regions hold S/t tokens, those of the head-split ones h/t of the width.
# Counted by hand per token: both LayerNorms' inputs with mean and 1/std, the inputs of qkv and fc, q, k, v,
# attention's output with one log-sum-exp per head, the GELU's input and output — (8h + 2·d_ff + a + 4)·4 bytes:

# %% tags=["nbval-check-output"]
x32 = torch.randn(2, 32, 64, generator=gen)
with saved_bytes(dense.parameters()) as meter:
    dense(x32.clone().requires_grad_())
print(f"dense block: {meter.bytes:,} bytes")
for t in (1, 2, 4):
    def held(rank, size):
        block = SequenceTensorParallelBlock(tiny_transformer(seed=0).blocks[0])
        with saved_bytes(block.parameters()) as m:
            block(shard_sequence(x32, 1, rank, size).requires_grad_(), 32)
        return m.bytes
    per_rank = comm.simulate(held, t).results
    print(f"t={t}: {per_rank[0]:,} bytes on each rank; every rank exactly dense / t: "
          f"{per_rank == [meter.bytes // t] * t and meter.bytes % t == 0}; "
          f"formula {megatron_sp_saved_bytes(2, 32, 64, 4, 256, t):,}")

# %% [markdown]
# Against **plain tensor parallelism at the same t**: chapter 05's block (`ParallelBlock`, on real ranks: its
# all-reduces are `torch.distributed`'s) keeps the LayerNorms' inputs with their mean and 1/std and the inputs
# of qkv and fc whole on every rank, 4h + 4 numbers a token, and divides only the rest, (4h + 2·d_ff + a)/t
# (`tensor_parallel_saved_bytes`). Beside both, Korthikanti et al.'s Table 2 for *their* layer, evaluated at
# this block's s, b, h, a (`korthikanti_table2_bytes`): sbh(34 + 5as/h) dense, sbh(10 + 24/t + 5as/(ht)) tensor
# parallel, sbh(34/t + 5as/(ht)) with sequence parallelism, in bytes of 16-bit activations with dropout masks
# and the a·s² softmax scores of each sequence:

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
# Plain tensor parallelism keeps 646 and 453 numbers a token, not 1032/t: the 260 of the LayerNorm regions
# and the column-parallel inputs stay whole on every rank (alone a quarter of the dense block's), so its share
# falls only to 0.626 and 0.439, while with sequence parallelism every rank keeps exactly 1/t. Table 2 has the
# same shape, 0.614 and 0.420 for plain tensor parallelism and exactly 1/t with sequence parallelism, but other
# bytes: it counts 2-byte values, 1-byte dropout masks and the softmax's a·s² scores, where the course runs
# fp32 without dropout and its fused attention keeps one log-sum-exp per head and token instead (and the
# LayerNorms' mean and 1/std, which the paper leaves out).
#
# What a rank keeps for backward is its plateau; what must fit is its **peak**, transients included: the
# gathered inputs, the pieces of a reduce-scatter, the gradients flowing back beside what the forward kept.
# `block_memory` measures both, exactly, per rank: one forward and backward of the block, every tensor the
# ops create counted from creation until it is freed (`coursekit.measure.live_memory`: parameters, their gradients
# and the block's input left out, its output counted — the next block's input — so the plateau is the same
# count as above), each rank of t run in turn in this process with a fake process group:

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
# Every plateau is the course's count to the byte. The peak adds what is alive at the worst moment; "born in
# backward" is the part of it the backward made (tests/test_live_memory.py derives each row). The dense block
# and plain TP at t = 2: the first gradient of backward, entering the MLP's hidden layer (b·s·d_ff/t), made
# while everything the forward kept is alive; at t = 4, where d_ff/t = h, a forward moment of the same size
# comes first (born in backward: 0). With sequence parallelism at t = 2 the output's gradient is all-gathered
# whole (b·s·h) beside that hidden gradient; at t = 4 fc's backward is worse: its input all-gathered again and
# its input's gradient before the reduce-scatter (b·s·h each), with the pieces being sent and received —
# more than peak − plateau, as backward has freed part of what the forward kept by then. Those
# gathered tensors are whole, so at the peak sequence parallelism saves less than on the plateau (the last
# two lines).
#
# The whole transformer this way is the strategy `"sequence_tensor"`: the embedding's partial lookups
# reduce-scattered along the sequence, every block on S/t tokens, the tied head all-gathering them; the
# LayerNorm weights, position embedding and row-parallel biases see only their rank's tokens, so their
# gradients are summed over the group. Three SGD steps on 2 real ranks against one process:

# %% tags=["nbval-check-output"]
def train_sp_tp(rank, world_size):
    return train(rank, world_size, "sequence_tensor", **CONFIG)["records"]


runs = coursekit.launch(train_sp_tp, 2)
print("Megatron-style SP x TP, t=2: same outputs, loss, gradients and parameters as one process:",
      compare(reference, [runs[0]]).ok and compare(reference, runs, check_output=False).ok)

# %% [markdown]
# ## 8. How it composes: sequence × data on a mesh, for real
#
# Sequence parallelism is orthogonal to data parallelism and can be combined with it (P9). On
# `Mesh({"dp": 2, "sp": 2})`, 4 real ranks: the `dp` [axis](../docs/glossary.md#axis) cuts the batch of 5 into slices of 3 and 2, and the
# 2 ranks of each slice split every sequence along `sp` with zig-zag ring attention. After backward, each
# rank's gradient holds its own tokens' share of its slice's loss: summed over `sp` it is the slice's gradient,
# averaged over `dp` the batch's. Both happen in **one** ring all-reduce over all four ranks, the `dp×sp` group
# that `Mesh.flatten(("dp", "sp"))` builds (as torchtitan flattens its data and context axes), divided by the
# 2 slices. Every message is counted and assigned to the axes it crossed:

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
# Along `sp` travel ring attention's key/value blocks and their gradients, and the links of the gradients'
# ring (reduce-scatter, all-gather) that join the two ranks of a slice; the ring's other two links (rank 1 → 2
# and 3 → 0) join one slice to the other and so cross both axes; nothing travels along `dp` alone, and no
# logits travel at all. One ring over the D·G ranks sends 2(DG − 1)·Ψ elements per step; reducing twice (a sum
# over each `sp` group, then a mean over each `dp` group) would send D·2(G − 1)·Ψ + G·2(D − 1)·Ψ, here 8Ψ
# against 6Ψ. Tensor parallelism would add a third axis the same way (`Mesh({"dp": 2, "sp": 2,
# "tp": 2})`, tensor parallelism usually inside a node where links are fastest; not implemented here). Ring
# attention overlaps its 2(G−1)·n forward elements with the blocks' compute; Ulysses sends a volume per rank
# that stays bounded (nearly constant) when S and G grow together, but needs the heads divisible by the degree;
# production systems combine them, Ulysses inside a node and the ring across nodes (Fang & Zhao 2024, "USP: A
# Unified Sequence Parallelism Approach").
#
# ## The same thing in production
#
# PyTorch's production API is `torch.distributed.tensor.experimental.context_parallel`: on a device mesh it
# shards the given buffers along their sequence dims (reordered for load balance under causal masks, on by
# default) and, inside the `with` block, runs `scaled_dot_product_attention` blockwise over the ranks with
# the GPU kernels (flash, memory-efficient or cuDNN attention) merging the partial results by their
# log-sum-exp, as here. The key/value shards are all-gathered by default, or passed around the ring with
# `set_rotate_method("alltoall")`. On CPU with torch 2.13.0 it does not run: the CPU attention kernel has no
# sharding rule. Caught, here is its own message:

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
# That is why this chapter builds its own: the same code runs on a laptop, in the simulator, and on GPUs.
# Next: the graded exercise `exercises/06_ring_attention.ipynb` asks you to write the merge, the pass that
# carries the gradients back, and the ring loop.
