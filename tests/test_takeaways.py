"""Every number a chapter's takeaway quotes is in the output above it.

A takeaway is the paragraph that starts ``**Takeaway:**`` in a markdown cell: the one sentence a learner
repeats. The output above it is what the code cells of its section printed (since the last heading), as the
committed notebook holds it. A number in the takeaway must be one of those outputs' numbers, rounded as the
takeaway writes it ("51%" from "51.2%", "1.5×" from "1.52×"). Chapter numbers ("chapter 08") and claim names
("P7") are names, not measurements. Planted bugs, seen failing: a takeaway quoting 11 where the output says 10;
a number from an earlier section's output.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NUMBER = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)(?![\w])")
NAMES = re.compile(r"\b(?:chapters?|sections?|ch\.)\s+\d\d(?:[–-]\d\d)?|\b[PR]\d+\b|`[^`]*`", re.I)


def _source(cell) -> str:
    return "".join(cell["source"])


def _printed(cell) -> str:
    out = []
    for output in cell.get("outputs", []):
        if "text" in output:
            out.append("".join(output["text"]))
        elif "data" in output and "text/plain" in output["data"]:
            out.append("".join(output["data"]["text/plain"]))
    return "\n".join(out)


def _numbers(text: str) -> list[str]:
    return NUMBER.findall(NAMES.sub(" ", text))


def _matches(quoted: str, printed: list[str]) -> bool:
    """``quoted`` is one of ``printed``, as written or rounded to as many decimals as it shows."""
    value = float(quoted.replace(",", ""))
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    return any(round(float(p.replace(",", "")), decimals) == value for p in printed)


def unsupported_numbers(cells: list[dict]) -> list[str]:
    """``"takeaway: number"`` for each number a takeaway quotes that its section's outputs do not hold."""
    problems, printed = [], []
    for cell in cells:
        source = _source(cell)
        if cell["cell_type"] == "code":
            printed += _numbers(_printed(cell))
            continue
        for paragraph in re.split(r"\n\s*\n", source):
            if paragraph.lstrip().startswith("**Takeaway:**"):
                said = " ".join(paragraph.split())
                problems += [f"{said[:70]}...: {n}" for n in _numbers(said) if not _matches(n, printed)]
        if re.search(r"^#{1,3} ", source, re.M):
            printed = []  # a new section: its takeaways speak of its own outputs
    return problems


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_number_a_takeaway_quotes_is_in_the_output_above_it(chapter):
    cells = json.loads(chapter.read_text(encoding="utf-8"))["cells"]
    problems = unsupported_numbers(cells)
    assert not problems, f"{chapter.name}: takeaways quote numbers their outputs do not show:\n  " + "\n  ".join(problems)


def _cell(kind: str, source: str, printed: str = "") -> dict:
    cell = {"cell_type": kind, "source": [source]}
    if kind == "code":
        cell["outputs"] = [{"output_type": "stream", "text": [printed]}]
    return cell


def test_the_reader_of_takeaways():
    section = [_cell("markdown", "## 1. A question"), _cell("code", "run()", "the sum is 10, bubble 51.2%")]
    good = section + [_cell("markdown", "**Takeaway:** every rank ends with 10; the bubble is 51% (chapter 04, P7).")]
    assert unsupported_numbers(good) == []
    wrong = section + [_cell("markdown", "**Takeaway:** every rank ends with 11.")]
    assert unsupported_numbers(wrong) == ["**Takeaway:** every rank ends with 11....: 11"]
    later = section + [_cell("markdown", "## 2. Next"), _cell("code", "other()", "nothing"),
                       _cell("markdown", "**Takeaway:** still 10.")]
    assert unsupported_numbers(later) == ["**Takeaway:** still 10....: 10"]
