"""The merge rescales each part by e^(lse_i − max) but never divides by the total weight: right to rounding when
one part's scores are 30 higher (the weights are 1 and e^−30), twice the answer when the parts are equal, wrong
when they differ by 1.5. The ring loop is right, so its traffic is too; its outputs are not.

Seen failing before the fix (three merge cases, two of them with a 30 shift):
"merge_not_normalised: merge_exact earned 2.0, not 0".
The ring's checks named only the symptom before ("rank 0's output differs from full attention by 0.455"):
"merge_not_normalised: ring_equals_full_attention's feedback lacks 'your merge is wrong (see merge_exact)'"."""

import torch

from _ra_solution import loop_with

EXERCISE = "06_ring_attention"
SCORE = 0  # nothing; a property of a wrong answer earns nothing (issue 58)
LOSES = {"merge_exact": (0, ("parts with equal scores: the merged output is off by",
                             "the second part's scores 1.5 higher: the merged output is off by",
                             "weighs the two parts by factors that do not sum to one")),
         "ring_equals_full_attention": (0, ("differs from full attention by", "your merge is wrong (see merge_exact)")),
         "causal_masking": (0, ("differs from full attention by", "your merge is wrong (see merge_exact)")),
         "key_value_gradients": (0, "the output differs from full attention (see the checks above)"),
    "traffic_pattern": (0, "counts only for a right answer")}


def merge(o1, lse1, o2, lse2):
    top = torch.maximum(lse1, lse2)
    weight1, weight2 = torch.exp(lse1 - top).unsqueeze(-1), torch.exp(lse2 - top).unsqueeze(-1)
    return weight1 * o1 + weight2 * o2, torch.logaddexp(lse1, lse2)   # the mistake: not divided by weight1 + weight2


ring_attention_forward = loop_with(merge=merge)  # the solution's loop, with this merge
