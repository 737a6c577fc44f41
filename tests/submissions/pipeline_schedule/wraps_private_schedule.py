"""The library's private builder ``schedules._schedule``, with the compute order copied from the library's
source: ``_schedule`` is what gpipe, one_f_one_b, interleaved_1f1b and zb_h1 build with (wrapping zb_h1
goes through it too), so it is held back with them; the grader names the public tools that do the same.

Seen against the grader before held_back: 10/10, every check full marks."""

from coursekit.parallel.pipeline.schedules import _schedule

EXERCISE = "04_pipeline_schedule"
SCORE = 0  # the library's builder held back: no schedule of the learner's to judge, in any check
HELD_BACK = ("coursekit.parallel.pipeline.schedules._schedule was called: it is coursekit's own answer",
             "Action and Schedule are yours to use: list each rank's actions, its F and B and "
             "the SEND and RECV")
LOSES = {"valid_schedule": (0, HELD_BACK)} | {  # said in full once; the other checks point to it
    name: (0, "not judged: one_f_one_b calls coursekit's own answer to this exercise (see valid_schedule)")
    for name in ("bubble_equals_formula", "peak_activations", "equals_one_process")}


def one_f_one_b(p, m):
    compute = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        ops = [("F", r, i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [("F", r, warmup + i), ("B", r, i)]
        ops += [("B", r, i) for i in range(m - warmup, m)]
        compute.append(ops)
    return _schedule("1f1b", p, m, 1, compute)
