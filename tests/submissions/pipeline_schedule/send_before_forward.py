"""Sends and receives written by hand, each SEND placed before the action whose result it sends."""

from coursekit.parallel.pipeline import Action, Schedule

EXERCISE = "04_pipeline_schedule"
SCORE = 0  # nothing; a property of a wrong answer earns nothing (issue 58)
LOSES = {
    "valid_schedule": (0, ("p=2, m=1: rank 0, action SEND_F0@s0\n",  # the explanation the cases share, said once:
                           "(each of these 3: SEND_F0@s0 needs what it sends, but F0@s0 comes later on rank 0: put "
                           "F0@s0 before SEND_F0@s0)")),
    "bubble_equals_formula": (0, "not a valid schedule"),
    "peak_activations": (0, "not a valid schedule"),
    "equals_one_process": (0, "not run, not a valid schedule"),
}


def one_f_one_b(p, m):
    def forward(r, i):
        recv = [Action("RECV_F", r, i)] if r > 0 else []
        send = [Action("SEND_F", r, i)] if r < p - 1 else []
        return recv + send + [Action("F", r, i)]          # the mistake: SEND_F before F

    def backward(r, i):
        recv = [Action("RECV_B", r, i)] if r < p - 1 else []
        send = [Action("SEND_B", r, i)] if r > 0 else []
        return recv + [Action("B", r, i)] + send

    actions = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        ops = [a for i in range(warmup) for a in forward(r, i)]
        for i in range(m - warmup):
            ops += forward(r, warmup + i) + backward(r, i)
        ops += [a for i in range(m - warmup, m) for a in backward(r, i)]
        actions.append(ops)
    return Schedule("1f1b", p, m, 1, actions)
