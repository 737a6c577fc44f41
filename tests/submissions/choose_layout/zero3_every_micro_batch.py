"""13B with ZeRO-3 over all 8 GPUs and 16 micro-batches: the model states fit (27 GB), but ZeRO-3 gathers every
parameter before each micro-batch's forward and again before its backward, and reduce-scatters its gradients
after: 3 · 16 collectives of the whole model a step, exposed.

Checked by hand: each all-gather or reduce-scatter is 7 ring steps of Ψ/8 = 1.607 G 16-bit elements over NVLink,
7 · (3.215 GB / 300 GB/s + 5 µs) = 75.0 ms; 48 of them: 3.60 s, on top of 17.61 s of compute.

It used to lose a point for being 21% slower than the planner's best (a 10% band). Issue 42 (item 4) asked for the
reasoning the chapter teaches, not a band its time model cannot resolve: ZeRO-3 over the node is the chapter's other
answer for a model that does not fit one GPU (the dp_overlap ranking of section 4), and 1.21 x is inside the factor
of 1.5 the model is checked to. It now earns full marks; the grader says where the time goes only past 1.5 x."""

from _cl_solution import but

from coursekit.costmodel import Layout

choose_layout = but(**{"13b": Layout(dp=8, zero=3, micro_batches=16, recompute="selective")})

SCORE = 12  # 1.21 x the best: within the factor the time model is checked to, so full marks (see above)
LOSES = {}
