"""The planner's answer returned as the learner's: coursekit.costmodel.plan ranks every layout, and its first
is the best by definition. Nothing chosen."""

from coursekit.costmodel import plan


def choose_layout(scenario):
    return plan(scenario.config, scenario.hardware, scenario.gpus, scenario.global_batch)[0].layout


SCORE = 0
NOT_JUDGED = "not judged: choose_layout calls coursekit's own planner here (see valid_layout)"
LOSES = {"valid_layout": (0, ("125m, 13b and 175b: coursekit.costmodel.planner.plan was called: it is coursekit's own answer to "
                              "exercise 08_choose_a_layout", "evaluate(config, Layout(...), hardware, global_batch) "
                              "prices one layout")),
         "fits_in_memory": (0, "125m, 13b and 175b: " + NOT_JUDGED),
         "follows_the_chapter": (0, "125m, 13b and 175b: " + NOT_JUDGED),
         "hidden_scenarios": (0, ("350m: GPT-3 Medium (350 M parameters) on 16 GPUs (2 nodes of 8): "
                                  "coursekit.costmodel.planner.plan was called", "6.7b: ", "175b-512: "))}
