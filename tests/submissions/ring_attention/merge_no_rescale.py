"""The two partial outputs averaged: right only when both parts have the same log-sum-exp (the classic bug:
no rescale by the running max). The ring loop is right, so its traffic is too; its outputs are not.

Seen failing before the fix (the equal-scores case not yet a precondition of merge_exact):
"merge_no_rescale: merge_exact earned 1.0, not 0".
The ring's checks named only the symptom before ("rank 0's output differs from full attention by 0.455"):
"merge_no_rescale: ring_equals_full_attention's feedback lacks 'your merge is wrong (see merge_exact)'"."""

import torch

from _ra_solution import loop_with

EXERCISE = "06_ring_attention"
SCORE = 0  # nothing; a property of a wrong answer earns nothing (issue 58)
LOSES = {"merge_exact": (0, ("the second part's scores 30 higher: the merged output is off by",
                             "it does not rescale by the running max")),
         "ring_equals_full_attention": (0, ("differs from full attention by", "your merge is wrong (see merge_exact)")),
         "causal_masking": (0, ("differs from full attention by", "your merge is wrong (see merge_exact)")),
         "key_value_gradients": (0, "the output differs from full attention (see the checks above)"),
    "traffic_pattern": (0, "counts only for a right answer")}


def merge(o1, lse1, o2, lse2):
    return (o1 + o2) / 2, torch.logaddexp(lse1, lse2)


ring_attention_forward = loop_with(merge=merge)  # the solution's loop, with this merge
