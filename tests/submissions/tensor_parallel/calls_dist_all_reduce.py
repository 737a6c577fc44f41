"""g written with torch.distributed.all_reduce instead of the exercise's counted all_reduce: right on real ranks,
but the grader could not count it, so the call is refused with what to use instead."""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from _tp_solution import ColumnParallelLinear, CopyToParallelRegion
from _tp_solution import RowParallelLinear as _Row

EXERCISE = "05_tensor_parallel"
DIST = "torch.distributed.all_reduce was called"
SCORE = 3  # column 3; f and g, row, MLP and traffic refused (g calls it)
LOSES = {"f_and_g": (0, DIST), "row_parallel_linear": (0, (DIST, "import all_reduce")),
         "mlp_one_all_reduce_each_way": (0, DIST), "traffic": (0, DIST)}


class Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        tensor = tensor.contiguous().clone()
        dist.all_reduce(tensor, group=group)
        return tensor

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class RowParallelLinear(_Row):
    def forward(self, x_local):
        return Reduce.apply(F.linear(x_local, self.weight), self.group) + self.bias


ReduceFromParallelRegion = Reduce  # g
