"""GPipe's order submitted as 1F1B: every forward, then every backward. Valid, the same bubble, and the
executor trains right -- but each rank holds all m micro-batches' activations instead of min(p − r, m)."""

from coursekit.parallel.pipeline import Action, Schedule, add_communication

EXERCISE = "04_pipeline_schedule"
SCORE = 7  # valid 3 + bubble 2 + executed 2; peak activations 0 (only m = 1 agrees, and it earns nothing)
LOSES = {"peak_activations": (0, ("p=2, m=2: rank 1 holds 2 micro-batches at its peak; 1F1B holds at most min(p−r, m) = 1",
                                  "that is GPipe's order (every forward before any backward)"))}


def one_f_one_b(p, m):
    actions = [[Action("F", r, i) for i in range(m)] + [Action("B", r, i) for i in range(m)] for r in range(p)]
    return add_communication(Schedule("1f1b", p, m, 1, actions))
