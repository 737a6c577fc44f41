# %% [markdown]
# BEGIN SOLUTION
# # Solution 07 · Expert parallelism: write dispatch and combine
# EXERCISE: # # Exercise 07 · Expert parallelism: write dispatch and combine
# END SOLUTION
#
# In `notebooks/07_expert_parallelism.ipynb` a mixture-of-experts (MoE) layer replaced one MLP by E of them, the
# *experts*, and a *router* sent each token to k of them. With *expert parallelism* the experts live on different
# ranks: each of the ep ranks of a group holds E/ep of them. A token must travel to the ranks of its experts, and
# their outputs must come back. Here you write that whole path, from the router's choices to each token's output:
#
# 1. **`dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None) -> (rows, rows_per_local_expert,
#    plan)`**. `x` is this rank's tokens, `(T, d)`; `chosen` and `gates`, both `(T, k)`, are what the router
#    returned for them: column 0 each token's first choice of expert and its weight, column 1 its second, ….
#    Each (token, chosen expert) pair is an *assignment*. Keep the assignments each expert has room for (below),
#    send each kept one as its token's row to the rank that holds its expert, and return `rows`, every row that
#    arrived, grouped by your experts (all rows of your first expert, then all of your second, …);
#    `rows_per_local_expert`, a list of E/ep counts, one per expert of yours; and `plan`: whatever `combine` needs
#    (your choice).
# 2. **`combine(y, plan, tokens, group=None) -> out`**. `y` is your experts' outputs, one row per row of `rows`, in
#    the same order. Send each row back to the rank its token came from; there, multiply it by its gate and add
#    it into its token's row. `out` is `(tokens, d)`: a dropped assignment adds nothing, and a token whose every
#    assignment was dropped gets zeros.
#
# **The layout.** Experts are numbered 0 … E−1 and laid out in order: rank r of the group holds experts
# r·E/ep … (r+1)·E/ep − 1. Its *local* expert e is expert r·E/ep + e.
#
# **Capacity.** With `capacity_factor=None` every assignment is kept (dropless). Otherwise each expert takes at most
# C = ⌈factor · k · T / E⌉ of this rank's assignments, T this rank's token count: each rank counts its own capacity,
# as the one-process `MoE` does on each batch. When more want in, an expert keeps them in this order and drops the
# rest: every token's first choice, in token order, before any second choice, and so on. A dropped assignment
# travels nowhere.
#
# **Counts first.** The rows move in one uneven *all-to-all*: every rank sends a different number of rows to each
# rank. A receive must know its size before the data arrive, and only the sender knows it. So first tell every rank
# how many rows you send to each of its experts, with the same `all_to_all`, inside `with comm.control():` — counts
# are bookkeeping, counted as control traffic, not payload.
#
# **Regroup.** The rows arrive grouped by sender (rank 0's, then rank 1's, …), each sender's by expert if you sent
# them so. `Experts.forward(rows, rows_per_expert)` wants them grouped by expert; combine's way back needs them
# grouped by sender again.
#
# **The tools.** `all_to_all(tensor, 0, 0, send_sizes, receive_sizes, group)` (from
# `coursekit.parallel.sequence.comm`) cuts `tensor`'s rows into pieces of `send_sizes` rows (piece j for rank j,
# your own included) and returns what every rank sent you, in rank order (`receive_sizes[j]` rows from rank j).
# Empty pieces are fine. It is differentiable (its backward is the reverse all-to-all), so gradients flow back
# through both of yours, and it is built on `coursekit.comm`'s counted `isend`/`irecv`; while grading,
# `torch.distributed`'s own collectives are switched off, and so are the library's `dispatch`, `combine`, `route`
# and `keep_within_capacity`: the capacity rule is yours to write. `comm.get_world_size(group)` says how many ranks
# the group has and `comm.get_rank(group)` which one you are: pass `group` to every call. Plain torch is yours.
#
# **Grading** (`check_dispatch_combine`, on the simulator in float64, against the one-process `MoE` on the same
# weights and tokens): `dispatch_rows`, each rank gets exactly its experts' rows, grouped by expert, and their
# counts; `outputs_equal_one_process`, every token's output at ep = 1, 2 and 4, E = 4 and 8, k = 1 and 2, dropless
# and with capacity; `skewed_routing`, every token's first choice one expert, so some ranks receive nothing and one
# rank has no tokens; `gradients_equal_one_process`, the gradients of x, the router and each expert; `capacity`,
# batches where experts overflow: the right assignments dropped; `traffic`, each way, each rank sends each rank
# exactly the kept rows for its experts (d × 8 bytes a row), the counts as control traffic; `process_groups`,
# 4 real ranks as two expert-parallel groups {0, 1} and {2, 3}; and a hidden check at sizes not shown here. A
# property (traffic, groups, hidden sizes) scores only once the answer is right. From a terminal:
# `make grade NB=exercises/07_dispatch_combine.ipynb`.

# %% tags=["parameters"]
# Parameters: the try-it cells' sizes, and seconds a check may run (raise it on a slow machine).
RANKS = 2
EXPERTS = 4
TOP_K = 2
CAPACITY_FACTOR = 1.0
CHECK_TIMEOUT = 60.0

# %%
import math

import torch

from coursekit import comm
from coursekit.grading import check_dispatch_combine
from coursekit.parallel.expert import MoE, route
from coursekit.parallel.sequence.comm import all_to_all

# %% [markdown]
# ## What you receive
#
# One rank's 5 tokens and the router's choices for them: k = `TOP_K` of `EXPERTS` experts each, and their gates.

# %%
moe = MoE(d_model=8, d_ff=16, n_experts=EXPERTS, k=TOP_K, seed=0)
x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
probs, chosen, gates = moe.router(x)
print("chosen (T, k):", chosen.tolist())
print("gates  (T, k):", [[round(g, 3) for g in row] for row in gates.tolist()])

# %% [markdown]
# And one uneven all-to-all on 2 simulated ranks. Rank 0 keeps 1 of its 3 rows and sends 2 to rank 1; rank 1 sends
# all 3 of its rows to itself. Each rank passes what it receives from each rank: rank 0 gets 1 row from itself and
# none from rank 1. Here the receive sizes are written by hand; in `dispatch` they come from the counts.

# %%
def uneven(rank, world_size):
    mine = torch.full((3, 2), float(rank))
    send, receive = ([1, 2], [1, 0]) if rank == 0 else ([0, 3], [2, 3])
    return all_to_all(mine, 0, 0, send, receive).tolist()


for rank, got in enumerate(comm.simulate(uneven, 2).results):
    print(f"rank {rank} received {got}")

# %% [markdown]
# ## Part 1: dispatch
#
# Capacity, then the counts, then the rows, then the regrouping.


# %%
def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
# BEGIN SOLUTION
    ep = comm.get_world_size(group)
    local = n_experts // ep                                        # experts per rank
    tokens, k = chosen.shape
    line = chosen.t().flatten()                                    # every first choice (token order), then seconds
    place = torch.zeros_like(line)                                 # each assignment's place in its expert's line
    for expert in range(n_experts):
        place[line == expert] = torch.arange(int((line == expert).sum()))
    kept = torch.ones_like(line, dtype=torch.bool)
    if capacity_factor is not None:
        kept = place < math.ceil(capacity_factor * k * tokens / n_experts)
    token, expert, gate = torch.arange(tokens).repeat(k)[kept], line[kept], gates.t().flatten()[kept]
    by_expert = torch.argsort(expert, stable=True)
    token, gate = token[by_expert], gate[by_expert]
    send = torch.bincount(expert, minlength=n_experts).view(ep, local)  # send[j, e]: rows for rank j's expert e
    with comm.control():                                           # bookkeeping, not payload
        receive = all_to_all(send, 0, 0, [1] * ep, [1] * ep, group)  # receive[j, e]: rank j's rows for our expert e
    rows = all_to_all(x[token], 0, 0, send.sum(1).tolist(), receive.sum(1).tolist(), group)
    # they arrived grouped by sender, then expert; our experts want them by expert, then sender
    pieces = torch.arange(len(rows)).split(receive.flatten().tolist())
    order = torch.cat([pieces[j * local + e] for e in range(local) for j in range(ep)])
    return rows[order], receive.sum(0).tolist(), (send, receive, order, token, gate)
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("keep within capacity, exchange the counts, all_to_all the rows, regroup them")
# END SOLUTION


# %% [markdown]
# Try it on `RANKS` simulated ranks, each with its own tokens (5, 8, … of them), with capacity factor
# `CAPACITY_FACTOR`: how many rows each rank's experts get, against the library's routing of every rank (`route`
# keeps each expert within capacity as your dispatch should; it runs here, not while grading).

# %%
SIZES = [5, 8, 6, 11, 7, 9, 4, 10][:RANKS]
moe = MoE(d_model=8, d_ff=16, n_experts=EXPERTS, k=TOP_K, capacity_factor=CAPACITY_FACTOR, seed=7)
tokens = [torch.randn(n, 8, generator=torch.Generator().manual_seed(100 + r)) for r, n in enumerate(SIZES)]
per_expert = sum(route(moe.router, t, EXPERTS, CAPACITY_FACTOR)[2].per_expert for t in tokens)
local = EXPERTS // RANKS


def try_dispatch(rank, world_size):
    _, chosen, gates = moe.router(tokens[rank])
    rows, rows_per_local_expert, plan = dispatch(tokens[rank], chosen, gates, EXPERTS, CAPACITY_FACTOR)
    return rows_per_local_expert


try:
    for rank, got in enumerate(comm.simulate(try_dispatch, RANKS).results):
        print(f"rank {rank}: rows per local expert {list(got)}, "
              f"the routing says {per_expert[rank * local:(rank + 1) * local].tolist()}")
except comm.SimulatorError as error:
    print(str(error).strip().splitlines()[-1])

# %% [markdown]
# ## Part 2: combine
#
# The rows go back the way they came, to the ranks of their tokens; each is weighed by its gate there.


# %%
def combine(y, plan, tokens, group=None):
# BEGIN SOLUTION
    send, receive, order, token, gate = plan
    back = torch.empty_like(y).index_copy(0, order, y)             # grouped by sender again
    mine = all_to_all(back, 0, 0, receive.sum(1).tolist(), send.sum(1).tolist(), group)
    return y.new_zeros(tokens, y.shape[1]).index_add(0, token, mine * gate.unsqueeze(1))
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("undo the regrouping, all_to_all the rows back, add them times their gates")
# END SOLUTION


# %% [markdown]
# Try both on `RANKS` simulated ranks against the one-process layer: each rank keeps its experts
# (`moe.experts.part`), and its tokens' outputs should equal what `moe` computes for them on one process.

# %%
def try_layer(rank, world_size):
    x = tokens[rank]
    _, chosen, gates = moe.router(x)
    experts = moe.experts.part(rank * local, local)
    rows, rows_per_local_expert, plan = dispatch(x, chosen, gates, EXPERTS, CAPACITY_FACTOR)
    out = combine(experts(rows, rows_per_local_expert), plan, x.shape[0])
    return torch.allclose(out, moe(x)[0], atol=1e-5)


try:
    print("every rank's output equals one process:", all(comm.simulate(try_layer, RANKS).results))
except comm.SimulatorError as error:
    print(str(error).strip().splitlines()[-1])

# %% [markdown]
# ## The grader

# %%
report = check_dispatch_combine(dispatch, combine, timeout=CHECK_TIMEOUT)
