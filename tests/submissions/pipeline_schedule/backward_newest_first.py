"""Steady state backward of the *newest* forward instead of the oldest (a stack, not a queue), each message placed
next to its F or B. The next rank sends the gradients back oldest first, so rank 0's first receive of a gradient
(micro-batch 1's) is not the first message on its way (micro-batch 0's): messages between two ranks match in order,
and the validator says so.

Seen against the grader while add_communication was the learner's (it moved each receive to match the sends'
order): valid, 8/10, bubble_equals_formula 0 ("rank 0 waits from t=2 to t=7 (F = 1, B = 2) before B1@s0")."""

from _ps_solution import with_messages

EXERCISE = "04_pipeline_schedule"
SCORE = 0  # nothing valid beyond the preconditions; a property of a wrong answer earns nothing (issue 58)
LOSES = {
    "valid_schedule": (0, ("p=2, m=2: rank 0, action RECV_B1@s0\n", "the 1st message from rank 1 is SEND_B0@s1, but "
                           "the 1st receive from rank 1 here is RECV_B1@s0 (messages between two ranks match in order)")),
    "bubble_equals_formula": (0, "not a valid schedule (see valid_schedule)"),
    "peak_activations": (0, "not a valid schedule"),
    "equals_one_process": (0, "p=2, m=4: not run, not a valid schedule"),
}


def one_f_one_b(p, m):
    actions = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        ops = [("F", i) for i in range(warmup)]
        waiting = list(range(warmup))
        for i in range(warmup, m):
            ops.append(("F", i))
            waiting.append(i)
            ops.append(("B", waiting.pop()))      # the mistake: pop(0), the oldest
        ops += [("B", i) for i in reversed(waiting)]
        actions.append(ops)
    return with_messages(p, m, actions)
