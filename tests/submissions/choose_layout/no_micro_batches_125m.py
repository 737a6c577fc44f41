"""125 M with dp = 8 and one micro-batch: 32 sequences of 2,048 tokens at once on every GPU. The model states
are 2 GB; the activations Korthikanti et al. count, sbh(34 + 5as/h) a layer, are 117.2 GB
(2,048 · 32 · 768 · 194 bytes a layer × 12; the attention scores' 5as/h = 160 of the 194) and the fp32 logits
4·s·b·v = 13.4 GB more: 130.8 GB of activations, 132.8 GB with the model states (checked by hand)."""

from _cl_solution import but

from coursekit.costmodel import Layout

choose_layout = but(**{"125m": Layout(dp=8)})

SCORE = 7  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"fits_in_memory": (2, ("125m: dp 8, m = 1: does not fit: 132.8 GB per GPU > 80.0 GB",
                                "The largest term: activations 130.8 GB per GPU: at 32 sequences per micro-batch: "
                                "more micro-batches (micro_batches = 2 holds half as many")),
         "follows_the_chapter": (2, "125m: not judged: it does not fit"),
    "hidden_scenarios": (0, "counts only for a right answer")}
