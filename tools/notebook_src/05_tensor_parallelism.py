# ci_parameters: {"TIME_ITERS": 5, "WIDE_ITERS": 3}
# %% [markdown]
# # 05 · Tensor parallelism: one matrix multiplication on several GPUs
#
# Chapter 03 put whole layers on different GPUs and found a chain: one GPU waits while another computes
# (**P3**). **[Tensor parallelism](../docs/glossary.md#tensor-parallelism)** cuts *inside* a layer instead. Each weight matrix is
# split by rows or by columns. Every GPU multiplies its piece at the same time, and communication combines the
# pieces. That is claim **P5**. The chapter follows Megatron-LM (Shoeybi et al. 2019):
#
# 1. one matrix multiplication, split two ways;
# 2. the operators [**f** and **g**](../docs/glossary.md#f-and-g-operators): one all-reduce forward and one backward per block;
# 3. the [vocabulary-parallel loss](../docs/glossary.md#vocabulary-parallel-cross-entropy): the logits never exist whole;
# 4. training at degrees 1, 2, 4 and 3 equals one process;
# 5. what tensor parallelism sends, beside data parallelism;
# 6. memory per GPU;
# 7. why tensor beats model parallelism (**P10**), and why it stays inside a node;
# 8. the [data × tensor](../docs/glossary.md#hybrid-parallelism) [mesh](../docs/glossary.md#mesh) (**P8**);
# 9. the same thing in PyTorch: [DTensor](../docs/glossary.md#dtensor).
#
# Every "GPU" here is a process on this machine. The library is `coursekit.parallel.tensor`.

# %% tags=["parameters"]
# Parameters: small by default so the notebook runs in about a minute; raise them freely.
GPUS = 4                       # ranks of the proof and of the mesh (this machine has 2 cores: 4 ranks share them)
PROOF_DEGREES = [1, 2, 4, 3]   # tensor-parallel degrees proven equal to one process (3: uneven shards)
STEPS = 3                      # optimiser steps of each proof
GLOBAL_BATCH = 8               # sequences of 31 tokens per step
TIME_ITERS = 20                # iterations of each timing (the median is shown)
WIDE_ITERS = 7                 # iterations of the wide-model comparison (P10; about 1 s each)

# %%
# %matplotlib inline
import dataclasses
import statistics
import warnings

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import coursekit
from coursekit.models import LanguageData, loss_fn, tiny_transformer
from coursekit.parallel.tensor import (ColumnParallelLinear, ParallelMLP, ParallelSelfAttention, RowParallelLinear,
                                       VocabParallelEmbedding, count_communication, expected_counts, gather_dense,
                                       parallelize_transformer, shard_sizes, vocab_parallel_cross_entropy)
from coursekit.train import train
from coursekit.measure.verify import compare

torch.set_num_threads(1)  # one thread per process, as every rank has

# %% [markdown]
# ## 1. One matrix multiplication, split two ways (P5)
#
# How can two GPUs share one linear layer? The layer computes $Y = XA$, with the weight $A$ of shape `[in, out]`;
# PyTorch stores its transpose. There are two ways to cut $A$:
#
# * **By columns**, the output features. GPU $r$ holds $A_r$ and computes its own columns, $Y_r = XA_r$. Every GPU
#   needs all of $X$, and the outputs are concatenated. This is a
#   **[column-parallel linear](../docs/glossary.md#column-parallel-linear)** layer.
# * **By rows**, the input features. GPU $r$ holds $A_r$ and the matching columns $X_r$ of the input. It computes
#   a *partial* product $P_r = X_r A_r$ of the full shape. The output is $P_0 + P_1$: one all-reduce. This is a
#   **[row-parallel linear](../docs/glossary.md#row-parallel-linear)** layer.
#
# Two ranks build both layers from the same `nn.Linear(6, 4)`. The figure draws what each rank holds and computes.

# %%
def one_matmul(rank, world_size):
    torch.manual_seed(0)  # the same dense layer and input on every rank
    dense, x = torch.nn.Linear(6, 4, bias=False), torch.randn(3, 6).round(decimals=1)
    column = ColumnParallelLinear.from_dense(dense)
    row = RowParallelLinear.from_dense(dense, input_is_parallel=False)
    x_r = x[:, row.index]                                   # this rank's input columns
    return {"x": x, "dense": dense(x).detach(), "col_w": column.weight.detach(), "col_y": column(x).detach(),
            "row_w": row.weight.detach(), "row_x": x_r, "partial": F.linear(x_r, row.weight).detach(),
            "row_y": row(x).detach(), "col_index": column.index, "row_index": row.index}


held = coursekit.launch(one_matmul, 2)


def show(ax, tensor, title, colour):
    ax.imshow(tensor, cmap="coolwarm", vmin=-2, vmax=2)
    for (i, j), v in zip(((i, j) for i in range(tensor.shape[0]) for j in range(tensor.shape[1])), tensor.flatten()):
        ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=6)
    ax.set_title(title, fontsize=8, color=colour)
    ax.set_xticks([])
    ax.set_yticks([])


colours = ["tab:blue", "tab:orange"]
fig, axes = plt.subplots(2, 7, figsize=(17, 4.6))  # per GPU: its input, its weight shard, its output
for r in range(2):
    h = held[r]
    show(axes[0, 3 * r], h["x"], f"GPU {r}: X, all of it  {tuple(h['x'].shape)}", colours[r])
    show(axes[0, 3 * r + 1], h["col_w"].T, f"GPU {r}: A_{r} = A[:, {h['col_index'].tolist()}]  "
         f"{tuple(h['col_w'].T.shape)}", colours[r])
    show(axes[0, 3 * r + 2], h["col_y"], f"GPU {r}: Y_{r} = X A_{r}  {tuple(h['col_y'].shape)}", colours[r])
    show(axes[1, 3 * r], h["row_x"], f"GPU {r}: X_{r} = X[:, {h['row_index'].tolist()}]  {tuple(h['row_x'].shape)}",
         colours[r])
    show(axes[1, 3 * r + 1], h["row_w"].T, f"GPU {r}: A_{r} = A[{h['row_index'].tolist()}, :]  "
         f"{tuple(h['row_w'].T.shape)}", colours[r])
    show(axes[1, 3 * r + 2], h["partial"], f"GPU {r}: P_{r} = X_{r} A_{r}  {tuple(h['partial'].shape)}", colours[r])
show(axes[0, 6], torch.cat([held[0]["col_y"], held[1]["col_y"]], dim=1), "[Y_0 | Y_1] = Y  (concatenate)", "black")
show(axes[1, 6], held[0]["partial"] + held[1]["partial"], "P_0 + P_1 = Y  (all-reduce)", "black")
axes[0, 0].set_ylabel("split A by columns", fontsize=9)
axes[1, 0].set_ylabel("split A by rows", fontsize=9)
fig.suptitle("Y = X A with A (6 × 4) on two GPUs, drawn from the ranks' shards", fontsize=10)
fig.tight_layout()
plt.show()

# %% tags=["nbval-check-output"]
for r, h in enumerate(held):
    print(f"rank {r}: ColumnParallelLinear.weight {tuple(h['col_w'].shape)} (output features "
          f"{h['col_index'].tolist()}), RowParallelLinear.weight {tuple(h['row_w'].shape)} (input features "
          f"{h['row_index'].tolist()})")
dense_y = held[0]["dense"]
print("column split, concatenated, equals X Wᵀ:",
      torch.allclose(torch.cat([h["col_y"] for h in held], dim=1), dense_y, atol=1e-6))
print("row split, partial products summed, equals X Wᵀ:",
      torch.allclose(held[0]["partial"] + held[1]["partial"], dense_y, atol=1e-6))
print("RowParallelLinear's output (after its all-reduce) on both ranks equals X Wᵀ:",
      all(torch.allclose(h["row_y"], dense_y, atol=1e-6) for h in held))

# %% [markdown]
# **Takeaway:** each GPU stores half of the weight and does half of the multiply. The price is communication: an
# all-reduce after a row split.
#
# ## 2. Column, then row: one all-reduce each way
#
# Megatron-LM's trick is to chain the two splits. An MLP computes `out(gelu(fc(x)))`. Split `fc` by columns, and
# each GPU holds some hidden features whole. GELU acts on each feature alone, so it runs on the shards with no
# communication. Split `out` by rows: it takes exactly those features as input, and one all-reduce sums the
# partial outputs.
#
# Two operators do all the communicating. **g** sits after the row-parallel layer. Forward, it all-reduces the
# partial products. Backward, every rank already holds the whole gradient, so g passes it on. **f** sits before
# the column-parallel layer and mirrors g. Forward, every rank reads the whole input as it is. Backward, each
# rank's input gradient covers only its own features, so f all-reduces it. Writing f and g is exercise 05. Here
# is their neighbour, as the library runs it: a pair of operators built the same way, one autograd function each.
# The first gathers every rank's slice forward and keeps this rank's slice of the gradient backward; the second
# does the reverse.

# %%
from coursekit.parallel.tensor import core

coursekit.show(core._Gather)  # all-gather forward, this rank's slice backward


# %%
coursekit.show(core._Split)  # this rank's slice forward, all-gather backward


# %% [markdown]
# Attention splits the same way, by **heads**. `qkv` is column-parallel: each rank keeps q, k and v of its own
# heads, and each head attends alone. The output projection `proj` is row-parallel, so its g sums the heads'
# contributions:

# %%
coursekit.show(core.ParallelSelfAttention.forward)


# %% [markdown]
# The column- and row-parallel layers themselves are exercise 05's. Here they run inside one block of the course
# transformer, 64 wide with 4 heads, on 2 ranks, forward and backward, against the dense block:

# %% tags=["nbval-check-output"]
def blocks(rank, world_size):
    block = tiny_transformer(seed=0).blocks[0]
    x = torch.randn(2, 31, 64, generator=torch.Generator().manual_seed(1))
    out = {}
    for name, ours, dense in (("MLP", ParallelMLP.from_dense(block.fc, block.out),
                               lambda t: block.out(F.gelu(block.fc(t)))),
                              ("attention", ParallelSelfAttention.from_dense(block.attn), block.attn)):
        mine, ref = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        with count_communication() as counts:
            y = ours(mine)
            y.sum().backward()
        dense(ref).sum().backward()
        weights = {n: tuple(p.shape) for n, p in ours.named_parameters() if n.endswith("weight")}
        out[name] = ((y - dense(x)).abs().max().item(), (mine.grad - ref.grad).abs().max().item(),
                     dict(counts.calls), weights)
    return out


for name, (y_diff, grad_diff, calls, weights) in coursekit.launch(blocks, 2)[0].items():
    print(f"{name:<9} rank 0 holds {weights}")
    print(f"{'':<9} output {'equal' if y_diff < 1e-5 else 'DIFFERENT'}, input gradient "
          f"{'equal' if grad_diff < 1e-5 else 'DIFFERENT'} (to 1e-5); collectives: "
          + ", ".join(f"{op} {direction}: {n}" for (op, direction), n in sorted(calls.items())))

# %% [markdown]
# **Takeaway:** the MLP and attention each match the dense block, with 1 all-reduce forward and 1 backward.
#
# A transformer layer has both, so it costs 2 all-reduces forward and 2 backward. Each carries $b \cdot s \cdot h$
# numbers: the activations of $b$ sequences of $s$ tokens, $h$ wide.
#
# ## 3. The vocabulary-parallel loss
#
# Can the loss be computed without gathering the logits? The output head has one row per token of the
# vocabulary. Split those rows over the ranks, and rank $r$ computes only the logits of its own tokens. The
# cross-entropy needs every token's logit, but only through three numbers per position, each all-reduced:
#
# 1. the largest logit, for a stable exponential;
# 2. the sum of $\exp(\text{logit} - \max)$;
# 3. the target's logit: only the rank that holds the target contributes.
#
# Then $\text{loss} = \log \sum \exp - (\text{target logit} - \max)$. Below, a vocabulary of 13 on 4 ranks, cut
# 4, 3, 3, 3, against `F.cross_entropy` on the whole logits:

# %% tags=["nbval-check-output"]
def vocab_loss(rank, world_size):
    generator = torch.Generator().manual_seed(11)
    full = (torch.randn(40, 13, generator=generator) * 20).requires_grad_(True)
    targets = torch.arange(40) % 13
    expected = F.cross_entropy(full, targets, reduction="none")
    expected.sum().backward()
    sizes = shard_sizes(13, world_size)
    start = sum(sizes[:rank])
    local = full.detach()[:, start:start + sizes[rank]].clone().requires_grad_(True)
    with count_communication() as counts:
        loss = vocab_parallel_cross_entropy(local, targets, start)
        loss.sum().backward()
    return (tuple(local.shape), (loss - expected).abs().max().item(),
            (local.grad - full.grad[:, start:start + sizes[rank]]).abs().max().item(), dict(counts.elements))


for rank, (shape, loss_diff, grad_diff, elements) in enumerate(coursekit.launch(vocab_loss, 4)):
    print(f"rank {rank}: logits held {shape}; loss per position {'equal' if loss_diff < 1e-4 else 'DIFFERENT'}, "
          f"gradient of its logits {'equal' if grad_diff < 1e-6 else 'DIFFERENT'}; numbers all-reduced: {elements}")

# %% [markdown]
# **Takeaway:** each rank holds only its own columns of the logits and all-reduces 120 numbers, three for each
# of the 40 positions, yet gets the exact loss.
#
# With a real vocabulary of 50,000 to 250,000 tokens, the logits are among the largest tensors of a step. Here
# no GPU ever holds them whole.
#
# ## 4. The proof: tensor parallelism trains like one process
#
# `train(rank, world_size, "tensor", model="transformer")` turns the course transformer into its tensor-parallel
# form on every rank: vocabulary, heads and MLP split, norms copied. It trains, and records every output, loss,
# gradient and weight, reassembled from the shards. `compare` checks each against one process at every step. At
# degree 3 nothing divides evenly: 16 vocabulary rows become 6, 5 and 5, and 4 heads become 2, 1 and 1.

# %% tags=["nbval-check-output"]
PROOF = dict(model="transformer", steps=STEPS, global_batch=GLOBAL_BATCH, optimizer="sgd", lr=0.05)


def tensor_run(rank, world_size):
    result = train(rank, world_size, "tensor", **PROOF)
    counts = {k: v for k, v in result.items() if k.startswith("tp_")}
    return result["records"], counts, result["memory"]


reference = train(0, 1, "single", **PROOF)["records"]
proof_runs = {}
for degree in PROOF_DEGREES:
    proof_runs[degree] = coursekit.launch(tensor_run, degree, timeout=300)
    report = compare(reference, [proof_runs[degree][0][0]])             # rank 0's output, loss, gradients, weights
    every_rank = compare(reference, [r[0] for r in proof_runs[degree]], check_output=False)
    verdict = "equal to one process" if report.ok and every_rank.ok else (report if not report.ok else every_rank)
    print(f"degree {degree}: {STEPS} SGD steps, {verdict} (rank 0's outputs; every rank's losses, gradients and "
          f"parameters)")

# %% [markdown]
# **Takeaway:** at degrees 1, 2, 4 and 3, every step equals one process's.
#
# <details><summary>Why SGD, and what Adam does</summary>
#
# Adam's first step moves every weight by about `lr` × g/|g|, whatever the size of its gradient g. A gradient near
# zero that differs in its last bits therefore moves its weight visibly. The tensor-parallel code rounds
# differently from the dense model: its vocabulary-parallel loss is not `F.cross_entropy`. So with Adam, a
# check this strict fails even at degree 1, where nothing is split. The cell below shows it at degrees 1 and 2.
# </details>

# %% tags=["nbval-ignore-output"]
ADAM = dict(PROOF, optimizer="adam", lr=1e-3)
adam_reference = train(0, 1, "single", **ADAM)["records"]
adam_reports = {}
for degree in PROOF_DEGREES[:2]:
    adam = coursekit.launch(lambda rank, world_size: train(rank, world_size, "tensor", **ADAM)["records"], degree)
    adam_reports[degree] = compare(adam_reference, adam, check_output=False)
    print(f"degree {degree}, Adam: {adam_reports[degree]}")
diverged = [d for d, r in adam_reports.items() if not r.ok]
if 1 in diverged:
    print("degree 1 splits nothing and diverges too: what differs there is not a split but the tensor-parallel "
          "code's own operations (the vocabulary-parallel loss among them), which round differently from the dense "
          "model's")
if diverged and all(adam_reports[d].first.kind == "param" for d in diverged):
    print("each first divergence is a weight after an Adam update whose loss and gradients were within tolerance: "
          "Adam turned gradient differences too small to fail the check into weight differences that do")

# %% [markdown]
# ## 5. What tensor parallelism sends
#
# How much does a step send? Every collective of the layers goes through one counted function. For a transformer
# of $L$ layers, the formula per step is:
#
# * forward: $2L$ all-reduces of $bsh$ numbers, the embedding's g, and the loss's 3 of $bs$;
# * backward: $2L$ all-reduces of $bsh$, and the tied head's f.
#
# Nothing is all-gathered: the logits stay split.

# %% tags=["nbval-check-output"]
L, h, s, V = 2, 64, 31, 16
per_step = expected_counts(GLOBAL_BATCH, s, h, L, 2).as_dict()
print(f"formula per step (b = {GLOBAL_BATCH}, s = {s}, h = {h}, L = {L}):")
for key, value in per_step.items():
    if value:
        print(f"  {key:<34} {value:>8,}")
for degree in PROOF_DEGREES[1:]:
    counted = proof_runs[degree][0][1]
    same = all(counted[k] == STEPS * v for k, v in per_step.items())
    print(f"degree {degree}: counted over {STEPS} steps = {STEPS} × formula: {same}")

# %% [markdown]
# **Takeaway:** the counted all-reduces equal the formula at degrees 2, 4 and 3.
#
# Data parallelism sends something else. Each rank all-reduces its *gradients*, Ψ numbers, one per parameter,
# whatever the batch. Tensor parallelism all-reduces *activations*, which grow with the batch. Both are counted
# here on 2 ranks, at four batch sizes:

# %%
BATCHES = [2, 4, 8, 16]


def volumes(rank, world_size, batches):
    out = {}
    for b in batches:
        tp = train(rank, world_size, "tensor", model="transformer", steps=1, global_batch=b, record=False)
        dp = train(rank, world_size, "bucketed", model="transformer", steps=1, global_batch=b, record=False)
        out[b] = (tp["tp_all_reduce_forward_elements"] + tp["tp_all_reduce_backward_elements"], dp["elements_reduced"],
                  dp["numel"])
    return out


measured_volume = coursekit.launch(volumes, 2, BATCHES)[0]
psi = measured_volume[BATCHES[0]][2]
fig, ax = plt.subplots(figsize=(6.5, 3.2))
formula_tp = [sum(v for k, v in expected_counts(b, s, h, L, 2).as_dict().items() if k.endswith("elements"))
              for b in BATCHES]
ax.plot(BATCHES, [f / 1e3 for f in formula_tp], color="tab:orange", label="tensor: formula")
ax.scatter(BATCHES, [measured_volume[b][0] / 1e3 for b in BATCHES], color="tab:orange", zorder=3,
           label="tensor: counted")
ax.plot(BATCHES, [psi / 1e3] * len(BATCHES), color="tab:blue", label="data: Ψ (formula)")
ax.scatter(BATCHES, [measured_volume[b][1] / 1e3 for b in BATCHES], color="tab:blue", zorder=3, label="data: counted")
ax.set(xlabel="sequences per step (b, of 31 tokens)", ylabel="thousand numbers all-reduced per step",
       title="what each rank all-reduces per step, 2 ranks", xticks=BATCHES)
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% tags=["nbval-check-output"]
for b in BATCHES:
    tp_counted, dp_counted, _ = measured_volume[b]
    print(f"b = {b:>2}: tensor {tp_counted:>7,} (formula {formula_tp[BATCHES.index(b)]:>7,}), data {dp_counted:>7,} "
          f"(formula Ψ = {psi:,}): tensor moves {tp_counted / dp_counted:.2f}× data's")

# %% [markdown]
# **Takeaway:** data parallelism's volume is fixed by the model. Tensor parallelism's grows with the batch, from
# 0.38× data's at 2 sequences to 3.04× at 16.
#
# In a large model Ψ ≈ 12 L h², so the ratio is about $bs/(3h)$. With GPT-3's h = 12,288 and s = 2,048, it
# passes 1 at 18 sequences. The bigger difference is *when* the bytes move. Data parallelism's all-reduce can
# overlap the backward pass, as chapter 02 showed. Tensor parallelism's sit between the layers, and every layer
# waits for them.
#
# **Where the seed is wrong.** The seed says that with tensor parallelism "the model's parameters are often
# synchronised between devices". The counts say otherwise. Every all-reduce above carries activations, their
# gradients, or the loss's numbers per token. Each rank owns its shard of every weight and updates it alone. The
# copied norms get the same gradient on every rank, from the same inputs. Gradients are synchronised by data
# parallelism, which a real run adds on top: section 8.
#
# ## 6. Memory per GPU
#
# How much does each GPU hold? The seed's Figure 1.1 (**P6**) sets the strategies side by side. Tensor
# parallelism gives each GPU a slice of *every* weight matrix:

# %%
from coursekit.viz.strategies import draw_strategies

draw_strategies(n_gpus=GPUS)
plt.show()

# %% [markdown]
# Below, the parameters each rank holds after the proof's last step. The formula: the split tensors divided by
# $t$, plus what every rank copies.

# %%
dense_model = tiny_transformer(seed=0)
one_rank = parallelize_transformer(dense_model, None)  # degree 1 in this process: the same layers, unsplit
split = 0
for module in one_rank.modules():
    if isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding)):
        split += sum(p.numel() for p in module.parameters(recurse=False))
    elif isinstance(module, RowParallelLinear):
        split += module.weight.numel()
total = sum(p.numel() for p in dense_model.parameters())
replicated = total - split
even = [d for d in PROOF_DEGREES if 64 % d == 0 and 16 % d == 0]  # degrees that divide every split size
fig, ax = plt.subplots(figsize=(6.5, 3.2))
for k, degree in enumerate(even):
    measured_bytes = [r[2]["params"] for r in proof_runs[degree]]
    ax.bar([k + 0.8 * (i + 0.5) / degree for i in range(degree)], [m / 2**10 for m in measured_bytes],
           width=0.7 / degree, color="tab:orange")
    ax.hlines(4 * (replicated + split / degree) / 2**10, k, k + 0.8, color="black", label=None if k else
              "formula: 4·(replicated + split / t) bytes")
ax.set(xticks=[k + 0.4 for k in range(len(even))], xticklabels=[f"t = {d}\n(each bar a rank)" for d in even],
       ylabel="KiB of parameters per rank", title="parameters held per rank, measured")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% tags=["nbval-check-output"]
print(f"the course transformer: {total:,} parameters, {split:,} in split tensors, {replicated:,} replicated")
for degree in even:
    measured_bytes = sorted({r[2]["params"] for r in proof_runs[degree]})
    formula = 4 * (replicated + split // degree)
    print(f"t = {degree}: every rank holds {measured_bytes} bytes; formula 4·({replicated:,} + {split:,}/{degree}) "
          f"= {formula:,}: {'equal' if measured_bytes == [formula] else 'NOT EQUAL'}")

# %% [markdown]
# Every rank holds exactly the formula's bytes. The copied part does not shrink: 4,992 numbers, mostly the
# 64 × 64 position embedding. In a large model it is a fraction of a percent.
#
# Beside the parameters sit the **activations**: what the forward keeps for the backward. In each block, the
# inputs of the LayerNorms, of `qkv` and of `fc` stay whole on every rank. Attention's q, k, v and output and
# the MLP's hidden layer divide by $t$. So does the loss's share of the logits:

# %% tags=["nbval-check-output"]
from coursekit.parallel.sequence import saved_bytes  # chapter 06's meter: what autograd keeps for backward
from coursekit.parallel.tensor import tensor_parallel_saved_bytes

xb, yb = LanguageData().batch(0, GLOBAL_BATCH)


def memory_per_rank(rank, world_size):
    model = parallelize_transformer(tiny_transformer(seed=0))
    with saved_bytes(model.parameters()) as forward:     # parameters excluded: they are held anyway
        logits = model(xb)                               # this rank's vocabulary shard, (b, s, V/t)
    with saved_bytes() as loss:
        vocab_parallel_cross_entropy(logits, yb, model.tok_emb.vocab_start).mean()
    return sum(4 * p.numel() for p in model.parameters()), forward.bytes, loss.bytes


print(f"bytes per rank, b = {GLOBAL_BATCH} sequences of s = {s} tokens (fp32):")
print(f"{'':>6}{'parameters':>12}{'activations':>13}{'= blocks':>11}{'+ final norm,':>15}{'+ the loss':>12}")
print(f"{'':>6}{'':>12}{'':>13}{'(formula)':>11}{'head, ids':>15}{'':>12}".rstrip())
for degree in even:
    runs = coursekit.launch(memory_per_rank, degree)
    params, forward, loss = runs[0]
    blocks = L * tensor_parallel_saved_bytes(GLOBAL_BATCH, s, h, 4, 4 * h, degree)
    print(f"t = {degree}:{params:>12,}{forward + loss:>13,}{blocks:>11,}{forward - blocks:>15,}{loss:>12,}"
          f"{'' if all(r == runs[0] for r in runs) else '  (ranks differ)'}")

# %% [markdown]
# At $t = 4$ the parameters are 0.29 of one process's, but the activations 0.47. The final norm's and the
# head's inputs do not shrink at all. And even at this small batch, the activations are five to nine times the
# parameters. Chapter 06 splits the rest along the sequence.
#
# What must fit in memory is the **[peak](../docs/glossary.md#peak-memory)**: the most bytes alive at one moment, not only what the forward keeps.
# `LiveMemory` counts every tensor from its creation until it is freed. Each rank of one block runs in turn in
# this process, with a fake process group that moves nothing:

# %% tags=["nbval-check-output"]
from coursekit.measure.live_memory import as_rank
from coursekit.experiments import block_memory
from coursekit.parallel.tensor import ParallelBlock


def block_param_bytes(t):  # one block's parameters on rank 0 of t (fp32)
    block = tiny_transformer(seed=0).blocks[0]
    if t == 1:
        return 4 * sum(p.numel() for p in block.parameters())
    with as_rank(0, t):
        return 4 * sum(p.numel() for p in ParallelBlock(block).parameters())


peaks = block_memory(GLOBAL_BATCH, s, sizes=[d for d in even if d > 1], kinds=("tensor",))
print(f"one block, b = {GLOBAL_BATCH}, s = {s}, fp32, bytes on each rank (every rank the same: "
      f"{all(r == runs[0] for runs in peaks.values() for r in runs)}):")
print(f"{'':>7}{'parameters':>12}{'plateau':>10}{'formula':>10}{'peak':>11}{'peak − plateau':>16}"
      f"{'4·b·s·max(h, d_ff/t)':>22}{'born in backward':>18}")
for (kind, t), runs in peaks.items():
    run, transient = runs[0], 4 * GLOBAL_BATCH * s * max(h, 4 * h // t)
    print(f"t = {t}:{block_param_bytes(t):>12,}{run.plateau:>10,}"
          f"{tensor_parallel_saved_bytes(GLOBAL_BATCH, s, h, 4, 4 * h, t):>10,}{run.peak:>11,}"
          f"{run.peak - run.plateau:>16,}{transient:>22,}{run.transient:>18,}")
one, top = peaks["dense", 1][0], max(peaks)
print(f"at t = {top[1]}, of one process's: parameters {block_param_bytes(top[1]) / block_param_bytes(1):.2f}, "
      f"plateau {peaks[top][0].plateau / one.plateau:.2f}, peak {peaks[top][0].peak / one.peak:.2f}")

# %% [markdown]
# **Takeaway:** at $t = 4$ a rank holds 0.26 of a block's parameters but 0.40 of its peak memory, because the
# activations kept whole on every rank do not shrink.
#
# <details><summary>Where the peak comes from</summary>
#
# The peak is the plateau plus one tensor. At $t = 1$ and 2 it is born in backward: the gradient entering the
# MLP's hidden layer, $b \cdot s \cdot d_{ff}/t$ numbers, made while everything the forward kept is alive. At
# $t = 4$, $d_{ff}/t = h$, and a forward moment of the same size comes first: the MLP's row-parallel output
# beside its all-reduced copy.
# </details>
#
# Where do the all-reduces sit in time? One training step at degree 2, traced. Every all-reduce is a span on the
# communication lane, inside the forward and the backward. The window opens when both ranks have begun the step.

# %%
from coursekit.viz.timeline import draw_timelines


def traced(rank, world_size, strategy):
    result = train(rank, world_size, strategy, model="transformer", steps=2, global_batch=GLOBAL_BATCH,
                   trace=True, record=False)
    last = {r: max(s.start for s in result["spans"] if s.kind == "forward" and s.rank == r)  # the second step
            for r in range(world_size)}
    # tensor parallelism: from when both ranks are in the step (before, the first only waits for the other);
    # model parallelism is a chain: its window starts with rank 0's forward, while rank 1 waits for it
    common = max(last.values()) if strategy == "tensor" else min(last.values())
    return [dataclasses.replace(s, start=max(s.start, common)) for s in result["spans"]
            if s.start >= last[s.rank] and s.end > common]


tensor_spans = coursekit.launch(traced, 2, "tensor")[0]
draw_timelines({"tensor parallelism, degree 2: one step": tensor_spans}, hidden_share=False)  # that share is chapter 02's metric
plt.show()

# %% tags=["nbval-check-output"]
for rank in range(2):
    names = [s.name for s in tensor_spans if s.rank == rank and s.kind == "comm"]
    print(f"rank {rank}: {len(names)} all-reduces in the step: {names.count('all_reduce forward')} forward, "
          f"{names.count('all_reduce backward')} backward (formula: {2 * L + 1 + 3} and {2 * L + 1})")

# %% [markdown]
# Both ranks' traces hold the 8 forward and 5 backward all-reduces of the formula.
#
# ## 7. Why tensor rather than model parallelism (P10)
#
# **P10** says tensor parallelism "is more efficient because GPUs work simultaneously". Model parallelism, chapter
# 03's, is a chain: rank 1 waits for rank 0's activations, and rank 0 for rank 1's gradients. Tensor
# parallelism's ranks work through the same layer together and meet at each all-reduce.
#
# To see it on a CPU, the layers must be wide enough that compute dominates. The run uses 4 residual MLP blocks,
# 1024 → 4096 → 1024, Megatron's MLP shape, on 256 tokens. A block's forward is about 4.3 GFLOP, and its
# all-reduce carries 1 MiB. On 2 ranks of one core each, one process, tensor parallelism and model parallelism
# run back to back, so their ratios are paired.

# %% tags=["nbval-ignore-output"]
from coursekit.experiments import VARIANTS, step_times

wide = coursekit.launch(step_times, 2, WIDE_ITERS)
slowest = {v: [max(r[v][i] for r in wide) for i in range(WIDE_ITERS)] for v in VARIANTS}
speedup = {v: sorted(a / b for a, b in zip(slowest["one process"], slowest[v])) for v in VARIANTS}
print(f"wide MLP, 2 ranks, {WIDE_ITERS} iterations (slowest rank each):")
print("variant           step (median)   speed-up over one process: median [lowest, highest] of the paired ratios")
for v in VARIANTS:
    print(f"{v:<16} {statistics.median(slowest[v]) * 1e3:>9.0f} ms     "
          f"{statistics.median(speedup[v]):.2f}× [{speedup[v][0]:.2f}, {speedup[v][-1]:.2f}]")
fig, ax = plt.subplots(figsize=(5, 2.4))
medians = [statistics.median(slowest[v]) * 1e3 for v in VARIANTS]
ax.barh(list(VARIANTS), medians, color=["gray", "C0", "C1"])
ax.axvline(medians[0] / 2, color="black", linestyle="--", label="half of one process: the ideal")
ax.invert_yaxis()
ax.set_xlabel("ms per forward + backward (median)")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, not on them
plt.show()

# %% [markdown]
# **Takeaway:** where compute dominates, tensor parallelism runs about 1.7× faster than one process on 2 ranks,
# and model parallelism is no faster at all.
#
# On a GPU the proportions reverse, as long as the all-reduces stay on fast links: [NVLink](../docs/glossary.md#nvlink-and-infiniband). Chapter 01's network model
# prices one all-reduce of a GPT-3-sized layer's activations: one sequence of 2,048 tokens, h = 12,288, in bf16,
# over a tensor group of 8 GPUs. The compute it sits between is about $24\,bsh^2$ operations, shared by the 8.
#
# <details><summary>The assumed hardware</summary>
#
# NVLink: 450 GB/s each way per GPU and 2 µs latency, inside a node. InfiniBand: 400 Gb/s, that is 50 GB/s, and
# 10 µs, between nodes. Compute: 400 TFLOP/s per GPU. The model records the ring's transfers at a small size,
# scales them, and times each step by its busiest link. Across nodes the ring runs as NCCL runs it, one channel per
# GPU of a node, so each of the node's GPUs sends an equal share over its own InfiniBand link (chapter 01).
# </details>

# %% tags=["nbval-check-output"]
from coursekit.netsim import Network, collective_time

b_, s_, h_, t_ = 1, 2048, 12288, 8
numel = b_ * s_ * h_
nvlink = Network(bandwidth=50e9, latency=10e-6, gpus_per_node=8, intra_bandwidth=450e9, intra_latency=2e-6)
two_nodes = Network(bandwidth=50e9, latency=10e-6, gpus_per_node=4, intra_bandwidth=450e9, intra_latency=2e-6)
eight_nodes = Network(bandwidth=50e9, latency=10e-6)
compute = 24 * b_ * s_ * h_ ** 2 / t_ / 400e12
print(f"one all-reduce of {numel:,} bf16 numbers ({numel * 2 / 1e6:.0f} MB) over a tensor group of {t_} GPUs:")
rows = {}
for label, net in (("inside one node (NVLink)", nvlink), ("across 2 nodes of 4 (InfiniBand between)", two_nodes),
                   ("across 8 nodes (InfiniBand only)", eight_nodes)):
    rows[label] = collective_time("ring", t_, numel, net, itemsize=2).total
    per_layer_forward = 2 * rows[label]
    print(f"  {label:<42} {rows[label] * 1e3:6.2f} ms; 2 per layer forward = {per_layer_forward * 1e3:5.2f} ms "
          f"against {compute * 1e3:.2f} ms of compute ({per_layer_forward / compute:.0%})")

# %% [markdown]
# **Takeaway:** inside one node a layer's two forward all-reduces cost 19% of its compute; across 2 nodes of 4
# they cost 50%, and across 8 nodes 164%, more than the compute they split.
#
# So the tensor group stays inside a node, at most 8 GPUs, and data or pipeline parallelism combines the nodes.
# Plain Megatron-style tensor parallelism waits for every all-reduce; PyTorch's asynchronous tensor parallelism
# hides part of each behind the next product.
#
# ## 8. The data × tensor mesh (P8)
#
# **P8**: for models too large for one GPU, data and tensor parallelism combined is the common approach. The
# ranks form a grid, `Mesh({"dp": 2, "tp": 2})`. Each row is a tensor group of neighbouring ranks, inside one
# node. Each column is a data group. Each tensor group gets its own slice of the batch, and gradients are
# averaged over `dp` only. Here on 4 ranks, with a batch of 7 sequences split 4 + 3, against one process:

# %% tags=["nbval-check-output"]
HYBRID = dict(PROOF, global_batch=7)
TP = 2  # the mesh's tensor degree; dp = GPUS // TP


def hybrid(rank, world_size):
    result = train(rank, world_size, "dp_tp", tp=TP, **HYBRID)
    return result["records"], result["elements_reduced"], result["tp_all_reduce_forward_calls"]


hybrid_runs = coursekit.launch(hybrid, GPUS, timeout=300)
hybrid_reference = train(0, 1, "single", **HYBRID)["records"]
report = compare(hybrid_reference, [r[0] for r in hybrid_runs[::TP]])  # one rank of each tensor group
every_rank = compare(hybrid_reference, [r[0] for r in hybrid_runs], check_output=False)
verdict = "equal to one process" if report.ok and every_rank.ok else (report if not report.ok else every_rank)
print(f"dp = {GPUS // TP} × tp = {TP} on {GPUS} ranks: {verdict}")
reduced = sorted({r[1] // STEPS for r in hybrid_runs})
shard = replicated + split // TP
print(f"each rank all-reduced over dp per step: {' or '.join(f'{n:,}' for n in reduced)} gradient numbers; its shard: "
      f"{replicated:,} replicated + {split:,}/{TP} split = {shard:,}: {'equal' if reduced == [shard] else 'NOT EQUAL'}")

# %% [markdown]
# **Takeaway:** dp = 2 × tp = 2 trains exactly like one process, and each rank all-reduces only its own 54,912
# gradient numbers over `dp`.
#
# Where the groups land on real nodes matters, as section 7 priced. The figure colours the tensor groups and the
# data groups of 8 GPUs in nodes of 4, at tp = 2. A tensor group that crossed a node would be hatched and
# outlined in red. Here none does:

# %%
from coursekit.viz.mesh import describe, draw_mesh

draw_mesh(8, 2, 4)
plt.show()
print(describe(8, 2, 4))

# %%
from coursekit.widgets.mesh import mesh_explorer

mesh_explorer(world_size=8, tp=2, gpus_per_node=4)

# %% [markdown]
# In the widget, try tp = 8 with nodes of 4: the one tensor group spans both nodes, and it is drawn in red.
#
# ## 9. The same thing in production: DTensor
#
# PyTorch expresses the same splits as *placements* of distributed tensors. `ColwiseParallel` shards a weight by
# output features, `Shard(0)`. `RowwiseParallel` shards by input features, `Shard(1)`, and turns its `Partial`
# output into `Replicate` with an all-reduce. `coursekit.parallel.tensor.torch` applies that plan to the course
# transformer. Each piece matches one of coursekit's:
#
# | coursekit | PyTorch |
# |---|---|
# | `Mesh({"dp": 2, "tp": 2})`, `mesh["tp"]` | `init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))`, `device_mesh["tp"]` |
# | `copy_to_parallel_region` (**f**) | `ColwiseParallel`'s `Replicate()` input: backward turns the `Partial` gradient into `Replicate` |
# | `reduce_from_parallel_region` (**g**) | `RowwiseParallel`'s output: `Partial` → `Replicate()` |
# | `gather_from_parallel_region` | `ColwiseParallel(output_layouts=Replicate())` |
# | `ColumnParallelLinear` | `ColwiseParallel()` (weight `Shard(0)`) |
# | `RowParallelLinear` | `RowwiseParallel()` (weight `Shard(1)`, bias `Replicate`) |
# | `ParallelSelfAttention` | `ColwiseParallel` on `qkv` (rows reordered: `qkv_rank_order`) + `RowwiseParallel` on `proj` |
# | `VocabParallelEmbedding` | `RowwiseParallel(input_layouts=Replicate())` on `nn.Embedding` |
# | `vocab_parallel_cross_entropy` | `F.cross_entropy` inside `loss_parallel()` |
# | `parallelize_transformer` | `parallelize_module(model, device_mesh, plan)` |
# | `gather_dense` | `DTensor.full_tensor()` |
# | `count_communication` | `torch.distributed.tensor.debug.CommDebugMode` |
#
# Both run below on a DTensor mesh of 2 ranks, against the dense model. `CommDebugMode` counts PyTorch's
# collectives:

# %% tags=["nbval-check-output"]
def side_by_side(rank, world_size, iters):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import loss_parallel

    from coursekit.parallel.tensor import comm_counts, dense_qkv, torch_parallelize_transformer

    device_mesh = init_device_mesh("cpu", (world_size,))
    x, y = LanguageData().batch(0, GLOBAL_BATCH)
    dense = tiny_transformer(seed=0)
    theirs = torch_parallelize_transformer(dense, device_mesh)
    ours = parallelize_transformer(dense, device_mesh.get_group())
    expected = loss_fn(dense(x), y)
    expected.backward()

    def full(t):  # a DTensor's whole value; a tensor nothing split (position embedding, norms) as it is
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    def torch_step():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a DTensor hook warns that no input requires grad
            with loss_parallel():
                loss = F.cross_entropy(theirs(x).flatten(0, 1), y.flatten())
                loss.backward()
        return full(loss)

    def our_step():
        loss = ours.loss(x, y)
        loss.backward()
        return loss

    with CommDebugMode() as mode:
        torch_loss = torch_step()
    with count_communication() as counts:
        our_loss = our_step()
    torch_grads = {n: full(p.grad) for n, p in theirs.named_parameters()}
    for name in torch_grads:
        if name.endswith("attn.qkv.weight"):
            torch_grads[name] = dense_qkv(torch_grads[name], dense.blocks[0].attn.n_heads, world_size)
    our_grads = gather_dense(ours, grads=True)
    worst = {"torch": max((torch_grads[n] - p.grad).abs().max().item() for n, p in dense.named_parameters()),
             "coursekit": max((our_grads[n] - p.grad).abs().max().item() for n, p in dense.named_parameters())}
    times = {"coursekit": [], "DTensor": []}
    for _ in range(iters):  # alternated, so both see the same machine load
        for name, run in (("coursekit", our_step), ("DTensor", torch_step)):
            begin = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - begin)
    return {"loss": (expected.item(), torch_loss.item(), our_loss.item()), "worst": worst,
            "torch": comm_counts(mode), "ours": {d: {"all_reduce": counts.calls["all_reduce", d]}
                                                  for d in ("forward", "backward")}, "times": times}


import time

production = coursekit.launch(side_by_side, 2, TIME_ITERS, timeout=300)
r0 = production[0]
print(f"loss: dense {r0['loss'][0]:.6f}, DTensor {r0['loss'][1]:.6f}, coursekit {r0['loss'][2]:.6f}")
for name, worst in r0["worst"].items():
    print(f"every gradient, {name:<9} against the dense model: {'equal' if worst < 1e-5 else 'DIFFERENT'} (to 1e-5)")
print(f"collectives, DTensor (CommDebugMode):  {r0['torch']}")
print(f"collectives, coursekit (counted):      {r0['ours']}")
print(f"formula: forward 2·{L} + 1 + 3 = {2 * L + 4}, backward 2·{L} + 1 = {2 * L + 1}")

# %% tags=["nbval-ignore-output"]
median = {name: statistics.median(max(r["times"][name][i] for r in production) for i in range(TIME_ITERS))
          for name in ("coursekit", "DTensor")}
print(f"forward + backward of the whole transformer, degree 2, {GLOBAL_BATCH} × 31 tokens "
      f"(median of {TIME_ITERS}, slowest rank; 2 ranks on 2 cores shared with other processes):")
ratio = median["coursekit"] / median["DTensor"]
print(f"coursekit {median['coursekit'] * 1e3:.1f} ms, DTensor {median['DTensor'] * 1e3:.1f} ms: coursekit took "
      f"{ratio:.2f}× DTensor's time")

# %% [markdown]
# **Takeaway:** DTensor and coursekit compute the same loss and gradients, with the same 8 all-reduces forward
# and 5 backward.
#
# <details><summary>Why the times differ here</summary>
#
# Both times measure mostly fixed costs on this machine: at 64-wide matrices the arithmetic is small next to the
# all-reduces and the work around each operation. An operation on a `DTensor` adds its own. It unwraps the local
# tensors, finds the placements of its result, and wraps the result again. On GPUs with large matrices both issue
# the same NCCL all-reduces around the same matrix products.
# </details>

# %% [markdown]
# ## When it does not pay on a laptop
#
# The same comparison on the course transformer, 64 wide: one traced step of model parallelism, chapter 03's
# layers on 2 ranks, and one of tensor parallelism (§6's), with the share of the passes during which *both*
# ranks compute at once.

# %%
model_spans = coursekit.launch(traced, 2, "model")[0]
draw_timelines({"model parallelism, 2 ranks": model_spans, "tensor parallelism, degree 2": tensor_spans},
               hidden_share=False)
plt.show()


from coursekit.measure.trace import computing_together

runs = {"model": model_spans, "tensor": tensor_spans}
computing = {name: computing_together(spans) for name, spans in runs.items()}
step = {name: max(s.end for s in spans) - min(s.start for s in spans) for name, spans in runs.items()}

# %% tags=["nbval-ignore-output"]
for name in runs:
    print(f"{name:<6} parallelism: both ranks computing (not waiting) during {computing[name]:.0%} of the "
          f"passes; step {step[name] * 1e3:.1f} ms")

# %% [markdown]
# Tensor parallelism keeps both ranks busy for more of the step, but at 64 wide the arithmetic between two
# all-reduces is short: the step is mostly all-reduces and the fixed cost of each operation, so which step is
# faster changes from run to run.
#
# **Exercise** `exercises/05_tensor_parallel.ipynb`: write f, g, `ColumnParallelLinear` and `RowParallelLinear`
# from their contract. It is graded on outputs, gradients and the traffic, on groups of a mesh too.
