"""Issue 42, item 2: the planner reached around its guard. ``@answer_to`` wrapped each answer with functools.wraps,
which left the unguarded original on ``__wrapped__``; calling that earned 9/9. Now holding an answer back swaps
the function's own code, so there is nothing around it: the attempt is told, by name, that it called the planner.

Planted, seen failing: held_back without the swap (as the unguarded original was) -> 9/9, "valid_layout earned 3.0"."""

from coursekit.costmodel import plan


def choose_layout(scenario):
    unguarded = getattr(plan, "__wrapped__", plan)
    return unguarded(scenario.config, scenario.hardware, scenario.gpus, scenario.global_batch)[0].layout


SCORE = 0
NOT_JUDGED = "not judged: choose_layout calls coursekit's own planner here (see valid_layout)"
LOSES = {"valid_layout": (0, ("125m, 13b and 175b: coursekit.costmodel.planner.plan was called: it is coursekit's own answer to "
                              "exercise 07_choose_a_layout", "evaluate(config, Layout(...), hardware, global_batch) "
                              "prices one layout")),
         "fits_in_memory": (0, "125m, 13b and 175b: " + NOT_JUDGED),
         "near_best_step_time": (0, "125m, 13b and 175b: " + NOT_JUDGED)}
