"""The right order of F and B, but no sends or receives (the contract's messages left out): on one rank that is a
schedule; on two, rank 0's backward has no gradient to start from (and rank 1's forward no input)."""

from _ps_solution import compute_order

from coursekit.parallel.pipeline import Schedule

EXERCISE = "04_pipeline_schedule"
SCORE = 0  # nothing; a property of a wrong answer earns nothing (issue 58)
LOSES = {
    "valid_schedule": (0, ("p=2, m=1: rank 0, action B0@s0\n",  # the explanation the cases share, said once:
                           "(each of these 3: B0@s0 needs its output gradient, but RECV_B0@s0 is missing on rank 0: "
                           "put RECV_B0@s0 before B0@s0)")),
    "bubble_equals_formula": (0, "not a valid schedule (see valid_schedule)"),
    "peak_activations": (0, "not a valid schedule"),
    "equals_one_process": (0, "p=2, m=4: not run, not a valid schedule"),
}


def one_f_one_b(p, m):
    return Schedule("1f1b", p, m, 1, compute_order(p, m))   # the mistake: no SEND and RECV around F and B
