"""The solution of exercise 07, taken from the notebook's one source (dispatch, combine), for attempts to reuse."""

import linecache
import math
import re
import sys
from pathlib import Path

import torch

from coursekit import comm
from coursekit.parallel.sequence.comm import all_to_all

ROOT = Path(__file__).resolve().parents[3]


def functions(exercise: bool = False) -> dict:
    """``{"dispatch": ..., "combine": ...}`` as the solution (or, ``exercise``, the stub) defines them."""
    sys.path.insert(0, str(ROOT / "tools"))
    from build_notebook import select

    source = select((ROOT / "tools" / "notebook_src" / "07_dispatch_combine.py").read_text(), exercise)
    cells = re.split(r"^# %%.*$", source, flags=re.M)
    code = ("import math\nimport torch\nfrom coursekit import comm\nfrom coursekit.parallel.sequence.comm import all_to_all\n"
            + "\n".join(c for c in cells if any(d in c for d in ("def dispatch", "def combine"))))
    # its source kept where inspect finds it, as IPython keeps a cell's: the grader reads a stub from it
    name = f"<07_dispatch_combine {'exercise' if exercise else 'solution'}>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    namespace: dict = {}
    exec(compile(code, name, "exec"), namespace)
    return {name: namespace[name] for name in ("dispatch", "combine")}


_solution = functions()
dispatch, combine = _solution["dispatch"], _solution["combine"]


class Kept:
    """This rank's assignments within capacity, sorted by expert (token, gate, expert, per_expert): the solution's
    capacity rule, for attempts whose mistake lies elsewhere (the library's ``route`` is held back while grading).
    ``capacity``: C itself, for an attempt that computes it wrong; ``token_major``: the lines formed token by token
    (token 0's choices, then token 1's), not every first choice before any second."""

    def __init__(self, chosen, gates, n_experts, capacity_factor=None, capacity=None, token_major=False):
        tokens, k = chosen.shape
        line = (chosen if token_major else chosen.t()).flatten()  # who stands first in each expert's line
        place = torch.zeros_like(line)
        for expert in range(n_experts):
            place[line == expert] = torch.arange(int((line == expert).sum()))
        if capacity is None:
            capacity = tokens * k if capacity_factor is None else math.ceil(capacity_factor * k * tokens / n_experts)
        kept = place < capacity
        order = torch.argsort(line[kept], stable=True)
        token = (torch.arange(tokens).repeat_interleave(k) if token_major else torch.arange(tokens).repeat(k))
        self.token = token[kept][order]
        self.gate, self.expert = (gates if token_major else gates.t()).flatten()[kept][order], line[kept][order]
        self.per_expert = torch.bincount(self.expert, minlength=n_experts)


def exchanged(x, routing, group=None):
    """The solution's dispatch after its capacity: the counts, the rows, the regrouping; its plan for combine."""
    ep = comm.get_world_size(group)
    local = len(routing.per_expert) // ep
    send = routing.per_expert.view(ep, local)
    with comm.control():
        receive = all_to_all(send, 0, 0, [1] * ep, [1] * ep, group)
    rows = all_to_all(x[routing.token], 0, 0, send.sum(1).tolist(), receive.sum(1).tolist(), group)
    pieces = torch.arange(len(rows)).split(receive.flatten().tolist())
    order = torch.cat([pieces[j * local + e] for e in range(local) for j in range(ep)])
    return rows[order], receive.sum(0).tolist(), (send, receive, order, routing.token, routing.gate)


def overflow_loses(said: str) -> dict:
    """``LOSES`` of an attempt whose only mistake is its capacity rule, named by ``said``, wrong in every case where
    an expert overflows: a quarter of the plain cases, one skewed case in three, the capacity cases; no property."""
    return {"capacity": (0, said), "outputs_equal_one_process": (1.5, said), "skewed_routing": (1.33, said),
            "gradients_equal_one_process": (1.0, "the outputs differ"),
            "traffic": (0, "traffic is judged only for a right answer"),
            "process_groups": (0, "it is wrong with the whole world as the group too"),
            "hidden_sizes": (0, "counts only for a right answer")}
