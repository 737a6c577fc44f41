"""Work in progress: 125 M and 13B chosen (the solution's layouts), 175B still the stub's NotImplementedError.
The two done earn their points; the third is "not done yet", not a crash and not a zero for the whole exercise."""

from _cl_solution import solution


def choose_layout(scenario):
    if scenario.key == "175b":
        raise NotImplementedError("175B: next")
    return solution(scenario)


SCORE = 6  # a property of a wrong answer earns nothing (issue 58)
NOT_DONE = "175b: not done yet: choose_layout raises NotImplementedError for it"
LOSES = {"valid_layout": (2, NOT_DONE),
         "fits_in_memory": (2, "175b: not judged: not a valid layout (see valid_layout)"),
         "follows_the_chapter": (2, "175b: not judged: not a valid layout (see valid_layout)"),
    "hidden_scenarios": (0, "counts only for a right answer")}
