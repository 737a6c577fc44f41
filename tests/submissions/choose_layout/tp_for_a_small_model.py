"""Tensor parallelism for every model, the 125 M one too: dp 4 × tp 2. Its model states, 2.0 GB with Adam, fit one
GPU of 80 GB, so chapter 08's first rule (P1, P10: a model that fits one GPU -> data parallelism alone) says tp only
adds all-reduces inside every layer. The same rule catches it on the hidden GPT-3 Medium run."""

from _cl_solution import solution

from coursekit.costmodel import Layout


def choose_layout(scenario):
    chosen = solution(scenario)
    if chosen.tp == 1 and chosen.pp == 1:       # where the solution runs data parallelism alone, split by tp too
        return Layout(dp=chosen.dp // 2, tp=2, micro_batches=chosen.micro_batches)
    return chosen


SCORE = 8  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"follows_the_chapter": (2, ("125m: dp 4 × tp 2, m = 2: the model's states, 2.0 GB with Adam, fit one GPU "
                                     "of 80 GB: data parallelism alone (P1, P10; tp = pp = sp = 1)",)),
         "hidden_scenarios": (0, ("350m: GPT-3 Medium (350 M parameters) on 16 GPUs (2 nodes of 8): dp 8 × tp 2",
                                  "data parallelism alone"))}
