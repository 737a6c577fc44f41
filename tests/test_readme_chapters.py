"""README's chapter table is true of the notebooks, and docs/benchmarks.md's summary of its own sections.

* each chapter's row: its notebook exists, the seed claims it lists are ones the notebook names, every
  PyTorch name in its "ends with" column is in the notebook, its exercise exists, and its time follows the
  rule README's footnote ¹ states: reading plus the measured run time (the failure says the value to write);
* each row of the benchmark summary at the top of docs/benchmarks.md (README's table until issue 56) quotes
  only numbers (with their units) that its section below holds.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from readme_support import README, ROOT, anchor, text

WORDS_A_MINUTE = 150        # README's footnote ¹ states this rule; keep the two together
ROUND_TO_MINUTES = 5


# ----------------------------------------------------------------------------------------- the chapter table
def chapter_rows() -> list[list[str]]:
    """The cells of each row of README's chapter table (the one whose header starts ``| # | chapter``)."""
    section = text(README).split("## The chapters", 1)[1]
    table = [line for line in section.strip().split("\n\n", 1)[0].splitlines() if line.startswith("|")]
    assert table and table[0].startswith("| # | chapter"), "README's chapter table not found under '## The chapters'"
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table[2:]]


def notebook_text(path: Path) -> str:
    return "\n".join("".join(cell["source"]) for cell in json.loads(text(path))["cells"])


def run_seconds(notebook: Path) -> float:
    """How long the committed notebook's cells ran at its default parameters: papermill's measured duration."""
    duration = json.loads(text(notebook))["metadata"].get("papermill", {}).get("duration")
    assert duration is not None, f"{notebook.name} holds no measured run time: execute it with tools/execute_notebooks.py"
    return float(duration)


def minutes_to_work_through(chapter: Path, exercise: Path | None) -> int:
    """Footnote ¹'s rule: the words of the chapter and its exercise at WORDS_A_MINUTE, plus the time the chapter's
    cells ran when it was last executed, rounded up to 5 minutes."""
    words = sum(len(notebook_text(p).split()) for p in (chapter, exercise) if p is not None)
    minutes = words / WORDS_A_MINUTE + run_seconds(chapter) / 60
    return math.ceil(minutes / ROUND_TO_MINUTES) * ROUND_TO_MINUTES


def claims(cell: str) -> set[str]:
    """'R1–R7, P4' -> {'R1', ..., 'R7', 'P4'}."""
    found = set()
    for first, last in re.findall(r"\b([PR]\d+)(?:–[PR]?(\d+))?", cell):
        end = int(last) if last else int(first[1:])
        found |= {f"{first[0]}{n}" for n in range(int(first[1:]), end + 1)}
    return found


def test_the_chapter_table_lists_chapters_00_to_10():
    rows = chapter_rows()
    assert [row[0] for row in rows] == [f"{n:02d}" for n in range(11)]
    assert all(len(row) == 6 for row in rows), [row for row in rows if len(row) != 6]
    row = {row[0]: row for row in rows}
    assert "notebooks/09_debugging.ipynb" in row["09"][1] and row["09"][5] == "`09_find_the_bug`"
    assert "notebooks/10_capstone.ipynb" in row["10"][1]


def test_the_footnote_states_the_rule_the_times_follow():
    rule = (f"their words (text and code) at {WORDS_A_MINUTE} a minute, plus the time the chapter's cells ran at "
            f"their default parameters when it was last executed (on a 2-core laptop), rounded up to "
            f"{ROUND_TO_MINUTES} minutes")
    assert rule in " ".join(text(README).split()), f"README's footnote ¹ must say: {rule}"


@pytest.mark.parametrize("row", chapter_rows(), ids=lambda row: row[0])
def test_each_chapter_row_is_true_of_its_notebook(row):
    number, chapter, time, seed_claims, pytorch, exercise = row
    path = ROOT / re.search(r"\((notebooks/\d\d_\w+\.ipynb)\)", chapter).group(1)
    assert path.exists(), f"{path.name} does not exist"
    source = notebook_text(path)
    discussed = set(re.findall(r"\b[PR]\d+\b", source))
    assert claims(seed_claims) <= discussed, (f"chapter {number} claims {sorted(claims(seed_claims) - discussed)} "
                                              f"that {path.name} never names")
    names = {name for span in re.findall(r"`([^`]+)`", pytorch) for name in re.findall(r"[A-Za-z_]\w*", span)}
    assert (names and all(name in source for name in names)) or pytorch.startswith("none"), \
        f"chapter {number}'s PyTorch column names {sorted(n for n in names if n not in source)}, absent from {path.name}"
    exercise_path = ROOT / "exercises" / f"{exercise.strip('`')}.ipynb" if exercise != "—" else None
    assert exercise_path is None or exercise_path.exists(), f"{exercise_path.name} does not exist"
    minutes = minutes_to_work_through(path, exercise_path)
    assert time == f"{minutes} min", (f"chapter {number}: README says {time!r}; footnote ¹'s rule gives "
                                      f"'{minutes} min': write that in its row")


def test_the_claims_reader():
    assert claims("R1–R7") == {f"R{n}" for n in range(1, 8)}
    assert claims("R8, P1, P2, P6") == {"R8", "P1", "P2", "P6"}
    assert claims("—") == set()


# ---------------------------------------------------------------------------------------------- benchmarks
BENCHMARKS = ROOT / "docs" / "benchmarks.md"


def benchmark_sections() -> dict[str, str]:
    """docs/benchmarks.md's ``## `` sections, by their GitHub anchor."""
    parts = re.split(r"^## (.+)$", text(BENCHMARKS), flags=re.M)
    return {anchor(heading): body for heading, body in zip(parts[1::2], parts[2::2])}


NUMBER = re.compile(r"(?<![\w.])(\d[\d,.]*\d|\d)( ?(?:×|%|ms|µs|s|MiB|KiB|GB/s))?(?!\w)")


def quoted(cells: str) -> set[str]:
    """'GPipe 0.99×, p = 2' -> {'0.99×', '2'}: each number with its unit."""
    return {number + (unit or "") for number, unit in NUMBER.findall(cells)}


def holds(section: str, quote: str) -> bool:
    """A number quoted with its unit is in ``section`` with that unit; one without (0.03–0.11), with any."""
    there = quoted(section)
    return quote in there or (quote[-1].isdigit() and quote in {NUMBER.match(q).group(1) for q in there})


def test_the_benchmark_summary_quotes_only_numbers_its_section_holds():
    summary = re.split(r"^## ", text(BENCHMARKS), maxsplit=1, flags=re.M)[0]   # the page's top, above its sections
    rows = [line for line in summary.splitlines() if line.startswith("| [")]
    sections = benchmark_sections()
    assert len(rows) == len(sections) == 10, f"{len(rows)} summary rows for {len(sections)} benchmark sections"
    for row in rows:
        target = re.search(r"\]\(#([\w-]+)\)", row).group(1)
        cells = re.sub(r"\[[^\]]*\]\([^)]*\)", "", row)            # the link is not a number
        section = sections[target]
        absent = sorted(q for q in quoted(cells) if not holds(section, q))
        assert not absent, f"docs/benchmarks.md's summary of {target} quotes what its section lacks: {absent}"


def test_numbers_are_read_with_their_units():
    assert quoted("GPipe 0.99×, 1F1B 0.75× (p = 2), 72,855 layouts, 1.3 s, 74% hidden, ≤ 10 ms") == {
        "0.99×", "0.75×", "2", "72,855", "1.3 s", "74%", "10 ms"}
    assert holds("(median 1.06)", "1.06") and holds("GPipe 1.51×", "1.51") and not holds("median 1.06", "1.06×")
