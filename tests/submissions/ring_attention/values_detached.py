"""The values detached before they are stacked with the keys (as if only keys needed a gradient): outputs, dq
and dk exact, but no gradient reaches v, on any rank, at any G."""

from _ra_solution import functions

EXERCISE = "06_ring_attention"
SCORE = 10  # k, v gradients 0 (G = 1 fails too: a failed precondition costs as a case)
LOSES = {"key_value_gradients": (0, "G=1: no gradient reached v on rank 0")}

_solution = functions()
merge = _solution["merge"]
_ring = _solution["ring_attention_forward"]


def ring_attention_forward(q, k, v, causal=False):
    return _ring(q, k, v.detach(), causal)
