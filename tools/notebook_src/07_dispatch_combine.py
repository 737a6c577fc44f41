# %% [markdown]
# BEGIN SOLUTION
# # Solution 07 · Expert parallelism: write dispatch and combine
# EXERCISE: # # Exercise 07 · Expert parallelism: write dispatch and combine
# END SOLUTION
#
# In `notebooks/07_expert_parallelism.ipynb` a mixture-of-experts (MoE) layer replaced one MLP by E of them, the
# *experts*, and a *router* sent each token to k of them. With *expert parallelism* the experts live on different
# ranks: each of the ep ranks of a group holds E/ep of them. A token must travel to the ranks of its experts, and
# their outputs must come back. Here you write those two moves, with the library's signatures:
#
# 1. **`dispatch(x, routing, group=None) -> (rows, rows_per_local_expert, plan)`**. `x` is this rank's tokens,
#    `(T, d)`. Send each *assignment* (a token and one of its experts) as one row to the rank that holds its expert.
#    Return `rows`, every row that arrived, grouped by your experts (all rows of your first expert, then all of
#    your second, …); `rows_per_local_expert`, a list of E/ep counts, one per expert of yours; and `plan`: whatever
#    `combine` needs to send the outputs back (your choice).
# 2. **`combine(y, routing, plan, tokens, group=None) -> out`**. `y` is your experts' outputs, one row per row of
#    `rows`, in the same order. Send each row back to the rank its token came from; there, multiply it by its
#    gate and add it into its token's row. `out` is `(tokens, d)`: a token whose every assignment was dropped
#    gets zeros.
#
# **The layout.** Experts are numbered 0 … E−1 and laid out in order: rank r of the group holds experts
# r·E/ep … (r+1)·E/ep − 1. Its *local* expert e is expert r·E/ep + e.
#
# **The routing** is given: `route(router, x, E, capacity_factor)` returns `(probs, chosen, routing)`. `routing`
# lists this rank's assignments kept within capacity, sorted by expert, then token:
# * `routing.per_expert`: a tensor of E counts, how many of this rank's assignments each expert got;
# * `routing.token`: which of your tokens each assignment is, so `x[routing.token]` holds one row per assignment,
#   expert 0's rows first, then expert 1's, …;
# * `routing.gate`: each assignment's gate, the weight of its expert's output.
#
# **Counts first.** The rows move in one uneven *all-to-all*: every rank sends a different number of rows to each
# rank. A receive must know its size before the data arrive, and only the sender knows it. So exchange the counts
# first, one per (rank, expert), inside `with comm.control():` — they are bookkeeping, counted as control traffic,
# not payload.
#
# **Regroup.** The rows arrive grouped by sender (rank 0's, then rank 1's, …), each sender's by expert.
# `Experts.forward(rows, rows_per_expert)` wants them grouped by expert. Reorder them, and keep the order in
# `plan`: combine must undo it before the rows go back.
#
# **The tools.** `all_to_all(tensor, 0, 0, send_sizes, receive_sizes, group)` (from
# `coursekit.parallel.sequence.comm`) cuts `tensor`'s rows into pieces of `send_sizes` rows (piece j for rank j,
# your own included) and returns what every rank sent you, in rank order (`receive_sizes[j]` rows from rank j).
# Empty pieces are fine. It is differentiable (its backward is the reverse all-to-all), so gradients flow back
# through both of yours, and it is built on `coursekit.comm`'s counted `isend`/`irecv`; while grading,
# `torch.distributed`'s own collectives are switched off. `comm.get_world_size(group)` says how many ranks the group
# has and `comm.get_rank(group)` which one you are: pass `group` to every call.
#
# **Grading** (`check_dispatch_combine`, on the simulator in float64, against the one-process `MoE` on the same
# weights and tokens): `dispatch_rows`, each rank gets exactly its experts' rows, grouped by expert, and their
# counts; `outputs_equal_one_process`, every token's output at ep = 1, 2 and 4, E = 4 and 8, k = 1 and 2, dropless
# and with capacity; `skewed_routing`, every token's first choice one expert, so some ranks receive nothing and one
# rank has no tokens; `gradients_equal_one_process`, the gradients of x, the router and each expert; `traffic`,
# each way, each rank sends each rank exactly the rows for its experts (d × 8 bytes a row), the counts as control
# traffic; `process_groups`, 4 real ranks as two expert-parallel groups {0, 1} and {2, 3}; and a hidden check at
# sizes not shown here. From a terminal: `make grade NB=exercises/07_dispatch_combine.ipynb`.

# %% tags=["parameters"]
# Parameters: the try-it cells' sizes, and seconds a check may run (raise it on a slow machine).
RANKS = 2
EXPERTS = 4
TOP_K = 2
CHECK_TIMEOUT = 60.0

# %%
import torch

from coursekit import comm
from coursekit.grading import check_dispatch_combine
from coursekit.parallel.expert import MoE, route
from coursekit.parallel.sequence.comm import all_to_all

# %% [markdown]
# ## What you receive
#
# One rank's 5 tokens, routed to k = `TOP_K` of `EXPERTS` experts, dropless. The assignments come sorted by expert:
# `token` says which token each row is, `per_expert` how many rows each expert gets.

# %%
moe = MoE(d_model=8, d_ff=16, n_experts=EXPERTS, k=TOP_K, seed=0)
x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
probs, chosen, routing = route(moe.router, x, EXPERTS, capacity_factor=None)
print("each token's experts:", chosen.tolist())
print("routing.per_expert:  ", routing.per_expert.tolist())
print("routing.token:       ", routing.token.tolist())
print("routing.gate:        ", [round(g, 3) for g in routing.gate.tolist()])

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
# `routing.per_expert.view(ep, E // ep)` is a table: row j holds the counts for rank j's experts. Exchanged (each
# rank sends row j to rank j), it becomes the counts of what every rank sends *you*, per expert of yours: what
# you need to size the receive and to regroup.


# %%
def dispatch(x, routing, group=None):
# BEGIN SOLUTION
    ep = comm.get_world_size(group)
    local = len(routing.per_expert) // ep                          # experts per rank
    send = routing.per_expert.view(ep, local)                      # send[j, e]: rows for rank j's expert e
    with comm.control():                                           # bookkeeping, not payload
        receive = all_to_all(send, 0, 0, [1] * ep, [1] * ep, group)  # receive[j, e]: rank j's rows for our expert e
    rows = all_to_all(x[routing.token], 0, 0, send.sum(1).tolist(), receive.sum(1).tolist(), group)
    # they arrived grouped by sender, then expert; our experts want them by expert, then sender
    pieces = torch.arange(len(rows)).split(receive.flatten().tolist())
    order = torch.cat([pieces[j * local + e] for e in range(local) for j in range(ep)])
    return rows[order], receive.sum(0).tolist(), (send, receive, order)
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("exchange the counts, all_to_all the rows, regroup them by expert")
# END SOLUTION


# %% [markdown]
# Try it on `RANKS` simulated ranks, each with its own tokens (5, 8, … of them): how many rows each rank's experts
# get, against the routing of every rank.

# %%
SIZES = [5, 8, 6, 11, 7, 9, 4, 10][:RANKS]
moe = MoE(d_model=8, d_ff=16, n_experts=EXPERTS, k=TOP_K, seed=7)
tokens = [torch.randn(n, 8, generator=torch.Generator().manual_seed(100 + r)) for r, n in enumerate(SIZES)]
per_expert = sum(route(moe.router, t, EXPERTS, None)[2].per_expert for t in tokens)
local = EXPERTS // RANKS


def try_dispatch(rank, world_size):
    rows, rows_per_local_expert, plan = dispatch(tokens[rank], route(moe.router, tokens[rank], EXPERTS, None)[2])
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
# Undo the regrouping (put `y`'s rows back in the order they arrived), send them back (the all-to-all with the
# sizes swapped), then add each row, times its gate, into its token's row: `index_add` with `routing.token`.


# %%
def combine(y, routing, plan, tokens, group=None):
# BEGIN SOLUTION
    send, receive, order = plan
    back = torch.empty_like(y).index_copy(0, order, y)             # grouped by sender again
    mine = all_to_all(back, 0, 0, receive.sum(1).tolist(), send.sum(1).tolist(), group)
    return y.new_zeros(tokens, y.shape[1]).index_add(0, routing.token, mine * routing.gate.unsqueeze(1))
# EXERCISE:     # YOUR CODE HERE
# EXERCISE:     raise NotImplementedError("undo the regrouping, all_to_all the rows back, add them times their gates")
# END SOLUTION


# %% [markdown]
# Try both on `RANKS` simulated ranks against the one-process layer: each rank keeps its experts
# (`moe.experts.part`), and its tokens' outputs should equal what `moe` computes for them on one process.

# %%
def try_layer(rank, world_size):
    x = tokens[rank]
    routing = route(moe.router, x, EXPERTS, None)[2]
    experts = moe.experts.part(rank * local, local)
    rows, rows_per_local_expert, plan = dispatch(x, routing)
    out = combine(experts(rows, rows_per_local_expert), routing, plan, x.shape[0])
    return torch.allclose(out, moe(x)[0], atol=1e-5)


try:
    print("every rank's output equals one process:", all(comm.simulate(try_layer, RANKS).results))
except comm.SimulatorError as error:
    print(str(error).strip().splitlines()[-1])

# %% [markdown]
# ## The grader

# %%
report = check_dispatch_combine(dispatch, combine, timeout=CHECK_TIMEOUT)
