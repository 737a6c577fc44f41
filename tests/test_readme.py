"""README is the course's landing page: every command, target, module, path and figure it names is real.

Read as a learner would use it (the reading itself: tests/readme_support.py):

* a fenced ``bash`` block right after a ``<!-- runnable -->`` line is run, as written, from the repository
  root (``.venv/bin/`` is the environment these tests run in: a fresh clone's ``make test`` made it there);
* every other command is checked without running it: ``make X`` is a Makefile target, ``python -m M`` a
  module (``coursekit.bench NAME`` a benchmark, ``coursekit CMD`` a subcommand), ``python tools/x.py`` a file,
  ``.venv/bin/X`` a program the environment has;
* every repository path in backticks or in a link exists (a glob matches something), every exercise named
  is in exercises/, every ``coursekit.x.y`` resolves, and every link to a heading (``file.md#anchor``) finds it;
* the figures README shows are the committed notebooks' own (``tools/export_figures.py --check``; the
  script itself is tested in tests/test_export_figures.py).

The chapter table and the benchmark summary: tests/test_readme_chapters.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
from readme_support import (DOCS, FILES, NOT_FILES, README, ROOT, TOP, anchor, code_spans, commands, exists,
                            fenced_blocks, text)

sys.path.insert(0, str(ROOT / "tools"))
import export_figures  # noqa: E402


# ------------------------------------------------------------------------------------------------ commands
@lru_cache(maxsize=1)
def makefile_targets() -> frozenset[str]:
    return frozenset(m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*):", text(ROOT / "Makefile"), re.M))


@lru_cache(maxsize=1)
def coursekit_subcommands() -> frozenset[str]:
    done = subprocess.run([sys.executable, "-m", "coursekit", "--help"], capture_output=True, text=True, cwd=ROOT)
    return frozenset(re.search(r"\{([\w,]+)\}", done.stdout).group(1).split(","))


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
        elif len(words) > 1 and not exists(words[1]):
            problems.append(f"`{command}`: {words[1]} does not exist")
    elif program == "coursekit" and len(words) > 1 and words[1] not in coursekit_subcommands():
        problems.append(f"`coursekit {words[1]}`: no such subcommand")
    return problems + [f"`{command}`: {word} does not exist" for word in words[1:]
                       if word.startswith(TOP) and word not in NOT_FILES and not exists(word)]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_command_names_real_targets_modules_and_files(page):
    found = commands(text(page))
    assert any(c.startswith("make lab") for c in found) or page != README, "README shows no `make lab`"
    problems = [p for command in found for p in problems_with(command)]
    assert not problems, f"{page.name}:\n" + "\n".join(problems)


def test_the_runnable_blocks_run():
    blocks = [(language, body) for page in DOCS for language, body, runnable in fenced_blocks(text(page)) if runnable]
    assert any(runnable for _, _, runnable in fenced_blocks(text(README))), "README marks no block <!-- runnable -->"
    venv = Path(sys.executable).parent
    env = dict(os.environ, MPLBACKEND="agg", PATH=f"{venv}{os.pathsep}{os.environ.get('PATH', '')}")
    for language, body in blocks:
        assert language == "bash", f"a block marked runnable must be bash, not {language!r}: {body!r}"
        assert all(l.startswith(".venv/bin/") for l in body.splitlines() if l.strip()), \
            f"a runnable block runs only the course's own tools, from .venv/bin/: {body!r}"
        script = body.replace(".venv/bin/", f"{venv}/")
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"the block\n{body}exited {done.returncode}:\n{done.stdout}\n{done.stderr}"


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
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def test_every_exercise_named_exists():
    names = {span for span in code_spans(text(README)) if re.fullmatch(r"\d\d_[a-z_]+", span)}
    assert len(names) >= 8, f"README names only these exercises: {sorted(names)}"
    missing = sorted(n for n in names if not exists(f"exercises/{n}.ipynb"))
    assert not missing, f"README names exercises that exercises/ lacks: {missing}"


def resolves(dotted: str) -> bool:
    """``coursekit.bench.allreduce.paired_ratio`` names a module, or an attribute of one."""
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
    assert anchor("The cost model and the planner (chapter 08)") == "the-cost-model-and-the-planner-chapter-08"
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


# --------------------------------------------------------------------------------------------------- length
def test_readme_is_a_landing_page_of_at_most_1200_words_of_prose():
    """Tables and code are not counted (tools/prose_stats.py says what is); the rest belongs in the pages README
    sends a reader on to (docs/architecture.md, CONTRIBUTING.md, docs/scaling.md, docs/troubleshooting.md)."""
    import prose_stats

    stats = prose_stats.measure(text(README))
    assert stats.main_words + stats.note_words <= 1200, (
        f"README has {stats.main_words + stats.note_words:,} words of prose (at most 1,200): move detail to docs/")
