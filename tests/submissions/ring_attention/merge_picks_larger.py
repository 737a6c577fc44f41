"""The merge keeps the part with the larger log-sum-exp, output and lse (a max where a weighted sum belongs): right
to rounding when one part's scores are 30 higher (the other weighs e^−30), wrong when they differ by 1.5, and its
lse is log 2 short when the parts are equal. The ring loop is right, so its traffic is too; its outputs are not.

Seen failing before the fix (three merge cases, two of them with a 30 shift):
"merge_picks_larger: merge_exact earned 2.0, not 0".
The ring's checks named only the symptom before ("rank 0's output differs from full attention by 0.455"):
"merge_picks_larger: ring_equals_full_attention's feedback lacks 'your merge is wrong (see merge_exact)'"."""

import torch

from _ra_solution import loop_with

EXERCISE = "06_ring_attention"
SCORE = 0  # nothing; a property of a wrong answer earns nothing (issue 58)
LOSES = {"merge_exact": (0, ("the second part's scores 1.5 higher: the merged output is off by",
                             "keeps only the part with the larger log-sum-exp")),
         "ring_equals_full_attention": (0, ("differs from full attention by", "your merge is wrong (see merge_exact)")),
         "causal_masking": (0, ("differs from full attention by", "your merge is wrong (see merge_exact)")),
         "key_value_gradients": (0, "the output differs from full attention (see the checks above)"),
    "traffic_pattern": (0, "counts only for a right answer")}


def merge(o1, lse1, o2, lse2):
    first = (lse1 >= lse2).unsqueeze(-1)
    return torch.where(first, o1, o2), torch.maximum(lse1, lse2)


ring_attention_forward = loop_with(merge=merge)  # the solution's loop, with this merge
