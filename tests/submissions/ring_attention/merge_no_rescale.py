"""The two partial outputs averaged: right only when both parts have the same log-sum-exp (the classic bug:
no rescale by the running max). The ring loop is right, so its traffic is too; its outputs are not."""

import torch

from _ra_solution import loop_with

EXERCISE = "06_ring_attention"
SCORE = 3  # merge 1 (the equal-scores case) + traffic 2; the ring's outputs wrong at G >= 2 (G = 1 earns nothing)
LOSES = {"merge_exact": (1, ("the second part's scores 30 higher: the merged output is off by",
                             "it does not rescale by the running max")),
         "ring_equals_full_attention": (0, "differs from full attention by"),
         "causal_masking": (0, "differs from full attention by"),
         "key_value_gradients": (0, "the output differs from full attention (see the checks above)")}


def merge(o1, lse1, o2, lse2):
    return (o1 + o2) / 2, torch.logaddexp(lse1, lse2)


ring_attention_forward = loop_with(merge=merge)  # the solution's loop, with this merge
