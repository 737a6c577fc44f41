"""Both layers built on coursekit's own (ColumnParallelLinear.from_dense): nothing written. While exercise 05 is
graded its answers are held back (coursekit.answers.ANSWERS: the layers' forward, f and g), so the
inherited forward refuses with the sentence that names it, on every case (one rank too). Behind that, a second
wall: the library's collectives look torch's up at each call, and grading switches those off.

Planted, seen failing: the layers' forward not held back -- the feedback said "torch.distributed.all_reduce was
called" (the second wall); and comm's collectives bound at import as well -- still 0, but the feedback said "0 all-reduce(s)
in forward", not what was done."""

import coursekit.parallel.tensor as library

EXERCISE = "05_tensor_parallel"
SCORE = 0
HELD = ("ParallelLinear.forward was called: it is coursekit's own answer to exercise 05_tensor_parallel",
        "write f, g and the two layers yourself")
HELD_FG = "copy_to_parallel_region was called: it is coursekit's own answer to exercise 05_tensor_parallel"
LOSES = {name: (0, HELD) for name in ("column_parallel_linear", "row_parallel_linear", "mlp_one_all_reduce_each_way")} | {
    name: (0, HELD_FG) for name in ("f_and_g", "traffic")}


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


class CopyToParallelRegion:  # f and g: the library's, by the names the exercise asks for
    apply = staticmethod(library.copy_to_parallel_region)


class ReduceFromParallelRegion:
    apply = staticmethod(library.reduce_from_parallel_region)
