"""README is the course's landing page: every command, target, module, path and figure it names is real.

Read as a learner would use it:

* a fenced ``bash`` block right after a ``<!-- runnable -->`` line is run, as written, from the repository
  root (``.venv/bin/`` is the environment these tests run in: a fresh clone's ``make test`` made it there);
* every other command is checked without running it: ``make X`` is a Makefile target, ``python -m M`` a
  module (``coursekit.bench NAME`` a benchmark, ``coursekit CMD`` a subcommand), ``python tools/x.py`` a file;
* every repository path in backticks or in a link exists (a glob matches something), and every link to a
  heading (``file.md#anchor``) finds it;
* the figures README shows are the committed notebooks' own (``tools/export_figures.py --check``);
* the chapter table: each chapter's seed claims are ones its notebook discusses, each PyTorch name in its
  "ends with" column is in its notebook, and its time follows the rule its footnote states;
* the benchmark summary quotes only numbers that docs/benchmarks.md holds.

Paths still being written on other branches can be allowed to be missing, and only those:
``COURSEKIT_README_PENDING="notebooks/08_debugging.ipynb docs/glossary.md"``. Unset, nothing may be missing.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, ROOT / "docs" / "benchmarks.md"]   # the pages this file vouches for (not docs/glossary.md)
PENDING = set(os.environ.get("COURSEKIT_README_PENDING", "").split())
TOP = ("coursekit/", "tests/", "tools/", "notebooks/", "exercises/", "solutions/", "docs/", ".ci/")
FILES = ("Makefile", "pyproject.toml", "environment.yml", "README.md")
# Paths README names that are not files of the repository, each for a reason.
NOT_FILES = {
    "tools/notebook_src/NAME.py": "a placeholder for a chapter's name",
    "notebooks/NAME.ipynb": "a placeholder for a chapter's name",
    "tests/submissions/<exercise>/": "a placeholder for an exercise's folder",
}
WORDS_A_MINUTE = 150        # README's footnote ¹ states this rule; keep the two together
ROUND_TO_MINUTES = 5

sys.path.insert(0, str(ROOT / "tools"))
import export_figures  # noqa: E402


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def fenced_blocks(markdown: str) -> list[tuple[str, str, bool]]:
    """``(language, body, runnable)`` of every fenced block; runnable: the last non-blank line before it
    is ``<!-- runnable -->``."""
    blocks = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", markdown, re.M | re.S):
        before = [line for line in markdown[:match.start()].splitlines() if line.strip()]
        blocks.append((match.group(1), match.group(2), bool(before) and before[-1].strip() == "<!-- runnable -->"))
    return blocks


def code_spans(markdown: str) -> list[str]:
    """Inline ``code`` spans outside fenced blocks."""
    outside = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    return re.findall(r"`([^`\n]+)`", outside)


def commands(markdown: str) -> list[str]:
    """Every command line: the lines of bash blocks, and inline spans that start like one."""
    lines = [line for language, body, _ in fenced_blocks(markdown) if language == "bash"
             for line in body.splitlines()]
    lines += [span for span in code_spans(markdown) if re.match(r"(\S+=\S+ )*(make|\.venv/bin/|python|coursekit)\b", span)]
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def exists(relative: str) -> bool:
    if relative in PENDING:
        return True
    if any(c in relative for c in "*?["):
        return any(ROOT.glob(relative))
    return (ROOT / relative).exists()


def pending_note() -> str:
    return f" (allowed missing: {sorted(PENDING)})" if PENDING else " (COURSEKIT_README_PENDING can allow it)"


# ------------------------------------------------------------------------------------------------ commands
def makefile_targets() -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*):", text(ROOT / "Makefile"), re.M)}


def coursekit_subcommands() -> set[str]:
    done = subprocess.run([sys.executable, "-m", "coursekit", "--help"], capture_output=True, text=True, cwd=ROOT)
    return set(re.search(r"\{([\w,]+)\}", done.stdout).group(1).split(","))


def problems_with(command: str) -> list[str]:
    """What is not real in one command line (empty: all of it is)."""
    from coursekit.bench.__main__ import available

    try:
        words = shlex.split(command)
    except ValueError:                                       # an unbalanced quote: read it word by word
        words = command.split()
    while words and re.match(r"^[A-Z_]+=", words[0]):      # PIP_EXTRA_INDEX_URL=... make lab
        words.pop(0)
    if not words:
        return []
    problems = []
    program = words[0].removeprefix(".venv/bin/")
    if words[0].startswith(".venv/bin/") and not (Path(sys.executable).parent / program).exists():
        problems.append(f"`{command}`: the environment has no {program}")
    if program == "make":
        targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        problems += [f"`make {t}`: no such Makefile target" for t in targets if t not in makefile_targets()]
    elif program.startswith("python"):
        if words[1:2] == ["-m"]:
            module, rest = words[2], words[3:]
            if importlib.util.find_spec(module) is None:
                problems.append(f"`python -m {module}`: no such module")
            elif module == "coursekit.bench" and rest and rest[0] not in available() and not rest[0].isupper():
                problems.append(f"`python -m coursekit.bench {rest[0]}`: no such benchmark ({available()})")
            elif module == "coursekit" and rest and rest[0] not in coursekit_subcommands():
                problems.append(f"`python -m coursekit {rest[0]}`: no such subcommand")
            problems += [f"`{command}`: {w} does not exist" for w in rest if w.startswith(TOP) and not exists(w)]
        elif len(words) > 1 and not exists(words[1]):
            problems.append(f"`{command}`: {words[1]} does not exist")
    elif program == "coursekit":
        if words[1] not in coursekit_subcommands():
            problems.append(f"`coursekit {words[1]}`: no such subcommand")
        problems += [f"`{command}`: {w} does not exist" for w in words[2:] if w.startswith(TOP) and not exists(w)]
    return problems


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_command_names_real_targets_modules_and_files(page):
    found = commands(text(page))
    assert any(c.startswith("make lab") for c in found) or page != README, "README shows no `make lab`"
    problems = [p for command in found for p in problems_with(command)]
    assert not problems, f"{page.name}:\n" + "\n".join(problems) + pending_note()


def test_the_runnable_blocks_run():
    blocks = [(language, body) for language, body, runnable in fenced_blocks(text(README)) if runnable]
    assert blocks, "README marks no block <!-- runnable -->"
    venv = Path(sys.executable).parent
    env = dict(os.environ, MPLBACKEND="agg", PATH=f"{venv}{os.pathsep}{os.environ.get('PATH', '')}")
    for language, body in blocks:
        assert language == "bash", f"a block marked runnable must be bash, not {language!r}: {body!r}"
        assert all(l.startswith(".venv/bin/") for l in body.splitlines() if l.strip()), \
            f"a runnable block runs only the course's own tools, from .venv/bin/: {body!r}"
        script = body.replace(".venv/bin/", f"{venv}/")
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"README's block\n{body}exited {done.returncode}:\n{done.stdout}\n{done.stderr}"


# --------------------------------------------------------------------------------------------------- paths
def named_paths(markdown: str) -> set[str]:
    """Repository paths in code spans (first word) and link targets, without anchors."""
    spans = {span.split()[0] for span in code_spans(markdown) if span.split()}
    links = {target.split("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", markdown)
             if not target.startswith(("http://", "https://", "#"))}
    return {p for p in spans | links if p and (p.startswith(TOP) or p in FILES)}


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_path_named_exists(page):
    missing = sorted(p for p in named_paths(text(page)) - set(NOT_FILES) if not exists(p.rstrip(":,.")))
    assert not missing, f"{page.name} names paths that do not exist: {missing}" + pending_note()


def test_every_exercise_named_exists():
    names = {span for span in code_spans(text(README)) if re.fullmatch(r"\d\d_[a-z_]+", span)}
    assert len(names) >= 8, f"README names only these exercises: {sorted(names)}"
    missing = sorted(n for n in names if not exists(f"exercises/{n}.ipynb"))
    assert not missing, f"README names exercises that exercises/ lacks: {missing}" + pending_note()


def resolves(dotted: str) -> bool:
    """``coursekit.bench.allreduce.paired_ratio`` names a module, or an attribute of one."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_dotted_coursekit_name_resolves(page):
    names = {span for span in code_spans(text(page)) if re.fullmatch(r"coursekit(\.\w+)+", span)}
    assert names, f"{page.name} names no coursekit.module"
    assert not sorted(n for n in names if not resolves(n)), \
        f"{page.name} names what the package does not have: {sorted(n for n in names if not resolves(n))}"


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_link_to_a_heading_finds_it(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+#[^)\s]+)\)", text(page)):
        file, _, fragment = target.partition("#")
        linked = (page.parent / file) if file else page
        headings = {anchor(h) for h in re.findall(r"^#+ (.+)$", text(linked), re.M)}
        if fragment not in headings:
            broken.append(f"{target} (headings there: {sorted(headings)})")
    assert not broken, f"{page.name}: links to headings that do not exist: {broken}"


def test_the_anchor_rule_matches_githubs():
    assert anchor("All-reduce (chapter 01)") == "all-reduce-chapter-01"
    assert anchor("The cost model and the planner (chapter 07)") == "the-cost-model-and-the-planner-chapter-07"
    assert anchor("What `make test` runs") == "what-make-test-runs"


# ------------------------------------------------------------------------------------------------- figures
def test_every_figure_shown_is_committed_and_exported():
    shown = re.findall(r"!\[[^\]]*\]\((docs/figures/[^)\s]+\.png)\)", text(README))
    assert len(shown) == len(set(shown)) == 3, f"README should show three figures once each, shows {shown}"
    missing = [p for p in shown if not (ROOT / p).is_file()]
    assert not missing, f"README shows figures that are not committed: {missing} (python tools/export_figures.py)"
    exported = {f"docs/figures/{f.name}" for f in export_figures.FIGURES}
    assert set(shown) == exported, f"shown but not exported: {set(shown) - exported}; " \
                                   f"exported but not shown: {exported - set(shown)}"


def test_the_committed_figures_are_the_notebooks_figures():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "export_figures.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_names_an_edited_a_missing_and_an_unknown_png(tmp_path):
    figures = tmp_path / "figures"
    export_figures.export(ROOT, figures)
    assert export_figures.differences(ROOT, figures) == []
    first, second = export_figures.FIGURES[:2]
    (figures / first.name).write_bytes((figures / first.name).read_bytes() + b"\0")
    (figures / second.name).unlink()
    (figures / "old.png").write_bytes(b"")
    assert export_figures.differences(ROOT, figures) == [
        f"{figures / first.name}: differs from the figure its notebook holds now",
        f"{figures / second.name}: missing",
        f"{figures / 'old.png'}: no notebook figure exports it (not in FIGURES)"]


def notebook_with(*cells: tuple[str, int]) -> dict:
    """A parsed notebook of code cells, each ``(source, number of PNG outputs)``; PNG i holds the byte i."""
    return {"cells": [{"cell_type": "code", "source": source,
                       "outputs": [{"output_type": "display_data",
                                    "data": {"image/png": base64.b64encode(bytes([i])).decode()}}
                                   for i in range(images)]} for source, images in cells]}


def test_a_figure_is_found_by_its_marker_line_and_image_number():
    figure = export_figures.Figure("x.png", "notebooks/x.ipynb", "draw(4)", image=1)
    assert export_figures.find_figure(notebook_with(("a = 1\ndraw(4)", 2), ("draw(40)", 3)), figure) == b"\x01"
    with pytest.raises(export_figures.FigureNotFound, match="in 0 code cells"):
        export_figures.find_figure(notebook_with(("draw(40)", 2)), figure)
    with pytest.raises(export_figures.FigureNotFound, match="in 2 code cells"):
        export_figures.find_figure(notebook_with(("draw(4)", 2), ("  draw(4)", 2)), figure)
    with pytest.raises(export_figures.FigureNotFound, match="holds 1 image"):
        export_figures.find_figure(notebook_with(("draw(4)", 1)), figure)


def test_a_figure_not_found_exits_2_and_says_which(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(export_figures, "FIGURES", (export_figures.Figure("x.png", "notebooks/00_welcome.ipynb",
                                                                          "no_such_call()"),))
    assert export_figures.main(["--check"]) == 2
    assert "notebooks/00_welcome.ipynb: marker 'no_such_call()' is in 0 code cells" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------- the chapter table
def chapter_rows() -> list[list[str]]:
    """The cells of each row of README's chapter table (the one whose header starts ``| # | chapter``)."""
    section = text(README).split("## The chapters", 1)[1]
    table = [line for line in section.strip().split("\n\n", 1)[0].splitlines() if line.startswith("|")]
    assert table and table[0].startswith("| # | chapter"), "README's chapter table not found under '## The chapters'"
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table[2:]]


def notebook_text(path: Path) -> str:
    return "\n".join("".join(cell["source"]) for cell in json.loads(text(path))["cells"])


def minutes_to_work_through(chapter: Path, exercise: Path | None) -> int:
    """Footnote ¹'s rule: the words of the chapter and its exercise at WORDS_A_MINUTE, rounded up to 5 minutes."""
    words = sum(len(notebook_text(p).split()) for p in (chapter, exercise) if p is not None)
    return math.ceil(words / WORDS_A_MINUTE / ROUND_TO_MINUTES) * ROUND_TO_MINUTES


def claims(cell: str) -> set[str]:
    """'R1–R7, P4' -> {'R1', ..., 'R7', 'P4'}."""
    found = set()
    for first, last in re.findall(r"\b([PR]\d+)(?:–[PR]?(\d+))?", cell):
        end = int(last) if last else int(first[1:])
        found |= {f"{first[0]}{n}" for n in range(int(first[1:]), end + 1)}
    return found


def test_the_chapter_table_lists_chapters_00_to_08():
    rows = chapter_rows()
    assert [row[0] for row in rows] == [f"{n:02d}" for n in range(9)]
    assert all(len(row) == 6 for row in rows), [row for row in rows if len(row) != 6]
    assert "notebooks/08_debugging.ipynb" in rows[8][1] and rows[8][5] == "`08_find_the_bug`"


def test_the_footnote_states_the_rule_the_times_follow():
    rule = f"their words (text and code) at {WORDS_A_MINUTE} a minute, rounded up to {ROUND_TO_MINUTES} minutes"
    assert rule in " ".join(text(README).split()), f"README's footnote ¹ must say: {rule}"


@pytest.mark.parametrize("row", chapter_rows(), ids=lambda row: row[0])
def test_each_chapter_row_is_true_of_its_notebook(row):
    number, chapter, time, seed_claims, pytorch, exercise = row
    path = ROOT / re.search(r"\((notebooks/\d\d_\w+\.ipynb)\)", chapter).group(1)
    if not path.exists():
        assert str(path.relative_to(ROOT)) in PENDING, f"{path.name} does not exist" + pending_note()
        return
    source = notebook_text(path)
    discussed = set(re.findall(r"\b[PR]\d+\b", source))
    assert claims(seed_claims) <= discussed, (f"chapter {number} claims {sorted(claims(seed_claims) - discussed)} "
                                              f"that {path.name} never names")
    names = {name for span in re.findall(r"`([^`]+)`", pytorch) for name in re.findall(r"[A-Za-z_]\w*", span)}
    assert (names and all(name in source for name in names)) or pytorch.startswith("none"), \
        f"chapter {number}'s PyTorch column names {sorted(n for n in names if n not in source)}, absent from {path.name}"
    exercise_path = ROOT / "exercises" / f"{exercise.strip('`')}.ipynb" if exercise != "—" else None
    if exercise_path is not None and not exercise_path.exists():
        assert str(exercise_path.relative_to(ROOT)) in PENDING, f"{exercise_path.name} does not exist" + pending_note()
        exercise_path = None
    minutes = minutes_to_work_through(path, exercise_path)
    assert time == f"{minutes} min", (f"chapter {number}: README says {time!r}; footnote ¹'s rule gives "
                                      f"'{minutes} min': write that in its row")


def test_the_claims_reader():
    assert claims("R1–R7") == {f"R{n}" for n in range(1, 8)}
    assert claims("R8, P1, P2, P6") == {"R8", "P1", "P2", "P6"}
    assert claims("—") == set()


# ---------------------------------------------------------------------------------------------- benchmarks
def test_the_benchmark_summary_quotes_only_numbers_docs_benchmarks_holds():
    summary = text(README).split("## Benchmarks", 1)[1]
    table = "\n".join(line for line in summary.splitlines() if line.startswith("|"))
    table = re.sub(r"\]\([^)]*\)", "]", table)      # link targets are not numbers
    full = text(ROOT / "docs" / "benchmarks.md")
    numbers = set(re.findall(r"\d[\d,.]*\d|\d", table))
    assert len(numbers) > 20, f"the summary quotes too few numbers to be a summary: {sorted(numbers)}"
    absent = sorted(n for n in numbers if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", full))
    assert not absent, f"README's benchmark summary quotes numbers docs/benchmarks.md does not hold: {absent}"
