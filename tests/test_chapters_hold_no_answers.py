"""No chapter shows an exercise's answer: no chapter code cell holds a reference solution's code.

The exercises and their solutions come from one source each (tools/notebook_src/NN_<exercise>.py); the code
between ``# BEGIN SOLUTION`` and ``# END SOLUTION`` is the answer. A chapter shows the neighbouring mechanism
and leaves that part to the exercise, so none of its code cells may hold a solution block's lines in a row,
compared as normalised source (comments, blank lines and indentation dropped). Blocks of fewer than three
lines are left out: a line such as ``right, left = (r + 1) % G, (r - 1) % G`` is the ring's vocabulary, not its
answer. Planted bug, seen failing: the ring's reduce-scatter loop pasted into chapter 01.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "tools" / "notebook_src"
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = sorted(p for p in SOURCES.glob("[0-9][0-9]_*.py") if "# BEGIN SOLUTION" in p.read_text())


def normalised(code: str) -> list[str]:
    lines = []
    for line in code.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            lines.append(" ".join(line.split()))
    return lines


def solution_blocks(source: str) -> list[list[str]]:
    """The normalised code of each ``# BEGIN SOLUTION`` block (markdown ones, all comments, come out empty)."""
    blocks = re.findall(r"^\s*# BEGIN SOLUTION\n(.*?)^\s*# END SOLUTION", source, re.M | re.S)
    return [lines for lines in map(normalised, blocks) if len(lines) >= 3]


def holds(cell: list[str], block: list[str]) -> bool:
    return any(cell[i:i + len(block)] == block for i in range(len(cell) - len(block) + 1))


def answers_in(chapter_cells: list[str], exercise_source: str) -> list[str]:
    """The first line of each solution block some chapter cell holds."""
    cells = [normalised(code) for code in chapter_cells]
    return [block[0] for block in solution_blocks(exercise_source) if any(holds(cell, block) for cell in cells)]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_no_chapter_cell_holds_a_solution(chapter):
    code = ["".join(c["source"]) for c in json.loads(chapter.read_text())["cells"] if c["cell_type"] == "code"]
    found = {exercise.stem: answers_in(code, exercise.read_text()) for exercise in EXERCISES}
    found = {name: lines for name, lines in found.items() if lines}
    assert not found, f"{chapter.name} shows the answer of {found}: show the neighbouring piece instead"


def test_every_exercise_has_solution_code_to_compare():
    assert len(EXERCISES) == 9 and all(solution_blocks(p.read_text()) for p in EXERCISES), \
        [p.name for p in EXERCISES if not solution_blocks(p.read_text())]


def test_a_pasted_solution_is_found():
    ring = (SOURCES / "01_ring_allreduce.py").read_text()
    block = re.search(r"^# BEGIN SOLUTION\n(    segments = tensor.*?)^# END SOLUTION", ring, re.M | re.S).group(1)
    pasted = "def my_reduce_scatter(tensor, r, G, group):\n" + block.replace("    ", "        ", 1)
    assert answers_in([pasted], ring) == ["segments = tensor.view(-1).tensor_split(G)"]
    assert answers_in(["segments = tensor.view(-1).tensor_split(G)\nprint(segments)"], ring) == []


def shown_names(chapter_source: str) -> list[str]:
    """The names a chapter source passes to ``coursekit.show(...)``, as written (``DataParallel._attach``)."""
    return re.findall(r"coursekit\.show\(\s*([\w.]+)\s*\)", chapter_source)


@pytest.mark.parametrize("chapter", sorted(p for p in SOURCES.glob("[0-9][0-9]_*.py")
                                           if "# BEGIN SOLUTION" not in p.read_text()), ids=lambda p: p.stem)
def test_no_chapter_shows_a_function_an_exercise_holds_back(chapter):
    """``coursekit.show`` refuses an answer when the chapter runs (coursekit/answers.py): catch it here, in
    seconds, not when papermill executes the chapter. Planted, seen failing: chapter 07 showing
    keep_within_capacity after exercise 07 began holding it back."""
    from coursekit.answers import ANSWERS

    spellings = set()  # how a chapter names each answer: ``merge``, ``Routing.__init__``
    for qualified in ANSWERS:
        parts = qualified.split(".")
        spellings.add(".".join(parts[-2:]) if parts[-2].lstrip("_")[:1].isupper() else parts[-1])
    shown = [name for name in shown_names(chapter.read_text())
             if any(name == spelling or name.endswith("." + spelling) for spelling in spellings)]
    assert not shown, (f"{chapter.name} shows {shown}, which an exercise holds back as its answer: show the "
                       f"neighbouring piece, or run it on an example instead")
