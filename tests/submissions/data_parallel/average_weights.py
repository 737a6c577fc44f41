"""Exercise 02: hooks that average the *weights* (p.data) instead of the gradients, in buckets.

They all-reduce exactly the buckets the rule makes, when it says, so a check that only looked at the all-reduces
would pass them; but every gradient stays this rank's own.
"""

from _dp_solution import averaging_with, reduce_scatter_gradients  # noqa: F401  (part 2 is right)

EXERCISE = "02_data_parallel"
# One rank: averaging over one rank changes nothing (a precondition, worth nothing); 2 and 3 ranks: wrong.
SCORE = 7  # part 2: 3 + 2 + 1 + 1
_MOVED = "your hooks changed the parameters during loss.backward()"
_HELD = "this is scored only for a right one"
LOSES = {
    "hooks_average_gradients": (0, _MOVED),
    "hooks_buckets": (0, _HELD),
    "hooks_overlap": (0, _HELD),
    "hooks_gradient_accumulation": (0, _MOVED),
    "hooks_tied_frozen_uneven": (0, _MOVED),
}


attach_gradient_averaging = averaging_with(weights=True)  # the mistake: the parameters all-reduced, not p.grad
