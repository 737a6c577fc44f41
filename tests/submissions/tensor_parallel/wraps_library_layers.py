"""Both layers built on coursekit's own (ColumnParallelLinear.from_dense): nothing written. The library's layers
call torch's all-reduce through coursekit.comm, which looks it up at each call; it is switched off while grading,
so every check refuses them (the 1-rank cases, with no communication, are not enough for any check).

Planted, seen failing: comm's collectives bound to torch's at import (as its send and recv are): still 0 -- the
grader counts no all-reduce of its own -- but the feedback said "0 all-reduce(s) in forward", not what was done."""

import coursekit.parallel.tensor as library

EXERCISE = "05_tensor_parallel"
SCORE = 0
CALLED = ("torch.distributed.all_reduce was called", "from coursekit.grading.tensor_tools import all_reduce")
LOSES = {"column_parallel_linear": (0, CALLED), "row_parallel_linear": (0, CALLED),
         "mlp_one_all_reduce_each_way": (0, CALLED)}


class ColumnParallelLinear(library.ColumnParallelLinear):
    def __init__(self, dense, group=None):
        built = library.ColumnParallelLinear.from_dense(dense, group)
        super().__init__(dense.in_features, dense.out_features, group=group, index=built.index)
        self.load_state_dict(built.state_dict())


class RowParallelLinear(library.RowParallelLinear):
    def __init__(self, dense, group=None):
        built = library.RowParallelLinear.from_dense(dense, group)
        super().__init__(dense.in_features, dense.out_features, group=group, index=built.index)
        self.load_state_dict(built.state_dict())
