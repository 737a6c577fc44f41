"""The values detached before they are stacked with the keys (as if only keys needed a gradient): outputs, dq
and dk exact, but no gradient reaches v, on any rank, at any G."""

from _ra_solution import functions

EXERCISE = "06_ring_attention"
SCORE = 8  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"key_value_gradients": (0, "G=1: no gradient reached v on rank 0"),
    "traffic_pattern": (0, "counts only for a right answer")}

_solution = functions()
merge = _solution["merge"]
_ring = _solution["ring_attention_forward"]


def ring_attention_forward(q, k, v, causal=False):
    return _ring(q, k, v.detach(), causal)
