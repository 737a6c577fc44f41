"""13B on 8 GPUs with plain data parallelism: every GPU keeps all 16 bytes a parameter of model states,
25.7 GB of 16-bit weights, 25.7 GB of gradients and 154.3 GB of Adam's fp32 copy and moments (12 bytes a
parameter). Valid and fast on paper -- it would be the fastest, if it ran -- but 254 GB per GPU."""

from _cl_solution import but

from coursekit.costmodel import Layout

choose_layout = but(**{"13b": Layout(dp=8, micro_batches=16)})

SCORE = 7  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"fits_in_memory": (2, ("13b: dp 8, m = 16: does not fit: 254.0 GB per GPU > 80.0 GB",
                                "The largest term: optimizer state 154.3 GB per GPU: add ZeRO over dp (zero=1 "
                                "shards it dp = 8 ways: 19.3 GB) or split the model by tp")),
         "follows_the_chapter": (2, "13b: not judged: it does not fit (see fits_in_memory)"),
    "hidden_scenarios": (0, "counts only for a right answer")}
