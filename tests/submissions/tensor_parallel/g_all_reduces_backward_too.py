"""g all-reduces both ways, the backward sum divided by t so that the numbers still come out right (every rank's
output gradient is the same): outputs and gradients equal the dense layer's, but the row-parallel layer issues an
all-reduce in backward that is not needed — only the collectives show it: the MLP's count (two all-reduces in
backward) and the traffic, counted by amount (60 elements all-reduced in g's backward, where none is needed)."""

import torch
import torch.nn.functional as F

from _tp_solution import ColumnParallelLinear, CopyToParallelRegion
from _tp_solution import RowParallelLinear as _Row
from coursekit.grading.tensor_tools import all_reduce

EXERCISE = "05_tensor_parallel"
SCORE = 8  # f_and_g 2, column 3, row 3 (its numbers are right); MLP 0 and traffic 0
LOSES = {"mlp_one_all_reduce_each_way": (0, ("all_reduce backward: 2", "exactly 1 all-reduce forward")),
         "traffic": (0, ("g: in backward, all-reduce of 60; the least is no collective", "g sums only the partial "
                         "results, in forward"))}


class ReduceBothWays(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return all_reduce(tensor.contiguous().clone(), group)

    @staticmethod
    def backward(ctx, grad):
        size = torch.distributed.get_world_size(ctx.group) if torch.distributed.is_initialized() else 1
        return all_reduce(grad.contiguous().clone(), ctx.group) / size, None


class RowParallelLinear(_Row):
    def forward(self, x_local):
        return ReduceBothWays.apply(F.linear(x_local, self.weight), self.group) + self.bias


ReduceFromParallelRegion = ReduceBothWays  # g
