"""f without its backward all-reduce (identity both ways): outputs right, but each rank's input gradient is only
its own shard's part."""

import torch
import torch.nn.functional as F

from _tp_solution import ColumnParallelLinear as _Column
from _tp_solution import ReduceFromParallelRegion, RowParallelLinear

EXERCISE = "05_tensor_parallel"
SCORE = 3  # row 3; f_and_g 0 (f wrong), column 0, MLP 0, traffic 0
LOSES = {"f_and_g": (0, "f: f's backward returns this rank's gradient as it came: f must sum the input's gradient"),
         "column_parallel_linear": (0, ("only its own shard's part", "must all-reduce the input's gradient")),
         "mlp_one_all_reduce_each_way": (0, ("fc, the column-parallel layer", "only its own shard's part")),
         "traffic": (0, "f: in backward, nothing; the least is one all-reduce of 60 elements")}


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


CopyToParallelRegion = CopyWithoutReduce  # f
