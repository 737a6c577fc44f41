"""Each exercise asks for a mechanism from a contract; it never dictates the answer (issue 58, item 1).

An exercise and its solution come from one source (tools/notebook_src/NN_<exercise>.py); the code between
``# BEGIN SOLUTION`` and ``# END SOLUTION`` (less its ``# EXERCISE:`` lines) is the reference answer. Two rules:

* no line of the answer appears in the exercise notebook the learner opens (exercises/NN_<exercise>.ipynb), in
  its text or its cells. Lines are compared normalised: indentation, runs of spaces and trailing comments
  dropped; blank lines, comments, imports and trivial lines (``pass``, ``return out``, a lone bracket,
  ``else:``, ``for work in works:``) ignored. A line of the answer is found when a cell holds it as a line of its own, or, if it is long enough to
  be more than vocabulary (:data:`QUOTED`), anywhere in a line of text or code (quoted in backticks, say);
* each reference answer is at least :data:`ANSWER_LINES` lines of code that count (the same normalisation).

Lines shorter than :data:`VOCABULARY` characters (``work.wait()``, ``total += x``) are the language's vocabulary:
counted, never compared. A find-the-bug exercise (09) gives broken programs to copy (its code cells defining
``broken_*`` functions): there the answer that must not be given is the fix, the answer's lines those programs lack.

Planted bug, seen failing: exercise 01's ``segments = tensor.view(-1).tensor_split(G)`` quoted in its text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "tools" / "notebook_src"
EXERCISES = sorted(p for p in SOURCES.glob("[0-9][0-9]_*.py") if "# BEGIN SOLUTION" in p.read_text())
ANSWER_LINES = 15
VOCABULARY = 12  # characters: a shorter line is compared nowhere
QUOTED = 24  # characters: a normalised line this long is found inside a longer line of text or code too
# Lines with nothing of the answer in them: they end or open a block whatever the code.
TRIVIAL = re.compile(r"^(pass|return|break|continue|else:|try:|finally:|[)\]}]+[,:]?|\"\"\".*|"
                     r"(return|yield) \w+|for \w+ in \w+:|\w+ = (\[\]|\{\}|None))$")


def normalised(line: str) -> str:
    """One line without indentation, runs of spaces or a trailing comment ('' for a blank or a comment line)."""
    line = re.sub(r"\s+#(?![^\"']*[\"'][,)\]]).*$", "", line).strip()
    return "" if line.startswith("#") else " ".join(line.split())


def counts(line: str) -> bool:
    """A line of the learner's own code: not blank, not an import, not a line that only closes or opens a block."""
    return bool(line) and not line.startswith(("import ", "from ")) and not TRIVIAL.match(line)


def answer(source: str) -> list[str]:
    """The normalised lines of code of every solution block (the exercise's own lines left out)."""
    blocks = re.findall(r"^\s*# BEGIN SOLUTION\n(.*?)^\s*# END SOLUTION", source, re.M | re.S)
    lines = [normalised(line) for block in blocks for line in block.splitlines()
             if not line.lstrip().startswith("# EXERCISE:")]
    return [line for line in lines if counts(line)]


def copied(cells: list[dict]) -> set[str]:
    """The normalised lines of the broken programs a find-the-bug exercise gives to copy and fix."""
    programs = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"
                and re.search(r"^def broken_\w+\(", "".join(c["source"]), re.M)]
    return {normalised(line) for program in programs for line in program.splitlines()}


def learner_sees(notebook: Path) -> tuple[set[str], list[str], set[str]]:
    """The exercise notebook's lines: the code cells' lines as a set, every line of text and code, and the lines
    of the broken programs it gives to copy."""
    cells = json.loads(notebook.read_text())["cells"]
    code, every = set(), []
    for cell in cells:
        for line in "".join(cell["source"]).splitlines():
            every.append(" ".join(line.split()))
            if cell["cell_type"] == "code":
                code.add(normalised(line))
    return code, every, copied(cells)


def given_away(source: str, notebook: Path) -> list[str]:
    """The answer's lines the exercise notebook holds, in the answer's order."""
    code, every, given = learner_sees(notebook)
    found = []
    for line in answer(source):
        if len(line) < VOCABULARY or line in given:
            continue
        if line in code or (len(line) >= QUOTED and any(line in text for text in every)):
            found.append(line)
    return list(dict.fromkeys(found))


def test_all_nine_exercises_are_compared():
    assert [p.stem[:2] for p in EXERCISES] == [f"0{n}" for n in range(1, 10)], [p.name for p in EXERCISES]
    assert all((ROOT / "exercises" / f"{p.stem}.ipynb").exists() for p in EXERCISES)


@pytest.mark.parametrize("source", EXERCISES, ids=lambda p: p.stem)
def test_no_line_of_the_answer_is_in_the_exercise(source):
    found = given_away(source.read_text(), ROOT / "exercises" / f"{source.stem}.ipynb")
    assert not found, (f"exercises/{source.stem}.ipynb holds {len(found)} line(s) of its reference answer, e.g. "
                       f"{found[:3]}: state the contract (inputs, outputs, tools, property) instead of the code")


@pytest.mark.parametrize("source", EXERCISES, ids=lambda p: p.stem)
def test_the_answer_is_the_learners_own_code(source):
    lines = answer(source.read_text())
    assert len(lines) >= ANSWER_LINES, (f"{source.name}'s reference answer is {len(lines)} lines of code, fewer "
                                        f"than {ANSWER_LINES}: widen the exercise to the whole mechanism")


def test_a_dictated_line_is_found(tmp_path):
    """The planted bug: a line of the ring's answer quoted in exercise 01's text, and pasted into a cell."""
    source = (SOURCES / "01_ring_allreduce.py").read_text()
    line = "segments = tensor.view(-1).tensor_split(G)"
    assert line in answer(source)
    notebook = json.loads((ROOT / "exercises" / "01_ring_allreduce.ipynb").read_text())
    for planted in ({"cell_type": "markdown", "source": f"Start with `{line}`, then walk the ring."},
                    {"cell_type": "code", "source": f"def reduce_scatter(tensor, group=None):\n    {line}  # mine"}):
        copy = tmp_path / "planted.ipynb"
        copy.write_text(json.dumps({**notebook, "cells": notebook["cells"] + [planted]}))
        assert line in given_away(source, copy)
    fixed = "sending = comm.isend(passing, dst=right)"  # exercise 09's fix of the ring (the broken one sends left)
    find_the_bug = (SOURCES / "09_find_the_bug.py").read_text()
    assert fixed in answer(find_the_bug)
    notebook = json.loads((ROOT / "exercises" / "09_find_the_bug.ipynb").read_text())
    copy = tmp_path / "planted.ipynb"
    copy.write_text(json.dumps({**notebook, "cells": notebook["cells"] + [
        {"cell_type": "markdown", "source": f"Hint: `{fixed}`."}]}))
    assert given_away(find_the_bug, copy) == [fixed]


def test_normalisation_keeps_what_counts():
    assert normalised("    x = f(a,   b)   # why") == "x = f(a, b)"
    assert normalised("    # a comment") == ""
    assert [counts(normalised(s)) for s in ("pass", "    )", "return", "import torch", "return out",
                                            "for work in works:", "return out / size")] == \
        [False, False, False, False, False, False, True]
