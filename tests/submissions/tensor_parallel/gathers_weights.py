"""The weights all-gathered instead of split work: each rank keeps its shard as its parameter, but forward rebuilds
the whole dense matrix (and, for the row-parallel layer, the whole input) and multiplies all of it. Every number
is right and no all-reduce is issued: partial credit, and why it is not tensor parallelism."""

import torch
import torch.nn.functional as F

from _tp_solution import ColumnParallelLinear as _Column
from _tp_solution import CopyToParallelRegion, ReduceFromParallelRegion
from _tp_solution import RowParallelLinear as _Row
from coursekit.grading.tensor_tools import all_gather, shard_range

EXERCISE = "05_tensor_parallel"
SCORE = 5  # f_and_g 2 + column 1.5 + row 1.5; a property of a wrong answer earns nothing (issue 58)
LOSES = {"column_parallel_linear": (1.5, ("all-gather the weight shards", "not tensor parallelism")),
         "row_parallel_linear": (1.5, "not tensor parallelism"),
         "mlp_one_all_reduce_each_way": (0, "not tensor parallelism"),
         "traffic": (0, "column: in forward, all-gather of 20, all-gather of 4; the least is no collective")}


class Gather(torch.autograd.Function):
    """All-gather along dim forward; this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, tensor, dim, group):
        whole = all_gather(tensor, dim, group)
        ctx.dim, ctx.length = dim, tensor.shape[dim]
        ctx.start = shard_range(whole.shape[dim], group)[0]
        return whole

    @staticmethod
    def backward(ctx, grad):
        return grad.narrow(ctx.dim, ctx.start, ctx.length), None, None


class ColumnParallelLinear(_Column):
    def __init__(self, dense, group=None):
        super().__init__(dense, group)
        self.out_features = dense.out_features

    def forward(self, x):
        start, stop = shard_range(self.out_features, self.group)
        weight, bias = Gather.apply(self.weight, 0, self.group), Gather.apply(self.bias, 0, self.group)
        return F.linear(CopyToParallelRegion.apply(x, self.group), weight, bias)[..., start:stop]


class RowParallelLinear(_Row):
    def forward(self, x_local):
        x = Gather.apply(x_local, -1, self.group)
        return F.linear(x, Gather.apply(self.weight, 1, self.group), self.bias)
