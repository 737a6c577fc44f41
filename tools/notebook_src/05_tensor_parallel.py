# %% [markdown]
# BEGIN SOLUTION
# # Solution 05 · Tensor parallelism: f, g and the column- and row-parallel linear layers
# EXERCISE: # # Exercise 05 · Tensor parallelism: f, g and the column- and row-parallel linear layers
# END SOLUTION
#
# In `notebooks/05_tensor_parallelism.ipynb` you saw one matrix multiplication split over GPUs by columns and by
# rows (**P5**), and Megatron-LM's two communication operators, **f** and **g**, in words. Here you write all four
# pieces: f, g, and the two layers that use them. What each must do is below; how is yours.
#
# ## The contract
#
# **Inputs.** Every rank of a group of `t` ranks builds each layer from the same dense `nn.Linear`, with that
# group: `ColumnParallelLinear(dense, group=None)`, `RowParallelLinear(dense, group=None)`. `group` is a process
# group (a mesh axis such as `mesh.group("tp")`), or None for every rank. f and g are `torch.autograd.Function`
# classes, called as `CopyToParallelRegion.apply(tensor, group)` (f) and `ReduceFromParallelRegion.apply(tensor,
# group)` (g).
#
# **Outputs.**
#
# * **f** returns its input unchanged. Backward, the gradient it returns for its input is the *sum over the
#   group* of the gradients that reach its output on each rank (nothing for `group`).
# * **g** returns the *sum over the group* of its input. Backward, it returns the gradient of its output
#   unchanged.
# * **The column-parallel layer** keeps, as the parameters `self.weight` and `self.bias`, only this rank's share
#   of the *output* features: the dense weight's rows and the bias's entries in `shard_range(dense.out_features,
#   group)`. Called on the whole input `x`, it returns this rank's slice of `dense(x)`'s output features.
# * **The row-parallel layer** keeps this rank's share of the *input* features, the dense weight's columns in
#   `shard_range(dense.in_features, group)`, as `self.weight`, and the whole bias as `self.bias`. Called on this
#   rank's slice of the input features, it returns all of `dense(x)` on every rank.
#
# **The primitives.** `from coursekit.grading.tensor_tools import all_reduce, all_gather, shard_range`:
# `all_reduce(tensor, group=None)` sums in place over the group's ranks and returns the tensor; `all_gather(tensor,
# dim=-1, group=None)` concatenates every rank's tensor; `shard_range(total, group=None)` is `(start, stop)` of
# this rank's share, uneven like `torch.tensor_split` (7 over 3 ranks is 3, 2, 2). Both collectives are counted;
# `torch.distributed`'s own are switched off while grading, and so are the library's own layers, f and g.
# `torch.nn.functional` is yours.
#
# **The properties**, graded on 1, 2, 3 and 4 ranks with sizes the degree does not divide, and on 4 ranks as
# two tensor-parallel groups {0, 1} and {2, 3} of a `Mesh({"dp": 2, "tp": 2})` with different inputs in each:
#
# 1. *the answer*: f and g alone, and each layer, equal one process: the output, the input's gradient, and the
#    gradient of every shard of the weight and the bias, on every rank;
# 2. *the MLP*: `out(gelu(fc(x)))`, `fc` column- and `out` row-parallel, equals the dense MLP, with exactly one
#    all-reduce in forward and one in backward;
# 3. *traffic*, counted by amount: each piece all-reduces only the one tensor that needs summing, in the one pass
#    that needs it, and moves nothing else (no gathered weights).
#
# (2) and (3) score only while (1) is right. The feedback names the case, the rank and the mistake.
# From a terminal: `make grade NB=exercises/05_tensor_parallel.ipynb` (it grades a copy of your file).

# %% tags=["parameters"]
# Parameters: seconds each check may run before it counts as a deadlock (raise it on a slow machine).
CHECK_TIMEOUT = 60.0

# %%
import torch
import torch.nn as nn
import torch.nn.functional as F

import coursekit
from coursekit.grading import check_tensor_parallel
from coursekit.grading.tensor_tools import all_gather, all_reduce, shard_range

# %% [markdown]
# ## Part 1: f and the column-parallel layer
#
# Write `CopyToParallelRegion` (f) and `ColumnParallelLinear` in the cell below.

# %%
# BEGIN SOLUTION
class CopyToParallelRegion(torch.autograd.Function):
    """f: the input as it is forward; the gradient summed over the group backward."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):        # each rank's gradient covers only its own output features: add them up
        return all_reduce(grad.contiguous().clone(), ctx.group), None


class ColumnParallelLinear(nn.Module):
    """nn.Linear with the weight split by output features: this rank's rows of the weight and the bias."""

    def __init__(self, dense: nn.Linear, group=None):
        super().__init__()
        self.group = group
        start, stop = shard_range(dense.out_features, group)
        self.weight = nn.Parameter(dense.weight.detach()[start:stop].clone())
        self.bias = nn.Parameter(dense.bias.detach()[start:stop].clone())

    def forward(self, x):
        return F.linear(CopyToParallelRegion.apply(x, self.group), self.weight, self.bias)
# EXERCISE: # YOUR CODE HERE: f as CopyToParallelRegion, then ColumnParallelLinear (the contract above).
# EXERCISE: CopyToParallelRegion = ColumnParallelLinear = None
# END SOLUTION

# %% [markdown]
# Try it: 2 ranks, a dense `nn.Linear(5, 7)` (4 + 3 output features), against the dense layer.

# %%
def try_column(rank, world_size):
    torch.manual_seed(0)
    dense, x = nn.Linear(5, 7), torch.randn(3, 5)
    start, stop = shard_range(7)
    layer = ColumnParallelLinear(dense)
    inputs = x.clone().requires_grad_(True)
    layer(inputs).sum().backward()
    reference = x.clone().requires_grad_(True)
    dense(reference).sum().backward()
    return (torch.allclose(layer(x), dense(x)[:, start:stop], atol=1e-5),
            torch.allclose(inputs.grad, reference.grad, atol=1e-5))


if ColumnParallelLinear is None:
    print("not done yet: write CopyToParallelRegion and ColumnParallelLinear in the cell above")
else:
    try:
        for rank, (output, grad) in enumerate(coursekit.launch(try_column, 2)):
            print(f"rank {rank}: output slice {'right' if output else 'WRONG'}, "
                  f"input gradient {'right' if grad else 'WRONG'}")
    except Exception as error:
        print(type(error).__name__, str(error).strip().splitlines()[-1])

# %%
check_tensor_parallel(ColumnParallelLinear, None, CopyToParallelRegion, only=["column_parallel_linear"],
                      timeout=CHECK_TIMEOUT);

# %% [markdown]
# ## Part 2: g and the row-parallel layer
#
# Write `ReduceFromParallelRegion` (g) and `RowParallelLinear` in the cell below.

# %%
# BEGIN SOLUTION
class ReduceFromParallelRegion(torch.autograd.Function):
    """g: the sum over the group forward; the gradient as it is backward."""

    @staticmethod
    def forward(ctx, tensor, group):
        return all_reduce(tensor.contiguous().clone(), group)

    @staticmethod
    def backward(ctx, grad):        # the output is whole on every rank, and so is its gradient
        return grad, None


class RowParallelLinear(nn.Module):
    """nn.Linear with the weight split by input features: this rank's columns of the weight, the whole bias."""

    def __init__(self, dense: nn.Linear, group=None):
        super().__init__()
        self.group = group
        start, stop = shard_range(dense.in_features, group)
        self.weight = nn.Parameter(dense.weight.detach()[:, start:stop].clone())
        self.bias = nn.Parameter(dense.bias.detach().clone())

    def forward(self, x_local):     # the bias once, after the sum
        return ReduceFromParallelRegion.apply(F.linear(x_local, self.weight), self.group) + self.bias
# EXERCISE: # YOUR CODE HERE: g as ReduceFromParallelRegion, then RowParallelLinear (the contract above).
# EXERCISE: ReduceFromParallelRegion = RowParallelLinear = None
# END SOLUTION

# %% [markdown]
# Try both together: the MLP `out(gelu(fc(x)))` on 2 ranks. The column-parallel `fc` gives each rank some
# hidden features whole, GELU acts on each alone, and the row-parallel `out` takes exactly those features.

# %%
def try_mlp(rank, world_size):
    torch.manual_seed(0)
    fc, out, x = nn.Linear(6, 10), nn.Linear(10, 6), torch.randn(3, 6)
    y = RowParallelLinear(out)(F.gelu(ColumnParallelLinear(fc)(x)))
    return torch.allclose(y, out(F.gelu(fc(x))), atol=1e-5)


if ColumnParallelLinear is None or RowParallelLinear is None:
    print("not done yet: write both parts above")
else:
    try:
        print("MLP output equal to the dense one on every rank:", all(coursekit.launch(try_mlp, 2)))
    except Exception as error:
        print(type(error).__name__, str(error).strip().splitlines()[-1])

# %% [markdown]
# ## Everything

# %%
report = check_tensor_parallel(ColumnParallelLinear, RowParallelLinear, CopyToParallelRegion,
                               ReduceFromParallelRegion, timeout=CHECK_TIMEOUT)
