"""The shards are cut over the layer's group (``shard_range(..., group)``), but f and g all-reduce over the whole
world: ``all_reduce(grad)`` without ``group=``. Right whenever the group is the whole world; on 4 ranks as two
tensor-parallel groups {0, 1} and {2, 3}, with different inputs in each group, the sum mixes the two groups.

Seen scoring 10/10 before the groups case (every case built the layers with group=None)."""

import torch
import torch.nn.functional as F

from _tp_solution import ColumnParallelLinear as _Column
from _tp_solution import RowParallelLinear as _Row
from coursekit.grading.tensor_tools import all_reduce

EXERCISE = "05_tensor_parallel"
GROUP = "not over the layer's group {0, 1}: pass group= to every collective"
SCORE = 6  # f_and_g 1.5 + column 2.25 + row 2.25 (3 of 4 cases each); a property of a wrong answer earns nothing
LOSES = {"f_and_g": (1.5, "f: the all-reduce ran over the whole world (ranks 0–3), " + GROUP),
         "column_parallel_linear": (2.25, "rank 0: the all-reduce ran over the whole world (ranks 0–3), " + GROUP),
         "row_parallel_linear": (2.25, "rank 0: the all-reduce ran over the whole world (ranks 0–3), " + GROUP),
         "mlp_one_all_reduce_each_way": (0, GROUP), "traffic": (0, "traffic counts only for a right answer")}


class CopyToParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.contiguous().clone()), None


class ReduceFromParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        return all_reduce(tensor.contiguous().clone())

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ColumnParallelLinear(_Column):
    def forward(self, x):
        return F.linear(CopyToParallelRegion.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(_Row):
    def forward(self, x_local):
        return ReduceFromParallelRegion.apply(F.linear(x_local, self.weight), self.group) + self.bias
