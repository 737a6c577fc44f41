"""Exercise 08's multiple choice: for each broken program, four readings of its report, one of them right.

The wrong readings are the ones a report invites: program A's length error ends "did one rank build its
gradients differently?"; program B's timeout says "pass a larger timeout="; program C's loss differs from
one process, which could be the averaging, the data or rounding. Each wrong option carries the reason it is
wrong, said back to a learner who picks it (:func:`judge_diagnosis`). The notebook prints the options from
here (:func:`options_text`), so the question and the grader never disagree.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Option", "OPTIONS", "ANSWERS", "options_text", "judge_diagnosis"]


class Option(NamedTuple):
    text: str
    why_not: str = ""   # for a wrong option: what in the report says otherwise


OPTIONS: dict[str, dict[str, Option]] = {
    "program_a": {
        "A": Option("Rank 1 built its model differently: its first gradient has 1024 elements where rank 0's has 1.",
                    "every rank builds the same tiny_mlp(seed=0); rank 1's 1024 elements are the gradient of "
                    "layers.0.weight, as on rank 0. The 1 element on rank 0 is the loss: the two ranks are in "
                    "different all-reduces"),
        "B": Option("The ranks are in different all-reduces: rank 0 all-reduces the loss (1 element) inside "
                    "`if rank == 0:`, while rank 1, which skipped it, already all-reduces its first gradient "
                    "(1024 elements)."),
        "C": Option("The loss must be reshaped to the gradient's shape before it is all-reduced.",
                    "a collective needs the same tensor shape on every rank *in the same call*; reshaping the loss "
                    "would only add the loss to a gradient. The two ranks are in different all-reduces"),
        "D": Option("Gloo cannot all-reduce a single element: pass a larger tensor.",
                    "one element all-reduces fine (chapter 01 sums tensors of any length); the length check compares "
                    "what two ranks passed to the same call, and here they passed different tensors"),
    },
    "program_b": {
        "A": Option("Rank 2 crashed, so the others wait for it forever.",
                    "rank 2 is in the report, alive: it waits in recv from rank 1, like every rank waits on "
                    "another"),
        "B": Option("The timeout is too short for three ranks: timeout=30 would let it finish.",
                    "every rank waits at ring step 0 for a message nobody sends; on two ranks the same program "
                    "finished at once. More time changes nothing"),
        "C": Option("Each rank sends to the neighbour it also receives from (r-1), so nobody sends to the rank "
                    "waiting on it; on two ranks both neighbours are the same rank, which hid the bug."),
        "D": Option("The ring takes one step too many: at its last step no message is left to receive.",
                    "the ranks are stuck at ring step 0, the first step, not the last"),
    },
    "program_c": {
        "A": Option("The gradients are summed, not averaged, so every step is too large.",
                    "average_gradients divides by world_size and every rank holds the same averaged gradient; "
                    "what differs is the weights the ranks start from (the replicas compared: rank 1, before "
                    "the first step)"),
        "B": Option("The ranks draw different samples: every rank should train on the same batch.",
                    "different samples on each rank is the point of data parallelism; the one-process run "
                    "trains on all of them together"),
        "C": Option("Float32 rounding: a sum over ranks adds in another order than one process does.",
                    "rounding moves the last digits (1e-7); here the loss differs by 0.07, and rank 1's weights "
                    "differ from rank 0's before the first step"),
        "D": Option("Rank 1 starts from weights of its own (its seed is 1000 + rank) and nobody copies rank 0's to "
                    "it: averaged gradients move both replicas by the same step, so they never meet."),
    },
}
ANSWERS = {"program_a": "B", "program_b": "C", "program_c": "D"}


def options_text(program: str) -> str:
    """The options for ``program`` as the notebook prints them: one per line, ``A) ...``."""
    return "\n".join(f"{letter}) {option.text}" for letter, option in OPTIONS[program].items())


def judge_diagnosis(answers: dict) -> tuple[list[str | None], bool]:
    """One outcome per program (None: right, else why not) and whether nothing was answered at all."""
    outcomes, answered = [], False
    for program, options in OPTIONS.items():
        given = str(answers.get(program, "?")).strip().upper()
        if given in ("?", ""):
            outcomes.append(f"{program}: not answered: give one of {', '.join(options)} (got {answers.get(program)!r})")
            continue
        answered = True
        if given not in options:
            outcomes.append(f"{program}: a letter is expected, one of {', '.join(options)}: the reading you choose "
                            f"from the options printed under the program (got {answers.get(program)!r})")
            continue
        if given == ANSWERS[program]:
            outcomes.append(None)
        else:
            outcomes.append(f"{program}: {given} is not it: {options[given].why_not}")
    return outcomes, not answered
