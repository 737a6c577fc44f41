"""Chapter 08's printed answers, copied into a table by scenario key: its planner's first layout for GPT-2-sized,
13B and 175B models (the 175B one is the chapter's worked example, run for run). The chapter laid the 13B out for a
batch of 64, this run has 128: 16 micro-batches of 2 sequences hold 52.5 GB of activations, and it does not fit. The
175B layout is right -- and the three runs the grader keeps hidden get nothing: the table does not know them (issue
42, item 4: the 175B scenario could be copied from the chapter)."""

from coursekit.costmodel import Layout

CHAPTER = {"125m": Layout(dp=8, zero=1, micro_batches=8),
           "13b": Layout(dp=4, tp=2, zero=1, micro_batches=16),
           "175b": Layout(pp=32, dp=4, sp=4, tp=2, zero=1, schedule="zb_h1", micro_batches=384)}


def choose_layout(scenario):
    return CHAPTER[scenario.key]


SCORE = 7
LOSES = {"fits_in_memory": (2, "13b: dp 4 × tp 2, ZeRO-1, m = 16: does not fit: 97.6 GB per GPU > 80.0 GB"),
         "follows_the_chapter": (2, "13b: not judged: it does not fit (see fits_in_memory)"),
         "hidden_scenarios": (0, ("350m: GPT-3 Medium (350 M parameters) on 16 GPUs (2 nodes of 8): choose_layout "
                                  "raised KeyError: '350m'", "6.7b: ", "175b-512: "))}
