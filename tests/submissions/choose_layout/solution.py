"""The notebook's solution: data parallelism for 125 M, tp 2 × dp 4 with ZeRO-1 for 13B, Megatron-LM's
tp 8 × pp 8 × dp 16 for 175B -- each valid, fitting, and within 10% of the planner's best."""

from _cl_solution import solution as choose_layout  # noqa: F401

SCORE = 12  # 4 checks × 3 runs, one point each (the last on the hidden runs)
LOSES = {}
