# %% [markdown]
# BEGIN SOLUTION
# # Solution 07 · Choosing a strategy: lay out three training runs
# EXERCISE: # # Exercise 07 · Choosing a strategy: lay out three training runs
# END SOLUTION
#
# Chapters 02–06 each measured one way of spreading a model over GPUs; chapter 07's cost model
# (`coursekit.costmodel`) adds them up: memory per GPU (parameters, gradients, optimizer state, activations)
# and the time of one training step (compute, the pipeline's bubble, the communication left exposed), for any
# **layout** `dp × tp × pp × sp` with a ZeRO stage, a schedule, its micro-batches and a recomputation.
#
# You write **`choose_layout(scenario)`**: a `Layout` for each of three training runs (`scenario.key`):
#
# | key | model | GPUs | global batch |
# |---|---|---|---|
# | `"125m"` | GPT-3 Small, 125 M parameters (h = 768, 12 layers, 12 heads) | 8, one node | 256 × 2,048 tokens |
# | `"13b"` | GPT-3 13B (h = 5,120, 40 layers, 40 heads) | 8, one node | 128 × 2,048 tokens |
# | `"175b"` | GPT-3 175B (h = 12,288, 96 layers, 96 heads) | 1,024, 128 nodes of 8 | 1,536 × 2,048 tokens |
#
# Every GPU is an A100 with 80 GB; NVLink inside a node (300 GB/s), InfiniBand between nodes (25 GB/s per
# GPU). The vocabulary is GPT-2's, padded to 51,200 as Megatron-LM does. `Layout(dp=, tp=, pp=, sp=, zero=,
# schedule=, micro_batches=, recompute=, sequence_parallel=)`: `micro_batches` is `m`, how many micro-batches
# each data-parallel replica cuts its share of the batch into (`global_batch / (dp · m)` sequences each).
#
# **Grading** (`check_choose_layout`), one point per scenario in each of three checks: the layout is valid
# (the degrees multiply to the GPUs and divide the heads and the layers, `dp × m` divides the batch, a
# pipeline has `m ≥ p`); it fits in 80 GB (`memory_per_gpu`); and its step time is within 10% of the
# planner's best (`plan(...)[0]`). The feedback names what does not fit (which memory term, and what shrinks
# it) or what is slow (the bubble at this `m`, a tp group crossing nodes, the exposed dp collectives).
# The planner's search (`plan`, `brute_force`, `layouts`) refuses while your function is graded, and from the
# first cell under `coursekit grade`: choose with the numbers. `evaluate` -- one layout's memory, step time and reasons -- is your calculator.
# From a terminal: `coursekit grade exercises/07_choose_a_layout.ipynb`.

# %% tags=["parameters"]
# Parameters: the scenario the calculator cell below prices first ("125m", "13b" or "175b").
TRY = "13b"

# %%
from coursekit.costmodel import Layout, evaluate
from coursekit.grading import check_choose_layout
from coursekit.grading.choose_layout import SCENARIOS

# %% [markdown]
# ## The three runs, in numbers
#
# Start where chapter 02 did: with Adam in mixed precision every parameter costs 16 bytes of model states
# (2 + 2 + 12: the 16-bit weights and gradients, an fp32 copy and two moments). Against 80 GB:

# %%
from coursekit.costmodel import num_params

for scenario in SCENARIOS.values():
    n = num_params(scenario.config).total
    print(f"{scenario.key:>5}: {scenario.title}: {n / 1e9:.3g} B parameters, model states {16 * n / 1e9:,.0f} GB "
          f"({16 * n / 80e9:.2g} GPUs' worth); {scenario.global_batch} sequences of {scenario.config.seq_len} tokens")

# %% [markdown]
# ## The calculator: one layout, priced
#
# `evaluate(config, layout, hardware, global_batch)` returns the layout's memory on its most loaded GPU
# (`.memory`, by term), its step time (`.time`: compute, bubble, exposed communication per axis), whether it
# fits (`.fits`) and one line per decision (`.reasons`). Plain data parallelism on the 125 M model:

# %%
def price(scenario, layout, reasons=False):
    """Print what the grader sees of ``layout`` for ``scenario``: refused, or its step time and memory."""
    if layout.gpus != scenario.gpus:
        print(f"{scenario.key}: {layout.gpus} GPUs in this layout, the scenario has {scenario.gpus}")
        return
    try:
        c = evaluate(scenario.config, layout, scenario.hardware, scenario.global_batch)
    except ValueError as refused:
        print(f"{scenario.key}: refused: {refused}")
        return
    print(f"{scenario.key}: step {c.seconds:.3f} s, {c.memory.total / 1e9:.1f} GB per GPU, fits: {c.fits}")
    if reasons:
        print("    " + "\n    ".join(c.reasons))


price(SCENARIOS["125m"], Layout(dp=8), reasons=True)

# %% [markdown]
# The model states are tiny, the activations are not: 32 sequences of 2,048 tokens at once on each GPU.
# That is what `micro_batches` is for (gradient accumulation: the same batch, fewer sequences at a time).
#
# What the chapter found, to reason with:
#
# * **fits one GPU → data parallelism** (P1): the only communication is one all-reduce of the gradients a step;
# * **too large → tensor parallelism inside a node + data parallelism** (P8), or ZeRO to shard the model
#   states over dp: tp's all-reduces (4 a layer and micro-batch) are cheap on NVLink, ten times dearer across
#   nodes;
# * **pipelining** (P10) splits the layers across nodes; it pays when the model does not fit otherwise, and
#   its bubble `(p − 1)/(m + p − 1)` needs many micro-batches;
# * **activations** shrink with more micro-batches, recomputation, and tp with `sequence_parallel`.
#
# Try layouts here (change `TRY` or the layouts); the grader prices them exactly so.

# %%
for layout in (Layout(dp=8, micro_batches=8), Layout(dp=8, zero=3, micro_batches=8), Layout(tp=8, micro_batches=16)):
    print(layout)
    price(SCENARIOS[TRY], layout)

# %% [markdown]
# ## Your layouts

# %%
def choose_layout(scenario):
    """A Layout for scenario.key: "125m", "13b" or "175b" (scenario.config, .hardware, .gpus, .global_batch)."""
# BEGIN SOLUTION
    if scenario.key == "125m":
        # 2 GB of model states fit any GPU: data parallelism on all 8 (one all-reduce a step, on NVLink).
        # 32 sequences at once hold 130 GB of activations: 8 micro-batches of 4 hold 16 GB.
        return Layout(dp=8, micro_batches=8)
    if scenario.key == "13b":
        # 208 GB of model states on 8 GPUs: tp = 2 inside the node halves them, ZeRO-1 shards the optimizer
        # state over dp = 4 (45 GB of states); 32 micro-batches of 1 sequence keep the activations at 26 GB.
        return Layout(dp=4, tp=2, zero=1, micro_batches=32)
    if scenario.key == "175b":
        # Megatron-style: tp = 8 fills each node (NVLink), pp = 8 stages across nodes, dp = 16 pipelines.
        # Narayanan et al. 2021 (Table 1) ran tp 8 x pp 16 x dp 8 without ZeRO; with ZeRO-1 the model states fit
        # in 8 stages. 96 micro-batches of one sequence keep the bubble small, and ZB-H1 shrinks it further.
        return Layout(dp=16, tp=8, pp=8, zero=1, schedule="zb_h1", micro_batches=96)
    raise ValueError(f"unknown scenario {scenario.key!r}")
# EXERCISE:     # YOUR CODE HERE: return one Layout per scenario.key
# EXERCISE:     raise NotImplementedError("return a Layout for each scenario: '125m', '13b' and '175b'")
# END SOLUTION

# %% [markdown]
# Your layouts, priced as the grader will price them:

# %%
for scenario in SCENARIOS.values():
    try:
        price(scenario, choose_layout(scenario))
    except NotImplementedError as error:
        print(f"{scenario.key}: not done yet: {error}")

# %% [markdown]
# ## The grader

# %%
report = check_choose_layout(choose_layout)
