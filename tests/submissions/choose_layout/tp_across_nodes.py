"""175B with tp = 16: the tensor-parallel group spans two nodes of 8, so its all-reduces (4 a layer and
micro-batch) run over InfiniBand at 25 GB/s instead of NVLink's 300. Valid (16 divides 96 heads), it fits
(53 GB), but its step takes 2.6 × the planner's best.

Checked by hand: compute (6P + 12Lsh) · 1,536 · 2,048 tokens / 1,024 GPUs / 156 TFLOP/s = 21.20 s (P = 174.6 B with
the padded vocabulary), the 1F1B bubble 21.20 · (p − 1)/m = 21.20 · 3/96 = 0.663 s; tp's (4 · 24 + 1) · 96 all-reduces
of b·s·h = 25.2 M 16-bit elements a step, a ring over InfiniBand 2 · 15/16 · 50.3 MB / 25 GB/s = 3.8 ms each: about
35 s, against 0.31 ms each on NVLink (those numbers for the old single-efficiency Hardware(); on Hardware.a100(),
priced by shape, the links run at Calculon's 0.9 and 0.65 of their bandwidth, and the step's seconds are not
asserted here)."""

from _cl_solution import but

from coursekit.costmodel import Layout

choose_layout = but(**{"175b": Layout(dp=16, tp=16, pp=4, zero=1, micro_batches=96)})

SCORE = 8  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"follows_the_chapter": (2, ("175b: dp 16 × tp 16 × pp 4, ZeRO-1, 1f1b, m = 96: ",
                                     "the tp = 16 group crosses nodes (8 GPUs a node)", "s of the step",
                                     "keep tp inside a node (tp <= 8)")),
    "hidden_scenarios": (0, "counts only for a right answer")}
