"""13B with ZeRO-3 over all 8 GPUs and 16 micro-batches: the model states fit (27 GB), but ZeRO-3 gathers every
parameter before each micro-batch's forward and again before its backward, and reduce-scatters its gradients
after: 3 · 16 collectives of the whole model a step, exposed.

Checked by hand: each all-gather or reduce-scatter is 7 ring steps of Ψ/8 = 1.607 G 16-bit elements over NVLink,
7 · (3.215 GB / 300 GB/s + 5 µs) = 75.0 ms; 48 of them: 3.60 s, on top of 17.61 s of compute."""

from _cl_solution import but

from coursekit.costmodel import Layout

choose_layout = but(**{"13b": Layout(dp=8, zero=3, micro_batches=16, recompute="selective")})

SCORE = 8
LOSES = {"near_best_step_time": (2, ("13b: dp 8, ZeRO-3, m = 16, recompute selective: step 21.22 s",
                                     "compute 17.61 s, bubble 0.000 s, exposed communication 3.60 s",
                                     "ZeRO-3 gathers the parameters before every forward and backward of each of the "
                                     "m = 16 micro-batches: 3.60 s exposed over dp = 8 inside the node (NVLink)"))}
