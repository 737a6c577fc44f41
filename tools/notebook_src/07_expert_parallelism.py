# ci_parameters: {"BALANCE_SEEDS": [0], "BALANCE_STEPS": 60, "CAPACITY_SEEDS": [0], "CAPACITY_STEPS": 60, "PACE_TOKENS": 128, "PACE_ITERATIONS": 3, "PACE_SHARES": [0.5, 0.75, 1.0]}
# %% [markdown]
# # 07 · Expert parallelism: many experts, each token visits a few
#
# A transformer block ends in an MLP, and every token goes through all of it. A
# **[mixture of experts](../docs/glossary.md#mixture-of-experts)** (MoE) replaces that one MLP by *E* of them,
# the **experts**, and a small **[router](../docs/glossary.md#router)** that sends each token to *k* of them,
# usually 1 or 2. The model holds E times the MLP's weights, yet a token costs only k MLPs of compute. That is
# how today's largest open models grow: DeepSeek-V3 has 256 routed experts per layer and sends each token to 8.
#
# So many experts do not fit one GPU. **[Expert parallelism](../docs/glossary.md#expert-parallelism)** (EP)
# puts different experts on different GPUs, and moves each token to its experts and back. This chapter builds
# it in four steps: the router, keeping the experts evenly loaded, a capacity limit, and the two
# [all-to-alls](../docs/glossary.md#all-to-all) that move the tokens.

# %% tags=["parameters"]
# Parameters: small by default so the notebook runs in about two minutes; raise them freely.
BALANCE_SEEDS = [0, 1, 2]          # one model per seed and balancing method
BALANCE_STEPS = 300                # Adam steps per model
CAPACITY_SEEDS = [0, 1, 2]         # one model per seed and capacity factor
CAPACITY_STEPS = 300
CAPACITY_FACTORS = [1.0, 1.25, 2.0, None]   # None: dropless
PACE_SHARES = [0.5, 0.625, 0.75, 0.875, 1.0]  # share of every rank's tokens sent to rank 0's experts
PACE_TOKENS = 1024                 # tokens per rank, for the step-time run
PACE_ITERATIONS = 9                # paired iterations of that run

# %%
# %matplotlib inline
import statistics

import torch

import coursekit
from coursekit.comm import Traffic
from coursekit.experiments.expert_balance import ZipfTeacher, imbalance, train_moe
from coursekit.experiments.expert_imbalance import imbalance_times, median_ratios, predicted_ratio
from coursekit.measure.verify import compare
from coursekit.models import LanguageData
from coursekit.parallel.expert import (ExpertParallelMoE, MoE, Router, keep_within_capacity, load_balance_loss,
                                       nudge_bias, tiny_moe)
from coursekit.train import train
from coursekit.viz.expert import (draw_balance, draw_capacity, draw_ep_versus_tp, draw_pace, draw_rows_sent,
                                  draw_tokens_per_expert)

torch.set_num_threads(1)

# %% [markdown]
# ## 1. The router picks a token's experts
#
# Which experts does a token visit? The router decides. A linear layer scores every expert, a softmax turns the
# scores into probabilities, and the k most probable experts are the token's. Their probabilities are its
# **[gates](../docs/glossary.md#gate)**: the weights of its experts' outputs in the sum.

# %%
coursekit.show(Router)

# %% [markdown]
# The layer then runs each expert on the rows routed to it, and adds each token's expert outputs, weighted by
# their gates:

# %%
coursekit.show(MoE.forward)

# %% [markdown]
# Real text is uneven: a few words are most of it. Our tokens imitate that. They come in 256 kinds, and the
# i-th kind is drawn with weight 1/i, as Zipf's law says of words. Where does a fresh router with 8 experts,
# k = 1, send 4,096 such tokens?

# %% tags=["nbval-ignore-output"]
data = ZipfTeacher(seed=0)
layer = MoE(d_model=32, d_ff=64, n_experts=8, k=1, seed=1)
_, chosen, _ = layer.router(torch.nn.functional.layer_norm(data.eval, (32,)))
counts = torch.bincount(chosen.flatten(), minlength=8)
print("assignments per expert:", counts.tolist())
print(f"busiest / mean: {imbalance(counts):.2f}")
draw_tokens_per_expert({"a fresh router, 4,096 tokens": counts.tolist()});

# %% [markdown]
# **Takeaway:** even untrained, the router gives its busiest expert 1.54 times the even share, and its quietest
# less than half: tokens of one kind go the same way.
#
# We call that ratio, busiest expert over the mean, the **[imbalance](../docs/glossary.md#load-imbalance)**.
# It matters because experts run side by side: the busiest one sets the pace (section 5).
#
# ## 2. Keeping the experts evenly loaded
#
# Does training fix the imbalance by itself? No: an expert that gets more tokens learns faster, so the router
# favours it more. Two remedies are in use. The Switch Transformer (Fedus et al. 2021) adds a
# **[balance loss](../docs/glossary.md#balance-loss)**
# to the training loss. Here *f*ᵢ is the share of assignments expert i got and *P*ᵢ the mean probability the
# router gave it:

# %%
coursekit.show(load_balance_loss)

# %% [markdown]
# It is 1 when the load is even and E when one expert takes everything. Its gradient lowers the probability of
# the busy experts.
#
# DeepSeek-V3 (2024) balances mostly without a loss: it keeps only a tiny balance loss per sequence, weighted
# about 1e-4. After each step, every expert's routing **bias** moves a little toward balance. The bias changes
# which experts are chosen, never their gates (see `Router.forward` above):

# %%
coursekit.show(nudge_bias)

# %% [markdown]
# We train a model of two MoE blocks, `x + moe(norm(x))`, to imitate a fixed random MLP on these tokens. Three
# times per seed: without balancing, with the balance loss (weight 0.01), and with the bias nudge (rate 0.001).
# Every 10 steps we route the same 4,096 tokens and record the imbalance of the worse of the two blocks. So
# step 0 is not §1's router: these are other fresh routers, two per model, and the worse one counts.

# %% tags=["nbval-skip"]
METHODS = {"no balancing": {}, "balance loss": {"aux_weight": 0.01}, "bias nudge": {"bias_rate": 1e-3}}
balance = {name: [train_moe(seed, BALANCE_STEPS, **options) for seed in BALANCE_SEEDS]
           for name, options in METHODS.items()}
print(f"{'':<14}{'imbalance at step 0':>21}{f'at step {BALANCE_STEPS}':>14}{'loss':>9}   "
      f"(mean over {len(BALANCE_SEEDS)} seeds)")
for name, runs in balance.items():
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    print(f"{name:<14}{mean([r.imbalance[0] for r in runs]):>21.2f}{mean([r.imbalance[-1] for r in runs]):>14.2f}"
          f"{mean([r.eval_loss for r in runs]):>9.4f}")
draw_balance(balance);

# %% [markdown]
# **Takeaway:** left alone, the imbalance grows from 2.04 to 2.67 as training goes on. The balance loss brings
# it down to 1.54 and the bias nudge to 1.26, and the model fits the task as well.
#
# Here is where one seed's first block routes after training:

# %% tags=["nbval-skip"]
draw_tokens_per_expert({name: runs[0].counts[0].tolist() for name, runs in balance.items()},
                       title=f"tokens per expert after {BALANCE_STEPS} steps (seed {BALANCE_SEEDS[0]}, block 0)");

# %% [markdown]
# ## 3. A capacity limit drops what does not fit
#
# GShard and Switch give every expert a fixed **capacity**, set by a
# **[capacity factor](../docs/glossary.md#capacity-factor)**: at most C = ⌈factor · k · T / E⌉ of a batch's T
# tokens, rounded up. Fixed sizes suit accelerators. An expert keeps the first C assignments it is given, first
# choices before second choices; the rest are **dropped**. A dropped token skips the layer: its output is its input.
# Under expert parallelism, T is one rank's tokens: each rank counts C for itself, as GShard's groups do, so an
# expert may receive up to C rows from every rank. Applying the rule inside `dispatch` is part of exercise 07;
# here is what it keeps for 6 tokens, k = 2, 3 experts and factor 1.0, so C = ⌈1 · 2 · 6 / 3⌉ = 4:

# %% tags=["nbval-check-output"]
chosen = torch.tensor([[0, 1], [0, 2], [0, 1], [0, 2], [0, 1], [1, 0]])  # each token's first and second choice
kept = keep_within_capacity(chosen, n_experts=3, factor=1.0)
for token, (choices, keep) in enumerate(zip(chosen.tolist(), kept.tolist())):
    print(f"token {token}: " + ", ".join(f"expert {e} {'kept' if k else 'DROPPED'}" for e, k in zip(choices, keep)))

# %% [markdown]
# We train with the balance loss at capacity factors 1.0, 1.25 and 2.0, and without a limit (dropless). Then
# we count what the limit drops on the evaluation tokens, and the loss:

# %% tags=["nbval-skip"]
capacity = {("dropless" if f is None else f"{f:g}"): [train_moe(seed, CAPACITY_STEPS, aux_weight=0.01,
                                                                capacity_factor=f) for seed in CAPACITY_SEEDS]
            for f in CAPACITY_FACTORS}
print(f"factor    dropped    loss   (mean over {len(CAPACITY_SEEDS)} seeds)")
for name, runs in capacity.items():
    dropped, loss = (sum(values) / len(runs) for values in zip(*[(r.dropped, r.eval_loss) for r in runs]))
    print(f"{name:<8}{100 * dropped:>8.1f}%{loss:>9.4f}")
draw_capacity(capacity);

# %% [markdown]
# **Takeaway:** at factor 1.0 the busy experts overflow: 10% of assignments are dropped and the loss doubles,
# from 0.0444 without a limit to 0.0891. At 1.25 only 1.6% are dropped, and at 2.0 none.
#
# ## 4. Experts on different ranks: dispatch and combine
#
# Now spread the experts. With `ep` ranks, rank r keeps experts r·E/ep to (r+1)·E/ep − 1, and the whole
# router. Each rank routes its own tokens. Then two steps:
#
# * **[dispatch](../docs/glossary.md#dispatch-and-combine)**: every rank first tells every other how many rows
#   it will send, since a receiver cannot know. Then one [all-to-all](../docs/glossary.md#all-to-all) sends
#   each assignment's token to the rank of its expert. The pieces are uneven: each holds whatever the router
#   chose.
# * **combine**: after the experts run, a second all-to-all sends every output back to its token's rank, where
#   it is weighted by its gate and summed.
#
# Backward runs through both all-to-alls in reverse. You write dispatch and combine in this chapter's exercise;
# here we run the library's. Four ranks, each with its own tokens, 8 experts, k = 2:

# %% tags=["nbval-ignore-output"]
moe = MoE(d_model=32, d_ff=64, n_experts=8, k=2, seed=3)
tokens = [ZipfTeacher(seed=rank).sample(n) for rank, n in enumerate([300, 250, 280, 310])]  # uneven on purpose


def on_four_ranks(rank, world_size):
    layer = ExpertParallelMoE(moe)  # this rank's 2 experts, and the router
    with coursekit.comm.record() as traffic:
        out, _ = layer(tokens[rank])
    return out, traffic


runs = coursekit.launch(on_four_ranks, 4)
worst = max((runs[r][0] - moe(tokens[r])[0]).abs().max().item() for r in range(4))
print(f"largest difference from the one-process layer: {worst:.1e}")  # float32 rounding at most: 1e-6

traffic = Traffic.merge([t for _, t in runs])
rows = [[0] * 4 for _ in range(4)]
for sent in traffic.payload:             # dispatch's messages: rows of 32 numbers from rank src to rank dst
    if sent.phase == "dispatch":
        rows[sent.src][sent.dst] += sent.numel // 32
for r in range(4):                       # the diagonal: assignments whose expert is on their own rank
    rows[r][r] = int((moe.router(tokens[r])[1] // 2 == r).sum())
leaving = sum(rows[i][j] for i in range(4) for j in range(4) if i != j)
print(f"rows leaving their rank: {leaving:,};  counted: {traffic.total:,} elements = 2 x rows x d = "
      f"{2 * leaving * 32:,}")
draw_rows_sent(rows, "dispatch: rows from rank i to rank j (diagonal: stayed)");

# %% [markdown]
# **Takeaway:** spread over four ranks, the layer computes exactly what it computes on one. What travels is
# exactly the tokens that leave their rank, once out and once back.
#
# The same holds for training. The strategy `"expert"` averages the router and other dense weights over all
# ranks, and each expert over the ranks that hold a copy of it: its
# **[expert-data-parallel group](../docs/glossary.md#expert-data-parallel-group)**, as Megatron and DeepSpeed
# call it. Two copies of two expert ranks, against one process:

# %% tags=["nbval-check-output"]
CONFIG = dict(model=lambda: tiny_moe(n_experts=4, k=2), data=LanguageData(vocab_size=16), steps=3,
              global_batch=7)
reference = train(0, 1, "single", **CONFIG)["records"]
ranks = coursekit.launch(lambda rank, world_size: train(rank, world_size, "expert", ep=2, **CONFIG)["records"], 4)
print("dp 2 x ep 2 trains like one process:", compare(reference, ranks, check_output=False).ok)

# %% [markdown]
# **Takeaway:** on a data × expert mesh, three Adam steps match one process: loss, gradients and weights.
#
# ## 5. The slowest rank sets the pace
#
# Combine cannot finish before every rank has run its experts. So a step lasts as long as the busiest rank
# takes. To see it, the experts must be wide enough that computing dominates: 4 experts, 512 → 2,048 → 512,
# two on each of 2 ranks, one core per rank. We fix where the tokens go: a share s of every rank's tokens goes
# to rank 0's experts. Then rank 0 computes 2s of the mean load, and the imbalance is 2 · max(s, 1 − s).
# The dashed line is what the busiest rank's load predicts.

# %% tags=["nbval-skip"]
times = coursekit.launch(imbalance_times, 2, PACE_SHARES, tokens=PACE_TOKENS, iterations=PACE_ITERATIONS)[0]
ratios = median_ratios(times)
loads = [2 * max(s, 1 - s) for s in PACE_SHARES]
predicted = [predicted_ratio(times, load) for load in loads]
print(f"an even step spends {statistics.median(times['experts']) / statistics.median(times[PACE_SHARES[0]]):.0%} "
      "of its time in the experts")
print(" share  imbalance   step time / even step: median [range]   predicted")
for s, load, guess in zip(PACE_SHARES, loads, predicted):
    median, low, high = ratios[s]
    print(f"{s:>6.3f}{load:>10.2f}{median:>16.2f}  [{low:.2f}, {high:.2f}]{guess:>18.2f}")
draw_pace(loads, [ratios[s] for s in PACE_SHARES], predicted);

# %% [markdown]
# **Takeaway:** the step time follows the busiest rank's load. When every token goes to one rank's experts, the
# step takes 1.81 times as long as an even one, near the 1.87 that rank's load predicts.
#
# The other rank sits idle meanwhile. That is why balance matters to speed, not only to accuracy.
#
# <details><summary>How this was measured</summary>
#
# Each iteration times every share back to back, and each ratio divides by the same iteration's even step, so
# a slow moment of the machine slows both. A barrier starts and ends each step on both ranks. The prediction
# times the experts alone, on an even load's rows and on twice as many. The difference is what one more even load
# costs; the busiest rank adds it, times the imbalance minus one, to the even step. The rest of the step does not
# grow with the load: routing, the all-to-alls, and the experts' weight gradients.
# Gradients accumulate from step to step: freeing them each step would time the memory allocator.
# </details>
#
# ## 6. When do experts travel less than tensor parallelism?
#
# Tensor parallelism could split each expert instead (chapter 05): every rank holds a slice of every expert.
# Then every token must meet every slice. With p ranks, each holding T tokens of d numbers, a forward sends per
# rank:
#
# * **EP**: the token rows that leave, out and back: about 2 · (p − 1)/p · k · T · d numbers;
# * **TP**: all tokens gathered to every rank and the outputs reduce-scattered back: 2 · (p − 1) · T · d.
#
# So EP sends k/p of what TP sends. We count EP's bytes on real ranks and set them beside both formulas:

# %% tags=["nbval-ignore-output"]
T, D = 256, 32
counted, ep_formula, tp_formula = {}, [], []
for p in (2, 4, 8):
    layer_p = MoE(d_model=D, d_ff=64, n_experts=8, k=2, seed=5)
    batch = [torch.randn(T, D, generator=torch.Generator().manual_seed(r)) for r in range(p)]

    def count(rank, world_size, layer_p=layer_p, batch=batch):
        with coursekit.comm.record() as traffic:
            ExpertParallelMoE(layer_p)(batch[rank])
        return traffic.total

    counted[p] = sum(coursekit.launch(count, p)) / p * 4 / 2**10  # KiB per rank
    ep_formula.append(2 * (p - 1) / p * 2 * T * D * 4 / 2**10)
    tp_formula.append(2 * (p - 1) * T * D * 4 / 2**10)
print(" p   EP counted   EP formula   TP formula   (KiB per rank, forward, k = 2)")
for p, ep_f, tp_f in zip(counted, ep_formula, tp_formula):
    print(f"{p:>2}{counted[p]:>12.1f}{ep_f:>13.1f}{tp_f:>13.1f}")
draw_ep_versus_tp(list(counted), {"EP counted": list(counted.values()), "EP formula (even routing)": ep_formula,
                                  "TP formula": tp_formula}, unit="KiB");

# %% [markdown]
# **Takeaway:** with k = 2, EP and TP send the same at 2 ranks, and at 8 ranks EP sends a quarter of TP's
# bytes. The more experts' ranks, the bigger EP's advantage.
#
# EP's counted bytes sit near the even-routing formula, not on it: the router's real choices decide how many
# rows leave each rank. Production systems also weigh what this count leaves out: all-to-all crosses between
# nodes, where links are slowest, while tensor parallelism usually stays inside one.
#
# ## 7. The same layer in production: torchtitan
#
# PyTorch's own training stack, torchtitan, has a dropless MoE with expert parallelism. Set to a softmax, its
# router is ours: top-k, and a bias that chooses but never weighs, nudged from the all-reduced counts as in
# section 2. Its default is DeepSeek-V3's router instead (`score_func="sigmoid"`), which differs from ours in two
# places. Each expert's score is a sigmoid of its own logit, not a softmax over all experts, and the bias is added
# to those scores to choose the top k. Then the chosen scores are divided by their sum to give the gates.
# Its dispatch exchanges counts, then rows, with `all_to_all_single`, as ours does. Two differences: its experts
# are SwiGLU MLPs in bf16, and it has no capacity limit. So we hand it our GELU experts' math through its own
# grouped matrix product, and give both layers the same weights and tokens on 2 ranks:

# %% tags=["nbval-ignore-output"]
from coursekit.parallel.expert.torch import torchtitan_moe, torchtitan_step  # noqa: E402


def beside_torchtitan(rank, world_size):
    x = tokens[rank]
    grad_out = torch.randn(x.shape, generator=torch.Generator().manual_seed(rank))
    ours = ExpertParallelMoE(moe)                   # section 4's layer: 8 experts, k = 2, 4 on each rank
    x_ours = x.clone().requires_grad_()
    out, _ = ours(x_ours)
    out.backward(grad_out)
    theirs_out, theirs = torchtitan_step(torchtitan_moe(moe), x, grad_out)
    differences = {"output": out.detach() - theirs_out, "token gradients": x_ours.grad - theirs["x"],
                   "expert gradients": ours.experts.w1.grad - theirs["w1"]}
    return {name: d.abs().max().item() for name, d in differences.items()}


for name, value in coursekit.launch(beside_torchtitan, 2)[0].items():
    print(f"largest difference, {name}: {value:.1e}")

# %% [markdown]
# **Takeaway:** torchtitan's expert-parallel layer and ours compute the same outputs and gradients, bit for bit.
#
# <details><summary>How this was compared</summary>
#
# torchtitan 0.3.0 is installed without its training dependencies (`make lab` does it). Its experts' weights are
# made distributed tensors split by expert over a one-axis device mesh, as its `parallelize` does, and its
# dispatcher is handed that mesh. On gloo its `"partial_dtensor"` backend is used: the default one sends the
# uneven pieces as a list, which gloo refuses. The tests compare every gradient at 2 and 4 ranks, and its stock
# bf16 SwiGLU experts against a SwiGLU version of ours, within bf16's rounding.
# </details>
#
# **Exercise** `exercises/07_dispatch_combine.ipynb`: write dispatch and combine from the router's choices: the
# capacity and its drops, the counts, the two all-to-alls, and the gate-weighted sum.
