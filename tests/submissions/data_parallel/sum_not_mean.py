"""Exercise 02: the buckets are all-reduced but never divided: the sum over ranks, not the mean.

With one rank a sum and a mean agree, so that case earns nothing: only ranks that disagree decide.
"""

from _dp_solution import averaging_with, reduce_scatter_gradients  # noqa: F401  (part 2 is right)

EXERCISE = "02_data_parallel"
SCORE = 7  # part 2: 3 + 2 + 1 + 1; the one-rank case is right but earns nothing
_SUM = "(it is the *sum* over ranks: divide by the world size)"
_HELD = "this is scored only for a right one"
LOSES = {
    "hooks_average_gradients": (0, ("mlp, world size 2, buckets of 2000 elements: step 0, grad", _SUM)),
    "hooks_buckets": (0, _HELD),
    "hooks_overlap": (0, _HELD),
    # two backward calls: 4 × the first micro-batch's average + 2 × the second's on 2 ranks (summed twice, then once)
    "hooks_gradient_accumulation": (0, ("mlp, world size 2, buckets of 2000 elements, two backward calls per step",
                                        "4 × the first micro-batch's average + 2 × the second's",
                                        "it is the *sum* over ranks: divide by the world size")),
    "hooks_tied_frozen_uneven": (0, _SUM),
}


attach_gradient_averaging = averaging_with(divide=False)  # the mistake: no / world_size
