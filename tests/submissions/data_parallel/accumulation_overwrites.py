"""Exercise 02: buckets of what *this* backward computed, written over ``p.grad``.

The learner worried that averaging the accumulated ``p.grad`` again on a second backward would average the first
micro-batch twice, so the hooks catch each backward's fresh gradient (a tensor hook, before it is added to
``p.grad``), all-reduce those, and ``finish()`` writes the average over ``p.grad``. With one backward per step that
is exactly right (it passes every other check); with gradient accumulation the second backward throws away what
the first had accumulated.
"""

from _dp_solution import averaging_with, reduce_scatter_gradients  # noqa: F401  (part 2 is right)

EXERCISE = "02_data_parallel"
SCORE = 15  # everything but hooks_gradient_accumulation (2 points; both of its cases, G = 2 and 3, fail)
LOSES = {
    "hooks_gradient_accumulation": (0, (
        "mlp, world size 2, buckets of 2000 elements, two backward calls per step: step 0, grad",
        "0 × the first micro-batch's average + 1 × the second's",
        "your hook replaced p.grad with the average of this backward's gradient, discarding what the first "
        "backward had accumulated")),
}


attach_gradient_averaging = averaging_with(fresh_only=True)  # the mistake: this backward's gradients, written over p.grad
