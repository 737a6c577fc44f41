"""175B in Megatron-LM's degrees, but 4 micro-batches for 8 pipeline stages: m < p, the pipeline never
fills (stages 4 to 7 would wait for a micro-batch that never comes; torchtitan hangs there). Not a layout."""

from _cl_solution import but

from coursekit.costmodel import Layout

choose_layout = but(**{"175b": Layout(dp=16, tp=8, pp=8, zero=1, micro_batches=4)})

SCORE = 6  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"valid_layout": (2, "175b: pp = 8 with micro_batches = 4: m < p, the pipeline never fills"),
         "fits_in_memory": (2, "175b: not judged: not a valid layout (see valid_layout)"),
         "follows_the_chapter": (2, "175b: not judged: not a valid layout (see valid_layout)"),
    "hidden_scenarios": (0, "counts only for a right answer")}
