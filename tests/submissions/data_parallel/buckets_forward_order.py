"""Exercise 02: buckets filled in forward order, model.parameters() as it comes, instead of backward order.

Right values (each bucket is summed when its last gradient arrives, whatever the grouping), but the first layer's
gradients, the last ready, share a bucket with later ones: the buckets are not the ones the rule makes.
"""

from _dp_solution import averaging_with, reduce_scatter_gradients  # noqa: F401  (part 2 is right)

EXERCISE = "02_data_parallel"
SCORE = 15  # all but hooks_buckets (2)
LOSES = {"hooks_buckets": (0, ("buckets of [4420, 1088] elements", "they hold [4484, 1024]",
                               "filled in forward order"))}


attach_gradient_averaging = averaging_with(forward_order=True)  # the mistake: model.parameters() as it comes, not reversed
