# ci_parameters: {"STEPS": 2, "TIME_ITERS": 5, "WIDE_ITERS": 3}
# %% [markdown]
# # 05 · Tensor parallelism: one matrix multiplication on several GPUs
#
# Chapter 03 put whole layers on different GPUs and found a chain: GPU 2 waits while GPU 1 computes
# (**P3**). **[Tensor parallelism](../docs/glossary.md#tensor-parallelism)** (seed claim **P5**, "intra-op") cuts *inside* a layer instead: each
# weight matrix is split by rows or by columns, every GPU multiplies its piece at the same time, and the
# pieces are combined by communication. This chapter follows Megatron-LM (Shoeybi et al. 2019):
#
# 1. the linear-algebra identity, on two GPUs, drawn from the shards the ranks really hold;
# 2. the MLP and the attention block: one all-reduce forward and one backward each (the [operators **f**, **g**](../docs/glossary.md#f-and-g-operators));
# 3. the [vocabulary-parallel loss](../docs/glossary.md#vocabulary-parallel-cross-entropy): the logits never exist whole on one GPU;
# 4. the proof: training at tensor degrees 1, 2, 4 and 3 (uneven) equals one process;
# 5. communication counted against the formula and against data parallelism's;
# 6. memory per rank and a measured timeline with the all-reduces inside each layer;
# 7. why tensor parallelism beats model parallelism (**P10**) and why it stays inside a node;
# 8. the [data × tensor](../docs/glossary.md#hybrid-parallelism) [mesh](../docs/glossary.md#mesh) (**P8**);
# 9. the same thing in production: PyTorch's [DTensor](../docs/glossary.md#dtensor).
#
# Every "GPU" is a process on this machine (gloo on 2 CPU cores); the library is
# `coursekit.parallel.tensor`: `layers` (operators and layers), `vocab` (the vocabulary), `model`
# (the whole transformer and the strategies `"tensor"` and `"dp_tp"` of `coursekit.train.train`),
# `activations` (what a block keeps for backward per rank) and `versus` (tensor against model parallelism on
# a wide model, section 7).

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
# ## 1. The identity: one matrix multiplication split two ways (P5)
#
# A linear layer computes $Y = X W^\top$ (PyTorch's `weight` $W$ is `[out, in]`). Write $A = W^\top$ as the
# paper does, $Y = XA$. Two ways to put it on two GPUs:
#
# * **split $A$ by columns** (output features): GPU $r$ holds $A_r$ and computes $Y_r = X A_r$, its own
#   columns of $Y$. $Y = [\,Y_0 \mid Y_1\,]$: nothing to add, every GPU needs all of $X$.
#   coursekit's [`ColumnParallelLinear`](../docs/glossary.md#column-parallel-linear) (its `weight` holds rows of $W$);
# * **split $A$ by rows** (input features): GPU $r$ holds $A_r$ and the matching columns $X_r$ of the
#   input, and computes a *partial* product $P_r = X_r A_r$ of the full shape. $Y = P_0 + P_1$: one
#   all-reduce. coursekit's [`RowParallelLinear`](../docs/glossary.md#row-parallel-linear).
#
# Below, two ranks build both layers from the *same* dense `nn.Linear(6, 4)` and return what they hold and
# compute; the figure draws those tensors.

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
# Each GPU stores half of the weight (**P5**: "it beats memory limits") and does half of the multiply at the
# same time as the other ("and runs in parallel"); the price is the all-reduce of the row split, or the
# all-gather a column split needs when a later step wants all of $Y$ ("its cost is communication").
#
# ## 2. Column then row: the MLP and attention, one all-reduce each way
#
# The trick of Megatron-LM is to *chain* the two splits. The MLP is `out(gelu(fc(x)))`: split `fc` by
# columns and each GPU holds some hidden features whole; GELU acts on each feature alone, so it runs on the
# shards with no communication; `out` split by rows then takes exactly those features as its input slice,
# and one all-reduce sums the partial outputs. Two operators do the communication:
#
# | operator | forward | backward | where |
# |---|---|---|---|
# | **f** `copy_to_parallel_region` | identity | all-reduce | before the column-parallel layer: each rank's input gradient is only its shard's part |
# | **g** `reduce_from_parallel_region` | all-reduce | identity | after the row-parallel layer: sums the partial products |
#
# Attention splits the same way by **heads**: `qkv` is column-parallel (each rank keeps q, k and v of its
# heads), each head attends alone, and the output projection `proj` is row-parallel. Measured on 2 ranks, one
# block of the course transformer (d_model 64, 4 heads, MLP width 256), forward and backward, against the
# dense block:

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
# One all-reduce forward (the **g** after the row-parallel layer) and one backward (the **f** before the
# column-parallel one) per block: per transformer layer, 2 forward and 2 backward, of $b \cdot s \cdot h$
# numbers each (the layer's activations), as the paper says.
#
# ## 3. The vocabulary-parallel loss: the logits never exist whole
#
# The course transformer's output head is tied to the token embedding, `[V, h]`. Split its **rows** over the
# ranks (rank $r$ holds tokens $[v_r, v_{r+1})$): the embedding looks up the rows it holds (zeros for the
# others) and a **g** sums the lookups; the head is then column-parallel — rank $r$ computes only the logits
# of its own tokens, $(b, s, V/t)$. The cross-entropy needs every token's logit, but only through three
# numbers per position, each all-reduced:
#
# 1. MAX of the row's maximum (for a stable exponential);
# 2. SUM of $\sum \exp(\text{logit} - \max)$;
# 3. SUM of the target's logit (only the rank that holds the target contributes).
#
# Then $\text{loss} = \log \sum\exp - (\text{target logit} - \max)$. A vocabulary of 13 on 4 ranks (uneven:
# 4, 3, 3, 3 rows), with logits up to about 60, against `F.cross_entropy` on the whole logits:

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
# Three all-reduces of 40 numbers (one per position) instead of gathering $40 \times 13$ logits. With a real
# vocabulary (50,000 to 250,000 tokens) the logits are among the largest activations of the step, and no GPU
# ever holds them whole. The training loop calls the strategy's own loss (`Strategy.loss`), so the strategies
# `"tensor"` and `"dp_tp"` train on exactly this loss.
#
# ## 4. The proof: tensor parallelism trains like one process
#
# `train(rank, world_size, "tensor", model="transformer")` turns the dense course transformer into its
# tensor-parallel form on every rank (vocabulary, heads and MLP split; norms and the position embedding
# replicated), trains it, and records the output, the loss, every gradient and every weight, reassembled
# from the shards (`gather_dense`). `coursekit.measure.verify.compare` checks each against one process at every
# step. Degree 3 does not divide the vocabulary (16 → 6, 5, 5 rows) nor the heads (4 → 2, 1, 1): the shards
# are uneven and the model is still exactly the same one.

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
# SGD with momentum above. With Adam, the first step moves every weight by about `lr` × g/|g|, whatever the
# size of its gradient g, so a gradient near zero that differs in its last bits (the vocabulary-parallel loss
# rounds differently from `F.cross_entropy`) moves its weight visibly differently. The first two of those
# degrees with Adam, against one process trained with Adam:

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
# ## 5. Communication, counted
#
# Every collective of the layers goes through one counted function (`count_communication`; the strategy
# counts each training step). The formula, per forward and backward of the course transformer with $L$
# layers on a batch of $b$ sequences of $s$ tokens, width $h$: forward $2L$ all-reduces of $bsh$ (attention's
# and the MLP's **g**) plus the embedding's **g** plus the loss's 3 of $bs$; backward $2L$ (their **f**) plus
# the tied head's **f**. No all-gather: the logits are not gathered.

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
# Against **data parallelism**: there each rank all-reduces its *gradients* once per step — $\Psi$ numbers
# (every parameter), whatever the batch. Tensor parallelism all-reduces *activations* — $4L \cdot bsh$
# (+ the embedding's, the head's and the loss's) per step, growing with the batch and the sequence. Both
# counted here on 2 ranks (data parallelism: the strategy `"bucketed"`, which counts the elements it
# all-reduces) at several batch sizes, drawn against their formulas:

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
# Data parallelism's volume is fixed by the model; tensor parallelism's grows in proportion to the batch (the
# ratios printed above). In a large model $\Psi \approx 12 L h^2$, so the ratio is about
# $4L \cdot bsh / 12 L h^2 = bs/(3h)$: below 1 until the tokens per step $bs$ exceed $3h$ (for $h = 12288$ and
# $s = 2048$, 18 sequences; one sequence gives about 0.06). The bigger difference is *when*: data
# parallelism's all-reduce can overlap the backward pass (chapter 02); tensor parallelism's sit between the
# layers, on the critical path — every layer waits for them, twice forward and twice backward. That is what
# the next sections measure.
#
# **Where the seed is wrong.** The seed says that with tensor parallelism "the model's parameters are often
# synchronised between devices". The counts above say otherwise: every all-reduce of tensor parallelism
# carries *activations* (forward, g: b·s·h numbers), their gradients (backward, f), or the vocabulary-parallel
# loss's per-token numbers (b·s), and no parameter or parameter gradient crosses between the ranks of a tensor
# group — each rank owns its shard of every weight and updates it alone, and the replicated ones (the norms,
# the position embedding) get the same gradient on every rank from the same inputs (section 4 proved the
# result equal to one process without any weight exchange). Parameters,
# or rather their gradients, are synchronised by *data* parallelism (chapter 02), which a real run combines
# with tensor parallelism (section 8). What makes tensor parallelism costly is that its activation traffic
# grows with the batch and sits on the critical path, as just measured.
#
# ## 6. Figure 1.1, memory per rank and the timeline
#
# The seed's "Figure 1.1" (**P6**) compares the strategies side by side; regenerated here for `GPUS` GPUs
# (the same figure as chapter 00's, from `coursekit.viz.strategies`): model parallelism gives each GPU whole
# layers, data parallelism each GPU a slice of the batch and a full copy, tensor parallelism each GPU a
# slice of *every* weight matrix (pipeline parallelism, chapter 04, is drawn too).

# %%
from coursekit.viz.strategies import draw_strategies

draw_strategies(n_gpus=GPUS)
plt.show()

# %% [markdown]
# Memory: the parameters each rank holds, measured after the proof's last step (`result["memory"]`), against
# the formula: the split tensors (vocabulary rows, q/k/v and output projection, both MLP weights and the
# column-parallel biases) divided by $t$, plus what every rank replicates (position embedding, the norms, the
# row-parallel biases).

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
# The replicated part does not shrink with $t$: 4,992 numbers, 5% of this tiny model (mostly its 64 × 64
# position embedding); in a large model, the norms and biases, a fraction of a percent.
#
# Beside the parameters, the **activations**: what one forward of the loss keeps for its backward on each rank
# (parameters excluded; counted with chapter 06's `saved_bytes`), on a batch of the proof's size. The blocks'
# part is `tensor_parallel_saved_bytes`, counted by hand per token: the two LayerNorms' inputs with their mean
# and 1/std and the inputs of qkv and fc ($4h + 4$ numbers) whole on every rank; q, k, v, attention's output
# and one log-sum-exp per head, the GELU's input and output ($4h + 2 d_{ff} + a$) divided by $t$. The loss
# keeps this rank's $b \cdot s \cdot V/t$ probabilities (and two small tensors for the targets):

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
# At $t = 4$ the parameters are 0.29 of one process's, the activations 0.47: in every block the LayerNorm
# regions and the column-parallel layers' inputs stay whole on every rank, and so does the rest of the forward
# (the final norm's and the head's inputs, the token ids: 131,440 bytes at every $t$). Already at this batch
# of 8 × 31 tokens the activations are five to nine times the parameters. The logits do divide by $t$, but
# with this toy vocabulary of 16 the loss keeps under 1% of the activations; with GPT-2's
# (V = 50,257, h = 768) a token's logits are 65 times its hidden state. Chapter 06 splits the whole regions
# too, along the sequence (Megatron's sequence parallelism).
#
# What a forward keeps for its backward is a **plateau**; what must fit in a GPU's memory is the **peak**, the
# most bytes alive at one moment, transients included: a matmul's output beside its all-reduced copy, the
# gradients flowing back beside everything the forward kept. `block_memory` measures both for one block,
# exactly: every tensor the ops create is counted from its creation until it is freed
# (`coursekit.measure.live_memory.LiveMemory`; the parameters, their gradients and the block's input left out, its
# output counted: the next block's input), and each rank of $t$ runs in turn in this process with a *fake*
# process group (`as_rank`: the collectives move nothing, the shapes are each rank's). Beside it, the block's
# parameters on one rank:

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
# The plateau is the formula above to the byte, and the peak is the plateau plus **one** tensor. At $t = 1$
# and 2 it is born in backward: the first gradient, the one entering the MLP's hidden layer
# ($b \cdot s \cdot d_{ff}/t$ numbers), made while everything the forward kept is still alive. At $t = 4$,
# $d_{ff}/t = h$, and a forward moment of the same size comes first: the MLP's row-parallel output beside
# its copy being all-reduced (the "born in backward" column is 0: nothing of backward is alive at that
# peak). Plateau and peak both fall more slowly with $t$ than the parameters (the last line), for the same
# reason: the LayerNorm regions and the column-parallel inputs stay whole on every rank.
#
# The timeline: one training step at degree 2 (2 ranks, one thread each), traced (`train(..., trace=True)`);
# every all-reduce of the layers is a span on the communication lane, inside the forward and the backward.
# The window starts when *both* ranks have begun the step (the later of their two starts): before that, the
# rank that started first only waits at its first all-reduce for the other, which says nothing about tensor
# parallelism and would otherwise take up a good part of the drawing.

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
# ## 7. Why tensor rather than model parallelism (P10), and why inside a node
#
# **P10**: for a model too large for one GPU, "tensor parallelism is more efficient because GPUs work
# simultaneously". The timelines below are one step of model parallelism (chapter 03: layers on 2 ranks) and
# of tensor parallelism (degree 2), measured on the same model and batch. From each, the share of the
# forward and backward passes (from the first forward's start to the last backward's end) during which *both*
# ranks compute at once (`coursekit.measure.trace.computing_together`). A wait counts as a wait however it is booked:
# tensor parallelism's all-reduces are idle spans *inside* a forward or backward, model parallelism's receives
# fall *between* them, and counting time "inside a forward" would credit the first with its waits
# (`tests/test_trace.py` books one wait both ways and gets the same share):

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
print("(2 ranks on this machine's 2 cores, shared with other processes: times and the share vary run to run)")
if computing["tensor"] > computing["model"]:
    print(f"this run: tensor parallelism's ranks computed at the same moment during more of the passes than model "
          f"parallelism's ({computing['tensor']:.0%} against {computing['model']:.0%})")
else:
    print(f"this run: tensor parallelism's ranks computed at the same moment during no more of the passes than "
          f"model parallelism's ({computing['tensor']:.0%} against {computing['model']:.0%}): this run cannot show "
          f"P10's simultaneous arithmetic")

# %% [markdown]
# Model parallelism is a chain: rank 1 cannot start its forward before rank 0's activations arrive, and
# rank 0 cannot start its backward before the gradients come back, so the two hardly ever compute at the same
# time. Under tensor parallelism both ranks work through the same layer's forward, then the same layer's
# backward, each doing half of it, and meet at each all-reduce; between two all-reduces both compute. How
# much of the passes that is depends on this machine: the stretches of arithmetic between two all-reduces
# are short (the matrices are 64 wide), the all-reduces are gloo messages through the loopback, and when
# other threads and processes also want its 2 cores the operating system may run the two ranks' stretches in
# turns rather than together. The last line printed above compares the shares of this run, and says so when
# it cannot show P10's simultaneous arithmetic. Either way the step times measure waits, scheduling and fixed
# costs more than the arithmetic that was split, and which of the two is faster here changes from run to run.
#
# That is the honest counter-case of P10 (and of P7 in chapter 04): a small model on costly links, where
# the all-reduce of every layer outweighs the arithmetic it splits.
#
# ### P10 where compute dominates: the same comparison on a wide model
#
# Now a model whose layers are wide enough that a rank's share of the arithmetic dwarfs the all-reduce
# after it: 4 residual MLP blocks x + W₂·gelu(W₁·x), 1024 → 4096 → 1024 (Megatron's MLP shape, 8.4 million
# weights a block), on 256 tokens (`coursekit.experiments.tensor_versus_model`). A block's forward is
# 2 × 2 × 256 × 1024 × 4096 ≈ 4.3 GFLOP, split over 2 ranks, against one all-reduce of 256 × 1024 floats
# (1 MiB). On 2 ranks of one thread each (one core each): one process running the whole model (the other rank
# idle), tensor parallelism (every block a `ParallelMLP`), and model parallelism (blocks 1–2 on rank 0, 3–4
# on rank 1). Each iteration runs the three back to back, so their ratios are paired: whatever else the
# machine does at that moment slows all three. The three compute the same loss
# (`tests/test_parallel_tensor_versus.py`).

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
tp, mp = statistics.median(speedup["tensor parallel"]), statistics.median(speedup["model parallel"])
if tp > mp:
    print(f"this run: tensor parallelism is {tp:.2f}× one process and model parallelism {mp:.2f}×: "
          f"on this model tensor parallelism is the faster, as P10 says")
else:
    print(f"this run: tensor parallelism {tp:.2f}×, model parallelism {mp:.2f}×: this run does not show P10")

# %% [markdown]
# Here P10 shows plainly (the last line printed says what this run measured). Tensor parallelism splits every
# block's arithmetic in two and both halves run at once, one per core; what it adds is one 1 MiB all-reduce
# per block each way, small beside the split matrix products, so the step comes close to half of one
# process's (the ideal 2× is not reached: the all-reduces, the GELU and the residual adds on the whole
# activations). Model parallelism also halves each rank's memory for weights, but not the time: rank 1
# waits for rank 0's forward, rank 0 for rank 1's backward, so the ranks compute in turn, and the step is no
# faster than one process's (the activation and its gradient also cross once each way). `python -m
# coursekit.bench tensor --check` measures the same with 11 iterations (targets: tensor parallelism ≥ 1.6×
# one process and faster than model parallelism; docs/benchmarks.md).
#
# On a real GPU the proportions are the reverse of this machine's, **as long as the all-reduces stay on
# NVLink**. The chapter 01 network model (`coursekit.netsim`: the ring all-reduce's transfers, recorded at a
# small size and scaled to this one, each step timed by its busiest link) for one all-reduce of a
# GPT-3-sized layer's activations — $b = 1$ sequence of $s = 2048$ tokens, $h = 12288$, bf16: 50 MB — on a
# tensor group of 8 GPUs, with these assumed links: NVLink 450 GB/s each way per GPU and 2 µs latency inside
# a node; InfiniBand 400 Gb/s (50 GB/s) and 10 µs between nodes. The compute it sits between: a layer's
# forward is about $24\,b s h^2$ floating-point operations, divided over the 8 GPUs, at an assumed
# 400 TFLOP/s each.

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
# Inside a node the two forward all-reduces of a layer cost a fraction of the layer's arithmetic; as soon as
# the tensor group crosses a node, the ring's slowest link is InfiniBand (assumed above at a ninth of NVLink's
# bandwidth), and the all-reduces take longer than the compute they split — at every layer, twice forward and
# twice backward, and in plain Megatron-style tensor parallelism the next matrix product waits for each of
# them (later techniques, such as PyTorch's asynchronous tensor parallelism, overlap part of them with the
# products). That is why tensor parallelism is kept inside a node (degree ≤ GPUs per node, typically 8) and
# the GPUs beyond are combined by data (or pipeline) parallelism.
#
# ## 8. The data × tensor mesh (P8)
#
# **P8**: for models too large for one GPU, data + tensor parallelism combined is the common approach.
# The ranks form a grid, `Mesh({"dp": 2, "tp": 2})`: each row is a tensor group (neighbouring ranks, so
# inside a node when the tensor degree divides the GPUs per node), each column a data group. A data slice of
# the batch goes to each tensor group; gradients are averaged over `dp` only. `train(..., "dp_tp")` on 4
# ranks, global batch 7 (uneven: 4 + 3 sequences), against one process:

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
# Where the groups land on real nodes matters (section 7): the widget colours which global ranks form each
# tensor and each data group for a number of GPUs, GPUs per node and tensor degree, and draws in red a tensor
# group that crosses a node. Its default state, as a static image (so the chapter reads where widgets do not
# render): 8 GPUs, nodes of 4, tp = 2.

# %%
from coursekit.viz.mesh import describe, draw_mesh

draw_mesh(8, 2, 4)
plt.show()
print(describe(8, 2, 4))

# %%
from coursekit.widgets.mesh import mesh_explorer

mesh_explorer(world_size=8, tp=2, gpus_per_node=4)

# %% [markdown]
# Try tp = 8 with 8 GPUs, 4 per node: the single tensor group spans both nodes, so its GPUs are outlined in red
# and the line above the figure says it crosses a node boundary; raise GPUs to 16 (tp stays 8) and both
# tensor groups do.
#
# ## 9. The same thing in production: DTensor's `parallelize_module`
#
# PyTorch expresses the same splits as *placements* of distributed tensors: `ColwiseParallel` shards a
# linear layer's weight `Shard(0)` (output features), `RowwiseParallel` `Shard(1)` and turns its `Partial`
# output into `Replicate` with an all-reduce. `coursekit.parallel.tensor.torch` parallelizes the course
# transformer that way (`torch_parallelize_transformer`: the same plan for every block, the embedding
# `RowwiseParallel`, the tied head `ColwiseParallel` with vocabulary-sharded logits, the loss inside
# `loss_parallel()`). Run on a DTensor mesh `init_device_mesh("cpu", (2,))`, against coursekit's and the dense
# model, with `CommDebugMode` counting PyTorch's collectives:
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
# Same loss, same gradients, same number of all-reduces; the time ratio is the last line printed above. Both
# times measure mostly fixed costs on this machine (section 7): at 64-wide matrices the arithmetic is small
# next to the all-reduces and next to the work around each operation, and an operation on a `DTensor` adds
# its own: it unwraps the local tensors, finds the placements of its result (sharding propagation, cached
# for the same operation on inputs of the same placements and shapes) and wraps the result again. On GPUs
# with large matrices both issue the same NCCL all-reduces around the same matrix products.
#
# **Exercise** `exercises/05_tensor_parallel.ipynb`: write `ColumnParallelLinear` and `RowParallelLinear`
# with their communication operators; graded on outputs, gradients and the number of all-reduces.
