# %% [markdown]
# BEGIN SOLUTION
# # Solution 05 · Tensor parallelism: column- and row-parallel linear layers
# EXERCISE: # # Exercise 05 · Tensor parallelism: column- and row-parallel linear layers
# END SOLUTION
#
# In `notebooks/05_tensor_parallelism.ipynb` you saw one matrix multiplication split over GPUs by columns
# and by rows (**P5**), and the two communication operators of Megatron-LM, **f** and **g**. Here f and g are
# written for you, with this exercise's collectives. You write the two layers that use them: a column-parallel
# layer followed by a row-parallel one must cost exactly one all-reduce forward and one backward.
#
# **Part 1** `ColumnParallelLinear(dense, group=None)`: keep, as `self.weight` and `self.bias`, the rows
# `shard_range(dense.out_features)` of `dense.weight` and of `dense.bias` (output features). `forward(x)`
# takes the whole input and returns this rank's slice of the output features. Before the product, **f**:
# identity forward, all-reduce of the gradient backward (every rank read the whole input, and each rank's
# gradient of it is only its own rows' part).
#
# **Part 2** `RowParallelLinear(dense, group=None)`: keep the columns `shard_range(dense.in_features)` of
# `dense.weight` (input features) as `self.weight`, and the whole bias as `self.bias`. `forward(x_r)` takes
# this rank's slice of the input features and returns the whole output on every rank. After the partial
# product, **g**: all-reduce forward, identity backward. Add the bias once, after the sum.
#
# **The tools**: `from coursekit.grading.tensor_tools import all_reduce, all_gather, shard_range`:
# `all_reduce(tensor, group=None)` sums in place over the ranks and returns the tensor; `all_gather(tensor,
# dim=-1, group=None)` concatenates every rank's tensor; `shard_range(total, group=None)` is `(start, stop)`
# of this rank's rows (uneven like `torch.tensor_split`: 7 over 3 ranks is 3, 2, 2). Both collectives are
# counted; while grading, `torch.distributed`'s own are switched off. **f** and **g** are given below as
# `CopyToParallelRegion.apply(x, group)` and `ReduceFromParallelRegion.apply(x, group)`.
#
# **Grading**: each layer on 1, 2 and 4 ranks against the dense `nn.Linear`: the output, the input's
# gradient, the weight's and the bias's gradients of every shard, and the number of all-reduces in forward
# and in backward; then the MLP `out(gelu(fc(x)))` built from both on 1, 2 and 4 ranks: the dense MLP's
# numbers with exactly one all-reduce each way. Each also runs on 4 ranks as two tensor-parallel groups,
# {0, 1} and {2, 3} (a `Mesh({"dp": 2, "tp": 2})`, different inputs in each group), the layers given their
# group: pass `group` to `shard_range` and to every collective. Gathering the weights instead of splitting
# the work earns partial credit only. From a terminal: `make grade NB=exercises/05_tensor_parallel.ipynb`
# (it grades a copy of your file).

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
# ## Part 1: the column-parallel layer
#
# **f** is given: the chapter's `_Copy`, with this exercise's `all_reduce`. Call it as
# `CopyToParallelRegion.apply(x, group)`; the layer below is yours.

# %%
class CopyToParallelRegion(torch.autograd.Function):
    """f: identity forward, all-reduce (sum) of the gradient backward."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.contiguous().clone(), ctx.group), None


class ColumnParallelLinear(nn.Module):
    """nn.Linear with the weight split by output features: this rank's rows of the weight and the bias."""

    def __init__(self, dense: nn.Linear, group=None):
        super().__init__()
        self.group = group
# BEGIN SOLUTION
        start, stop = shard_range(dense.out_features, group)
        self.weight = nn.Parameter(dense.weight.detach()[start:stop].clone())
        self.bias = nn.Parameter(dense.bias.detach()[start:stop].clone())
# EXERCISE:         raise NotImplementedError("keep this rank's rows of dense.weight and dense.bias")
# END SOLUTION

    def forward(self, x):
# BEGIN SOLUTION
        return F.linear(CopyToParallelRegion.apply(x, self.group), self.weight, self.bias)
# EXERCISE:         raise NotImplementedError("f, then this rank's slice of the output")
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


try:
    for rank, (output, grad) in enumerate(coursekit.launch(try_column, 2)):
        print(f"rank {rank}: output slice {'right' if output else 'WRONG'}, input gradient {'right' if grad else 'WRONG'}")
except Exception as error:                  # an unfinished exercise lands here
    print(type(error).__name__, str(error).strip().splitlines()[-1])

# %%
check_tensor_parallel(ColumnParallelLinear, None, only=["column_parallel_linear"], timeout=CHECK_TIMEOUT);

# %% [markdown]
# ## Part 2: the row-parallel layer
#
# **g** is given too: `ReduceFromParallelRegion.apply(partial, group)`. The layer is yours.

# %%
class ReduceFromParallelRegion(torch.autograd.Function):
    """g: all-reduce (sum) forward, identity backward."""

    @staticmethod
    def forward(ctx, tensor, group):
        return all_reduce(tensor.contiguous().clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class RowParallelLinear(nn.Module):
    """nn.Linear with the weight split by input features: this rank's columns of the weight, the whole bias."""

    def __init__(self, dense: nn.Linear, group=None):
        super().__init__()
        self.group = group
# BEGIN SOLUTION
        start, stop = shard_range(dense.in_features, group)
        self.weight = nn.Parameter(dense.weight.detach()[:, start:stop].clone())
        self.bias = nn.Parameter(dense.bias.detach().clone())
# EXERCISE:         raise NotImplementedError("keep this rank's columns of dense.weight, and the whole bias")
# END SOLUTION

    def forward(self, x_local):
# BEGIN SOLUTION
        return ReduceFromParallelRegion.apply(F.linear(x_local, self.weight), self.group) + self.bias
# EXERCISE:         raise NotImplementedError("the partial product, g, then the bias once")
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


try:
    print("MLP output equal to the dense one on every rank:", all(coursekit.launch(try_mlp, 2)))
except Exception as error:
    print(type(error).__name__, str(error).strip().splitlines()[-1])

# %% [markdown]
# ## Everything

# %%
report = check_tensor_parallel(ColumnParallelLinear, RowParallelLinear, timeout=CHECK_TIMEOUT)
