"""Exercise 02: the buckets' all-reduces started from the hooks, and finish() uses the buffers without waiting.

On gloo the sums would land whenever its threads finish: right on one run, wrong on the next. The grader delivers
a sum only at its handle's wait(), so this attempt gets its own gradients back every time, and is told why.
"""

from _dp_solution import averaging_with, reduce_scatter_gradients  # noqa: F401  (part 2 is right)

EXERCISE = "02_data_parallel"
SCORE = 7  # part 2 only
_NEVER = ("never waited for", "finish() must wait for each one it started")
_HELD = "this is scored only for a right one"
LOSES = {
    "hooks_average_gradients": (0, ("mlp, world size 2, buckets of 2000 elements: step 0", *_NEVER)),
    "hooks_buckets": (0, _HELD),
    "hooks_overlap": (0, _HELD),
    "hooks_gradient_accumulation": (0, "two backward calls per step"),
    "hooks_tied_frozen_uneven": (0, _NEVER),
}


attach_gradient_averaging = averaging_with(never_wait=True)  # the mistake: handle.wait() is never called
