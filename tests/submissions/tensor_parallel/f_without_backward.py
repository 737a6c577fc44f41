"""f without its backward all-reduce (identity both ways): outputs right, but each rank's input gradient is only
its own shard's part."""

import torch
import torch.nn.functional as F

from _tp_solution import ColumnParallelLinear as _Column
from _tp_solution import RowParallelLinear

EXERCISE = "05_tensor_parallel"
SCORE = 3  # column 0, row 3, MLP 0
LOSES = {"column_parallel_linear": (0, ("only its own shard's part", "must all-reduce the input's gradient")),
         "mlp_one_all_reduce_each_way": (0, ("fc, the column-parallel layer", "only its own shard's part"))}


class CopyWithoutReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ColumnParallelLinear(_Column):
    def forward(self, x):
        return F.linear(CopyWithoutReduce.apply(x, self.group), self.weight, self.bias)
