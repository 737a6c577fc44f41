# %% [markdown]
# BEGIN SOLUTION
# # Solution 08 · Choosing a strategy: lay out any training run
# EXERCISE: # # Exercise 08 · Choosing a strategy: lay out any training run
# END SOLUTION
#
# Chapters 02–06 each measured one way of spreading a model over GPUs; chapter 08's cost model
# (`coursekit.costmodel`) adds them up: memory per GPU (parameters, gradients, optimizer state, activations)
# and the time of one training step (compute, the pipeline's bubble, the communication left exposed), for any
# **layout** `dp × tp × pp × sp` with a ZeRO stage, a schedule, its micro-batches and a recomputation.
#
# You write **`choose_layout(scenario)`**: a `Layout` for *any* training run, decided from its numbers. Three
# runs to try it on (`scenario.key`):
#
# | key | model | GPUs | global batch |
# |---|---|---|---|
# | `"125m"` | GPT-3 Small, 125 M parameters (h = 768, 12 layers, 12 heads) | 8, one node | 256 × 2,048 tokens |
# | `"13b"` | GPT-3 13B (h = 5,120, 40 layers, 40 heads) | 8, one node | 128 × 2,048 tokens |
# | `"175b"` | GPT-3 175B (h = 12,288, 96 layers, 96 heads) | 1,024, 128 nodes of 8 | 1,536 × 2,048 tokens |
#
# The grader runs three more it does not show you, of the same kinds at other sizes: so your function reads
# `scenario.config` (`.heads`, `.layers`, ...), `.hardware` (`.memory`, `.gpus_per_node`), `.gpus` and
# `.global_batch`, never the key. Here every GPU is an A100 with 80 GB, priced by shape (`Hardware.a100()`: each
# matmul at the share of peak its size reaches); NVLink inside a node (300 GB/s), InfiniBand between nodes
# (25 GB/s per GPU). `Layout(dp=, tp=, pp=, sp=, zero=, schedule=, micro_batches=,
# recompute=, sequence_parallel=)`: `micro_batches` is `m`, how many micro-batches each data-parallel replica cuts
# its share of the batch into.
#
# **Grading** (`check_choose_layout`), one point per run in each check: the layout is valid (the degrees
# multiply to the GPUs and divide the heads and the layers, `dp × m` divides the batch, a pipeline has `m ≥ p`);
# it fits in the GPU's memory; and it **follows chapter 08**: a model whose states fit one GPU runs on data
# parallelism alone; tp stays inside a node; a pipeline only where every layout without one is more than 10%
# slower than the planner's best, and then with a bubble under a fifth of the step; the step within 1.5× the
# planner's best, the factor its time model is checked to. A hidden check runs the same on the three runs you do
# not see. The planner's search (`plan`, `brute_force`, `layouts`) refuses while your function is graded, and from
# the first cell under `coursekit grade`: choose with the numbers. `evaluate` -- one layout's memory, step time
# and reasons -- is your calculator. From a terminal: `make grade NB=exercises/08_choose_a_layout.ipynb`.

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
# What the chapter found, to reason with -- in this order:
#
# 1. **the model's states fit one GPU → data parallelism alone** (P1, P10): `model_state_bytes(num_params(config)
#    .total).total` against `hardware.memory`; the only communication is one all-reduce of the gradients a step;
# 2. **too large → tensor parallelism inside a node + data parallelism** (P8), ZeRO-1 to shard Adam's state over
#    dp: tp's all-reduces (4 a layer and micro-batch) are cheap on NVLink, ten times dearer across nodes;
# 3. **still too large → a pipeline across nodes** (P10): it pays only where nothing else fits well, and its
#    bubble `(p − 1)/(m + p − 1)` needs many micro-batches (P7);
# 4. **activations** shrink with more micro-batches, recomputation, and tp with `sequence_parallel`.
#
# Try layouts here (change `TRY` or the layouts); the grader prices them exactly so.

# %%
for layout in (Layout(dp=8, micro_batches=8), Layout(dp=8, zero=3, micro_batches=8), Layout(tp=8, micro_batches=16)):
    print(layout)
    price(SCENARIOS[TRY], layout)

# %% [markdown]
# ## Your function
#
# Write it as the chapter reasons, step by step: each step tries its layouts with `evaluate` and keeps the first
# that fits. The helper `first_that_fits` is yours to keep.

# %%
from coursekit.costmodel import Layout, evaluate, model_state_bytes, num_params


def choose_layout(scenario):
    """A Layout for any scenario (.config, .hardware, .gpus, .global_batch), by chapter 08's rules."""
    config, hardware, gpus, batch = scenario.config, scenario.hardware, scenario.gpus, scenario.global_batch

    def first_that_fits(candidates):
        # the first layout that can run and fits in memory; evaluate refuses what cannot run
        for layout in candidates:
            try:
                if evaluate(config, layout, hardware, batch).fits:
                    return layout
            except ValueError:
                continue
        return None

# BEGIN SOLUTION
    def micro_batch_counts(dp, at_least=1):
        # every m that splits this replica's share of the batch evenly, fewest first (larger micro-batches)
        share = batch // dp if batch % dp == 0 else 0
        return [m for m in range(at_least, share + 1) if share % m == 0]

    # 1. The model's states fit one GPU: data parallelism alone (P1, P10); micro-batches for the activations.
    if model_state_bytes(num_params(config).total).total <= hardware.memory:
        layout = first_that_fits(Layout(dp=gpus, micro_batches=m) for m in micro_batch_counts(gpus))
        if layout:
            return layout
    # 2. Too large: tensor parallelism inside a node, ZeRO-1 over the rest (P8). The smallest tp that fits.
    node = [t for t in range(2, hardware.gpus_per_node + 1) if config.heads % t == 0 and gpus % t == 0]
    for tp in node:
        dp = gpus // tp
        layout = first_that_fits(Layout(dp=dp, tp=tp, zero=1 if dp > 1 else 0, micro_batches=m)
                                 for m in micro_batch_counts(dp))
        if layout:
            return layout
    # 3. Too large for a node's tensor group: a pipeline across nodes, tp filling each node, and enough
    #    micro-batches that the bubble (p - 1)/(m + p - 1) stays under a tenth of the step.
    tp = max(node)
    for pp in (p for p in range(2, config.layers + 1) if config.layers % p == 0 and gpus % (tp * p) == 0):
        dp = gpus // (tp * pp)
        layout = first_that_fits(Layout(dp=dp, tp=tp, pp=pp, zero=1 if dp > 1 else 0, micro_batches=m)
                                 for m in micro_batch_counts(dp, at_least=9 * (pp - 1)))
        if layout:
            return layout
    raise ValueError(f"no layout found for {scenario.title}")
# EXERCISE:     # YOUR CODE HERE: 1. data parallelism alone if the model's states fit one GPU; 2. tp inside a node with
# EXERCISE:     # ZeRO-1 over dp; 3. a pipeline across nodes, with enough micro-batches for a small bubble.
# EXERCISE:     raise NotImplementedError("return a Layout for any scenario, by chapter 08's rules")
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
