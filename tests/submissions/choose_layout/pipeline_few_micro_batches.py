"""175B in Megatron-LM's degrees with 16 micro-batches of 6 sequences (and full recomputation to make them fit):
valid (m = 16 >= p = 8), it fits (42 GB), but 1F1B idles (p − 1)/(m + p − 1) = 7/23 = 30% of the step: over
the fifth chapter 08's rule allows (P7: many micro-batches for a small bubble).

The 30% is the formula's (7/23); the bubble's seconds, (p − 1)/m of a micro-batch's kernels and exposed tp on
Hardware.a100() (priced by shape, issue 59), are not a hand count and are not asserted. (On the old single-efficiency
Hardware(), checked by hand: 21.20 s × 1.332 = 28.24 s of compute, a bubble of 28.24 × 7/16 = 12.36 s.)"""

from _cl_solution import but

from coursekit.costmodel import Layout

choose_layout = but(**{"175b": Layout(dp=16, tp=8, pp=8, zero=1, micro_batches=16, recompute="full")})

SCORE = 8  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"follows_the_chapter": (2, ("175b: dp 16 × tp 8 × pp 8, ZeRO-1, 1f1b, m = 16, recompute full: ",
                                     "the pipeline bubble takes ", "s: pp = 8 at m = 16 idles 30% of the time",
                                     "raise micro_batches", "a bubble under a fifth of the step earns the point")),
    "hidden_scenarios": (0, "counts only for a right answer")}
