"""The planner run in a cell before grading, its layouts handed back later from a table (issue 42, item 1). The
planner was held back only while choose_layout ran, and `coursekit grade` runs the whole notebook: 9/9. It is now
held back from the notebook's first cell (coursekit.answers.WHOLE_NOTEBOOK), so this cell stops the notebook with
the planner's sentence and no check runs. (Graded here as `coursekit grade` runs it:
tests/test_checks_choose_layout.py.)"""

SCORE = 0
NOTEBOOK_STOPS = ("coursekit.costmodel.planner.plan was called", "exercise 08_choose_a_layout",
                  "choose the degrees yourself")
LOSES = {check: (0, "the notebook never ran this check")
         for check in ("valid_layout", "fits_in_memory", "follows_the_chapter", "hidden_scenarios")}

from coursekit.costmodel import plan  # noqa: E402
from coursekit.grading.choose_layout import SCENARIOS  # noqa: E402

PLANNED = {key: plan(s.config, s.hardware, s.gpus, s.global_batch)[0].layout for key, s in SCENARIOS.items()}


def choose_layout(scenario):
    return PLANNED[scenario.key]
