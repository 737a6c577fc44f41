"""The library's own dispatch and combine handed in (coursekit.parallel.expert): exact, and nothing is the
learner's. While the grader runs them they refuse (coursekit.answers holds them back), and every check says so.

Seen scoring 14/14 before dispatch and combine were listed as answers to 07_dispatch_combine."""

from coursekit.parallel.expert import combine as library_combine
from coursekit.parallel.expert import Routing, keep_within_capacity
from coursekit.parallel.expert import dispatch as library_dispatch

EXERCISE = "07_dispatch_combine"
SCORE = 0
HELD = ("coursekit.parallel.expert.core.keep_within_capacity was called: it is coursekit's own answer to "
        "exercise 07_dispatch_combine", "keep each expert's assignments within capacity yourself")
LOSES = {"dispatch_rows": (0, HELD), "outputs_equal_one_process": (0, HELD), "skewed_routing": (0, HELD),
         "gradients_equal_one_process": (0, HELD), "capacity": (0, HELD), "traffic": (0, HELD), "process_groups": (0, HELD),
         "hidden_sizes": (0, HELD)}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    routing = Routing(chosen, gates, keep_within_capacity(chosen, n_experts, capacity_factor), n_experts)
    rows, rows_per_local_expert, plan = library_dispatch(x, routing, group)
    return rows, rows_per_local_expert, (plan, routing)


def combine(y, plan, tokens, group=None):
    plan, routing = plan
    return library_combine(y, routing, plan, tokens, group)
