"""The merge written from the definition, e^lse1 and e^lse2 without subtracting the larger one first: exact for the
modest scores of the ring's cases and of merge_exact's ±1.5 and ±30, but e^lse overflows once the scores are large
(past e^709 in float64, e^88 in float32): inf / inf = NaN. The ring loop is the solution's.

Seen scoring 12/12 before the large-score cases (merge_exact shifted scores by at most 30, in float64)."""

import torch

from _ra_solution import loop_with

EXERCISE = "06_ring_attention"
SCORE = 8.5  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"merge_exact": (1.5, ("merged output is off by nan",
                               "merge overflows for large scores: subtract the running maximum before exp")),
    "traffic_pattern": (0, "counts only for a right answer")}


def merge(o1, lse1, o2, lse2):
    w1, w2 = torch.exp(lse1), torch.exp(lse2)        # the mistake: e^lse, not e^(lse − max)
    total = w1 + w2
    return (w1.unsqueeze(-1) * o1 + w2.unsqueeze(-1) * o2) / total.unsqueeze(-1), torch.log(total)


ring_attention_forward = loop_with(merge=merge)  # the solution's loop, with this merge
