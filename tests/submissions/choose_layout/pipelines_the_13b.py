"""13B on one node as a pure pipeline: 8 stages of 5 layers, zero-bubble schedule, 128 micro-batches. The cost
model priced it 0.8% *faster* than any layout without a pipeline on the old single-efficiency Hardware() (17.60 s
against dp 4 × tp 2, ZeRO-1's 17.74 s), so a band around the planner's best credited it; on Hardware.a100() (by shape)
a layout without one is the best. But that gap is far inside what the time model can resolve, and the
lesson of chapter 08 (P10: "pipeline parallelism may bring little for small models"; P8: data + tensor parallelism
for a model too large for one GPU) is to keep pp = 1 where a layout without one does as well. Issue 42, item 4:
it must lose the point, and the feedback must name the layout without a pipeline that does as well."""

from _cl_solution import but

from coursekit.costmodel import Layout

choose_layout = but(**{"13b": Layout(pp=8, schedule="zb_h1", micro_batches=128)})

SCORE = 8  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"follows_the_chapter": (2, ("13b: pp 8, zb_h1, m = 128: a pipeline does not pay here (P10)",
                                     "without one, dp 4 × tp 2, ZeRO-1, m = 8", "fits", "Keep pp = 1")),
    "hidden_scenarios": (0, "counts only for a right answer")}
