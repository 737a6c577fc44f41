"""The row-parallel bias added on every rank, before the all-reduce: the sum holds it t times.
Column-parallel is right; the row-parallel layer and the MLP are right on one rank only.

Seen failing before the fix (the hint still offered "or on one rank only", which fails the bias's gradient):
"row_parallel_linear's feedback lacks 'Add it after g's all-reduce, on every rank'"."""

import torch.nn.functional as F

from _tp_solution import ColumnParallelLinear, CopyToParallelRegion, ReduceFromParallelRegion
from _tp_solution import RowParallelLinear as _Row

EXERCISE = "05_tensor_parallel"
SCORE = 5  # f_and_g 2, column 3; row 0 (every case wrong; one rank right earns nothing); MLP 0
# issue 58: the feedback used t without saying what it is
LOSES = {"row_parallel_linear": (0, ("off by (t − 1) × the bias, t the ranks of the layer's group",
                                     "Add it after g's all-reduce, on every rank")),
         "mlp_one_all_reduce_each_way": (0, ("out, the row-parallel layer", "off by (t − 1) × the bias")),
         "traffic": (0, "traffic counts only for a right answer")}


class RowParallelLinear(_Row):
    def forward(self, x_local):
        return ReduceFromParallelRegion.apply(F.linear(x_local, self.weight, self.bias), self.group)
