"""125 M with dp = 4: a layout of 4 GPUs for a node of 8 (half of them idle, or, as a launcher sees it, a mesh
that does not match the world size)."""

from _cl_solution import but

from coursekit.costmodel import Layout

choose_layout = but(**{"125m": Layout(dp=4, micro_batches=8)})

SCORE = 6  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"valid_layout": (2, "125m: dp × tp × pp × sp = 4 × 1 × 1 × 1 = 4 GPUs, but the scenario has 8"),
         "fits_in_memory": (2, "125m: not judged: not a valid layout"),
         "follows_the_chapter": (2, "125m: not judged: not a valid layout"),
    "hidden_scenarios": (0, "counts only for a right answer")}
