"""f and g swapped: f (before the column-parallel layer) all-reduces in forward and is identity in backward, g
(after the row-parallel layer) is identity in forward and all-reduces in backward. On one rank nothing shows; on
t ranks the column-parallel layer multiplies t times the input (every rank already held it whole) and each
rank's input gradient is only its shard's part, while the row-parallel layer returns only this rank's partial sum.

Seen failing before the fix with the symptom only: "world size 2, rank 0: the output differs from the dense
layer's by ..."."""

import torch
import torch.nn.functional as F

from _tp_solution import ColumnParallelLinear as _Column
from _tp_solution import RowParallelLinear as _Row
from coursekit.grading.tensor_tools import all_reduce

EXERCISE = "05_tensor_parallel"
SCORE = 0  # every case on 2, 3 and 4 ranks wrong (one rank right earns nothing)
LOSES = {"f_and_g": (0, ("f: f and g are swapped: f's forward all-reduces the input", "its all-reduce belongs in "
                         "backward")),
         "column_parallel_linear": (0, ("f and g are swapped", "identity in forward, all-reduce of the input's "
                                        "gradient in backward")),
         "row_parallel_linear": (0, ("f and g are swapped", "all-reduce of the partial outputs in forward")),
         "mlp_one_all_reduce_each_way": (0, "f and g are swapped"),
         "traffic": (0, "f: in forward, all-reduce of 60; the least is no collective")}


class AllReduceForward(torch.autograd.Function):  # written as f: it is g
    @staticmethod
    def forward(ctx, tensor, group):
        return all_reduce(tensor.contiguous().clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class AllReduceBackward(torch.autograd.Function):  # written as g: it is f
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.contiguous().clone(), ctx.group), None


class ColumnParallelLinear(_Column):
    def forward(self, x):
        return F.linear(AllReduceForward.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(_Row):
    def forward(self, x_local):
        return AllReduceBackward.apply(F.linear(x_local, self.weight), self.group) + self.bias


CopyToParallelRegion, ReduceFromParallelRegion = AllReduceForward, AllReduceBackward  # f and g, as written
