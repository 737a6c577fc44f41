"""What the attempts at exercise 04 share (``add_communication`` is held back while it is graded, so a learner places
the messages by hand): ``with_messages``, each F and B with its messages as the notebook's solution places them, for
the attempts that get the messages right and the order wrong; ``compute_order``, 1F1B's F and B alone, for those that
get the order right and the messages wrong; ``held_back``, the ``LOSES`` of an attempt that calls a library answer.

``with_messages(p, m, order)``: ``order[r]`` is rank r's computations as ``(op, micro_batch)``, ``op`` "F" or "B";
each F gets its RECV_F before it (not on rank 0) and its SEND_F after it (not on the last rank), each B its RECV_B
before and its SEND_B after (the other way round)."""

from coursekit.parallel.pipeline import Action, Schedule


def with_messages(p: int, m: int, order: list[list[tuple[str, int]]]) -> Schedule:
    actions = []
    for r, compute in enumerate(order):
        ops = []
        for op, i in compute:
            arrives = r > 0 if op == "F" else r < p - 1
            leaves = r < p - 1 if op == "F" else r > 0
            ops += ([Action("RECV_" + op, r, i)] if arrives else []) + [Action(op, r, i)] \
                + ([Action("SEND_" + op, r, i)] if leaves else [])
        actions.append(ops)
    return Schedule("1f1b", p, m, 1, actions)


def compute_order(p: int, m: int) -> list[list[Action]]:
    """1F1B's F and B per rank, no messages: min(p − 1 − r, m) forwards, then one forward and one backward, then the
    rest (what the attempts that get the order right and the messages wrong start from)."""
    order = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        ops = [Action("F", r, i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [Action("F", r, warmup + i), Action("B", r, i)]
        order.append(ops + [Action("B", r, i) for i in range(m - warmup, m)])
    return order


def held_back(said: str | tuple[str, ...]) -> dict:
    """``LOSES`` of an attempt that calls a library answer: ``said`` in valid_schedule, every other check pointing to it."""
    return {"valid_schedule": (0, said)} | {
        name: (0, "not judged: one_f_one_b calls coursekit's own answer to this exercise (see valid_schedule)")
        for name in ("bubble_equals_formula", "peak_activations", "equals_one_process")}


def right_one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B right, messages placed as the solution places them: the part an attempt at the stretch gets right."""
    return with_messages(p, m, [[(a.op, a.micro_batch) for a in ops] for ops in compute_order(p, m)])


def interleaved_edited(*edits: tuple[str, str]):
    """The notebook's ``interleaved_one_f_one_b`` (the stretch's solution, from its one source), each ``(old, new)``
    of ``edits`` a learner's change to its text (each ``old`` must be there once)."""
    import re
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    sys.path.insert(0, str(root / "tools"))
    from build_notebook import select

    source = select((root / "tools" / "notebook_src" / "04_pipeline_schedule.py").read_text(), exercise=False)
    code = next(c for c in re.split(r"^# %%.*$", source, flags=re.M)
                if re.search(r"^def interleaved_one_f_one_b\b", c, re.M))
    for old, new in edits:
        assert code.count(old) == 1, f"{old!r} is not in the solution once"
        code = code.replace(old, new)
    namespace: dict = {}
    exec("from coursekit.parallel.pipeline import Action, Schedule\n" + code, namespace)
    return namespace["interleaved_one_f_one_b"]
