"""Exercise 09's multiple choice: for each broken program, four readings of its report, one of them right.

The wrong readings are the ones a report invites: program A's length error ends "did one rank build its
gradients differently?"; program B's timeout says "pass a larger timeout="; program C's loss differs from
one process, which could be the averaging, the data or rounding. The options are about as long as each other
(the right one is never the longest) and the right letter differs from program to program.

The three readings are judged together (:func:`judge_diagnosis`): right only when all three are, and a wrong set
is told where to look in every report, in the same words whichever letters are wrong. So a score or a feedback
says nothing about any one letter: finding the letters by trying them takes up to 4 x 4 x 4 = 64 gradings,
where reading the reports takes three. (One point per program, with a sentence for each wrong one, let a retry
find each letter in at most three tries: issue 42, item 5.) The notebook prints the options from here
(:func:`options_text`), so the question and the grader never disagree.
"""

from __future__ import annotations

__all__ = ["OPTIONS", "ANSWERS", "LOOK_AGAIN", "NOT_EVERY_READING", "options_text", "judge_diagnosis"]

OPTIONS: dict[str, dict[str, str]] = {
    "program_a": {
        "A": "Rank 1 built its model differently: its first gradient has 1024 elements where rank 0's has 1.",
        "B": "The loss must be reshaped to the gradient's shape before it is all-reduced, so the lengths agree.",
        "C": "Gloo cannot all-reduce a single element: pass the loss to the ring as part of a larger tensor.",
        "D": "Rank 0 all-reduces the loss inside `if rank == 0:` while rank 1 all-reduces its first gradient.",
    },
    "program_b": {
        "A": "Each rank sends to r-1, the neighbour it also receives from: nobody sends to the rank waiting.",
        "B": "Rank 2 crashed at the start, so the two other ranks wait for its message forever and time out.",
        "C": "The timeout is too short for three ranks: with timeout=30 the ring would finish all of its steps.",
        "D": "The ring takes one step too many: at its last step no rank has any message left to receive.",
    },
    "program_c": {
        "A": "The gradients are summed, not averaged, so every step moves each replica's weights too far.",
        "B": "Rank 1 starts from weights of its own (its seed is 1000 + rank); nobody sends it rank 0's.",
        "C": "The ranks draw different samples, but every rank should train on the same batch of samples.",
        "D": "Float32 rounding: a sum over the ranks adds in another order than the one process does.",
    },
}
ANSWERS = {"program_a": "D", "program_b": "A", "program_c": "B"}

#: Where in each report the answer is: said for every program whenever the three readings are not all right.
LOOK_AGAIN = {
    "program_a": "read the length error again: what did each rank pass to the call that failed (1 element is "
                 "the loss), and where in its step was each rank then?",
    "program_b": "read the timeout report again: at which ring step does each rank wait, and on which rank? "
                 "All three are still waiting there. Then ask why the same code finished on two ranks, in the "
                 "run before it",
    "program_c": "look at the replicas before the first step (replicas_compared): which rank differs from rank "
                 "0 there, and where did its weights come from?",
}


def options_text(program: str) -> str:
    """The options for ``program`` as the notebook prints them: one per line, ``A) ...``."""
    return "\n".join(f"{letter}) {text}" for letter, text in OPTIONS[program].items())


#: The first line of what a wrong set of readings is told, whichever of its letters are wrong.
NOT_EVERY_READING = ("not every reading is the one its report supports. These words are the same whichever "
                     "letters are wrong: look again at each report")


def judge_diagnosis(answers: dict) -> tuple[list[str], bool]:
    """What is wrong with the three readings (an empty list: all right) and whether nothing was answered at all.

    A program not answered, or answered with something other than a letter, is named; the letters are then not
    judged (judging them would tell which of the others are right). Three letters are judged together.
    """
    problems, answered, letters = [], False, {}
    for program, options in OPTIONS.items():
        given = str(answers.get(program, "?")).strip().upper()
        if given in ("?", ""):
            problems.append(f"{program}: not answered: give one of {', '.join(options)} (got {answers.get(program)!r})")
            continue
        answered = True
        if given not in options:
            problems.append(f"{program}: a letter is expected, one of {', '.join(options)}: the reading you choose "
                            f"from the options printed under the program (got {answers.get(program)!r})")
            continue
        letters[program] = given
    if problems:
        return problems + ["the readings are judged once all three are letters, and together"], not answered
    if letters == ANSWERS:
        return [], False
    return [NOT_EVERY_READING] + [f"{program}: {LOOK_AGAIN[program]}" for program in OPTIONS], False
