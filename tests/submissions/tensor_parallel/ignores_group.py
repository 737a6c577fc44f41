"""The layers never use ``group=``: the shards are cut over the whole world and f and g all-reduce over it.
Right whenever the tensor-parallel group is the whole world (every case before the groups case), wrong as soon
as it is not: on 4 ranks as two tensor-parallel groups {0, 1} and {2, 3} (data × tensor parallelism), each
rank's shard is a quarter, not a half, and the all-reduce adds the other group's numbers in.

Seen scoring 10/10 before the groups case (every case built the layers with group=None)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from coursekit.grading.tensor_tools import all_reduce, shard_range

EXERCISE = "05_tensor_parallel"
SCORE = 4.5  # column 2.25 + row 2.25 (3 of 4 cases); f and g without group= fail; properties 0
LOSES = {"f_and_g": (0, "f: f and g are called as Operator.apply(tensor, group): forward takes (ctx, tensor, group)"),
         "column_parallel_linear": (2.25, ("the all-reduce ran over the whole world (ranks 0–3), not over the "
                                           "layer's group {0, 1}: pass group= to every collective", "shard_range")),
         "row_parallel_linear": (2.25, ("columns [0, 2) of a split over the whole world (ranks 0–3), not columns "
                                        "[0, 4) of the layer's group {0, 1}: pass group= to shard_range")),
         "mlp_one_all_reduce_each_way": (0, "not over the layer's group {0, 1}: pass group= to every collective"),
         "traffic": (0, "TypeError")}


class CopyToParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor):
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.contiguous().clone())


class ReduceFromParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor):
        return all_reduce(tensor.contiguous().clone())

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallelLinear(nn.Module):
    def __init__(self, dense, group=None):
        super().__init__()
        start, stop = shard_range(dense.out_features)
        self.weight = nn.Parameter(dense.weight.detach()[start:stop].clone())
        self.bias = nn.Parameter(dense.bias.detach()[start:stop].clone())

    def forward(self, x):
        return F.linear(CopyToParallelRegion.apply(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, dense, group=None):
        super().__init__()
        start, stop = shard_range(dense.in_features)
        self.weight = nn.Parameter(dense.weight.detach()[:, start:stop].clone())
        self.bias = nn.Parameter(dense.bias.detach().clone())

    def forward(self, x_local):
        return ReduceFromParallelRegion.apply(F.linear(x_local, self.weight)) + self.bias
