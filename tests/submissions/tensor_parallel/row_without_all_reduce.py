"""The row-parallel layer without g: ``F.linear(x_r, self.weight, self.bias)``, no all-reduce. Each rank returns
only its own partial sum (plus the bias); right on one rank only. Column-parallel is right.

Seen failing before the fix with the symptom only: "world size 2, rank 0: the output differs from the dense
layer's by ..."."""

import torch.nn.functional as F

from _tp_solution import ColumnParallelLinear, CopyToParallelRegion, ReduceFromParallelRegion  # g written, not used
from _tp_solution import RowParallelLinear as _Row

EXERCISE = "05_tensor_parallel"
SCORE = 5  # f_and_g 2, column 3; row 0 and MLP 0 (wrong on 2, 3 and 4 ranks; one rank right earns nothing)
LOSES = {"row_parallel_linear": (0, ("only this rank's partial sum", "g, after the row-parallel layer's product, "
                                     "must all-reduce the partial outputs in forward")),
         "mlp_one_all_reduce_each_way": (0, ("no all-reduce in forward", "g's all-reduce")),
         "traffic": (0, "row: in forward, nothing; the least is one all-reduce of 48 elements")}


class RowParallelLinear(_Row):
    def forward(self, x_local):
        return F.linear(x_local, self.weight, self.bias)
