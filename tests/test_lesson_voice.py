"""A chapter is a lesson, not a report of how it was checked (issue 56, section 3; docs: chapter-style).

What a learner reads in ``notebooks/`` (the main text: markdown outside ``<details>`` notes; the comments in code
cells; what the cells printed) names no test file, no benchmark command, nothing nbval or papermill does, no
verdict on "this run", no venv path from a raw warning, and no project status ("has not run on NCCL yet").
The notes (``<details>``) may link tests and benchmarks: that is where the checking lives.

Planted, seen failing: "Skipped by nbval (papermill runs it)" put back as a comment in a code cell of chapter
02's notebook; "`tests/test_netsim.py` checks them" moved out of chapter 01's note into its main text. Before
issue 56's edits it failed on eight chapters (02-06, 08-10).
"""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

# Each phrase, and why a learner should not read it.
PHRASES = {
    r"\bnbval\b": "what nbval compares is the tests' business",
    r"\bpapermill\b": "how the tests execute a notebook",
    r"(?<![\w/])tests/": "a path into the test suite",
    r"\btest_\w+\.py\b": "a test file",
    r"coursekit\.bench\s+\w+|-m coursekit\.bench\b": "a benchmark command",
    r"--check\b": "a benchmark's target check",
    # "this run: ...", "this run cannot show P10"; not a log line's "(not written by this run)"
    r"\bthis run\s*(?::|cannot\b|does not\b|shows\b)": "a verdict on this particular run",
    r"\b(?:cannot|does not) show P\d+": "a verdict on this particular run",
    r"has not run (?:on \w+ )?yet|no GPU has been lent": "the project's status",
    r"site-packages|\.venv/": "a path of the machine that executed the notebook",
    r"\bfr_trace\b|\bKeyError\b": "a PyTorch bug report (the Flight Recorder's analyser on gloo)",
}
FOUND = re.compile("|".join(f"(?:{p})" for p in PHRASES), re.I)


def main_text(markdown: str) -> str:
    """Markdown without its ``<details>`` notes."""
    return re.sub(r"<details>.*?</details>", "", markdown, flags=re.S)


def comments(code: str) -> list[str]:
    """The ``#`` comments of a code cell (magics such as ``%matplotlib`` are not Python: read line by line)."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in code.splitlines())
    try:
        return [t.string for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return [line for line in code.splitlines() if line.lstrip().startswith("#")]


def printed(cell: dict) -> str:
    parts = []
    for output in cell.get("outputs", []):
        text = output.get("text") or output.get("data", {}).get("text/plain", "")
        parts.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(parts)


def narration(cells: list[dict]) -> list[str]:
    """``"cell N (where): line"`` for every line a learner reads that holds one of PHRASES."""
    found = []
    for number, cell in enumerate(cells):
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            places = [("text", main_text(source))]
        else:
            places = [("comment", "\n".join(comments(source))), ("output", printed(cell))]
            # a verdict is printed by a string the cell writes, not only commented
            places.append(("code", "\n".join(re.findall(r"[\"'](this run\b[^\"']*)", source, re.I))))
        for where, text in places:
            found += [f"cell {number} ({where}): {line.strip()[:120]}" for line in text.splitlines()
                      if FOUND.search(line)]
    return found


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_does_not_narrate_its_checking(chapter):
    cells = json.loads(chapter.read_text(encoding="utf-8"))["cells"]
    found = narration(cells)
    assert not found, f"{chapter.name} narrates its checking where a learner reads it:\n  " + "\n  ".join(found)


def _cell(kind: str, source: str, output: str = "") -> dict:
    cell = {"cell_type": kind, "source": [source]}
    if kind == "code":
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": [output]}]
    return cell


def test_the_reader_finds_each_kind_of_narration_and_spares_the_notes():
    assert narration([_cell("code", "# Skipped by nbval (papermill runs it)\nx = 1")]) == [
        "cell 0 (comment): # Skipped by nbval (papermill runs it)"]
    assert narration([_cell("code", 'print(f"this run: {x}")', "this run: 3")]) == [
        "cell 0 (output): this run: 3", "cell 0 (code): this run: {x}"]
    assert narration([_cell("markdown", "Run `python -m coursekit.bench data --check`.")])
    assert narration([_cell("code", "x = 1", "/home/u/.venv/lib/site-packages/torch/a.py:3: UserWarning: hm")])
    note = "Text.\n<details><summary>How</summary>\n`tests/test_netsim.py` checks them.\n</details>"
    assert narration([_cell("markdown", note)]) == []
    assert narration([_cell("code", "# %matplotlib inline\nx = 'tests/ are not a comment here'")]) == []
