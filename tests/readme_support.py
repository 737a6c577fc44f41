"""Reading README.md and docs/benchmarks.md as a learner does: fenced blocks, code spans, commands, paths, anchors.

Shared by tests/test_readme.py (what README names is real) and tests/test_readme_chapters.py (the chapter
table and the benchmark summary are true). Nothing README names may be missing.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# the pages this file vouches for (not docs/glossary.md): README, and the pages it sends a reader on to
DOCS = [README, ROOT / "CONTRIBUTING.md"] + [ROOT / "docs" / f"{name}.md" for name in
                                             ("architecture", "benchmarks", "scaling", "troubleshooting")]
TOP = ("coursekit/", "tests/", "tools/", "notebooks/", "exercises/", "solutions/", "docs/", ".ci/")
FILES = ("Makefile", "pyproject.toml", "environment.yml", "README.md")
# Paths README names that are not files of the repository, each for a reason.
NOT_FILES = {
    "tools/notebook_src/NAME.py": "a placeholder for a chapter's name",
    "notebooks/NAME.ipynb": "a placeholder for a chapter's name",
    "tests/submissions/<exercise>/": "a placeholder for an exercise's folder",
}


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
    if any(c in relative for c in "*?["):
        return any(ROOT.glob(relative))
    return (ROOT / relative).exists()





def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
