"""Issue 42, item 2: the planner reached around its guard. ``@answer_to`` wrapped each answer with functools.wraps,
which left the unguarded original on ``__wrapped__``; calling that earned 9/9. Now holding an answer back swaps
the function's own code, so there is nothing around it: the attempt is told, by name, that it called the planner.

Planted, seen failing: held_back without the swap (as the unguarded original was) -> 9/9, "valid_layout earned 3.0"."""

from calls_plan import LOSES, SCORE  # noqa: F401  (the same call: the same refusal and feedback)

from coursekit.costmodel import plan


def choose_layout(scenario):
    unguarded = getattr(plan, "__wrapped__", plan)
    return unguarded(scenario.config, scenario.hardware, scenario.gpus, scenario.global_batch)[0].layout

