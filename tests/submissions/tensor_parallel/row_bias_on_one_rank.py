"""The row-parallel bias added on rank 0 only, before the all-reduce (what the old hint's "(or on one rank only)"
invited): the output is right on every rank, but no gradient reaches the bias of the other ranks, so their copies
of it would never be trained. Column-parallel is right; the row-parallel layer and the MLP are right on one rank.

Seen failing before the fix (a missing gradient reported as a difference): "row_bias_on_one_rank:
row_parallel_linear's feedback lacks 'world size 2, rank 1: no gradient reached self.bias (is it used in forward?)'"
(it said "the bias's gradient differs by inf")."""

import torch.distributed as dist
import torch.nn.functional as F

from _tp_solution import ColumnParallelLinear, CopyToParallelRegion, ReduceFromParallelRegion
from _tp_solution import RowParallelLinear as _Row

EXERCISE = "05_tensor_parallel"
SCORE = 5  # f_and_g 2, column 3; row 0 (wrong on 2, 3 and 4 ranks; one rank right earns nothing); MLP 0
LOSES = {"row_parallel_linear": (0, ("world size 2, rank 1; world size 3, rank 1",
                                     "rank 1: no gradient reached self.bias (is it used in forward?)")),
         "mlp_one_all_reduce_each_way": (0, "no gradient reached out.bias"),
         "traffic": (0, "traffic counts only for a right answer")}


class RowParallelLinear(_Row):
    def forward(self, x_local):
        first = not dist.is_initialized() or dist.get_rank(self.group) == 0
        return ReduceFromParallelRegion.apply(F.linear(x_local, self.weight, self.bias if first else None), self.group)
