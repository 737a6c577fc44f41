"""The glossary (docs/glossary.md) and the links to it stay whole.

Anchors follow GitHub's heading slugs: a term's heading ``### All-reduce`` is reached as
``docs/glossary.md#all-reduce``. Headings are kept to letters, digits, spaces and hyphens, for which
the slug is simply the lower-cased heading with spaces turned into hyphens (the test refuses any other
heading, so the rule below is GitHub's rule, not an approximation of it).
"""

import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "docs" / "glossary.md"
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NOTEBOOKS = CHAPTERS + sorted((ROOT / "exercises").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))

_HEADING = re.compile(r"^(#{2,3}) (.+?)\s*$")
_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")  # [text](target); text may hold [..]
_SEED_QUOTE = re.compile(r"«([^»]+)»")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading made only of letters, digits, spaces and hyphens."""
    return heading.lower().replace(" ", "-")


def glossary_entries() -> dict[str, str]:
    """Each term's anchor and the text of its entry (from its ``###`` heading to the next heading)."""
    entries, current = {}, None
    for line in GLOSSARY.read_text().splitlines():
        match = _HEADING.match(line)
        if match:
            current = slug(match.group(2)) if match.group(1) == "###" else None
            if current is not None:
                assert current not in entries, f"two glossary headings give the anchor #{current}"
                entries[current] = ""
        elif current is not None:
            entries[current] += line + "\n"
    return entries


def anchors() -> set[str]:
    """Every heading's anchor. GitHub gives a repeated heading the anchor ``x-1``: refuse repeats."""
    found = [slug(m.group(2)) for m in map(_HEADING.match, GLOSSARY.read_text().splitlines()) if m]
    repeated = sorted({a for a in found if found.count(a) > 1})
    assert not repeated, f"two glossary headings give the anchors {repeated}: GitHub would number the second"
    return set(found)


def markdown_of(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text())["cells"]
    return ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown"]


def glossary_links(path: Path, texts: list[str]) -> list[tuple[str, str]]:
    """(target as written, anchor or "") of every link in ``texts`` that leads to the glossary."""
    found = []
    for text in texts:
        for target in _LINK.findall(text):
            file, _, anchor = target.partition("#")
            if file.endswith("glossary.md"):
                assert (path.parent / file).resolve() == GLOSSARY, (
                    f"{path.relative_to(ROOT)}: {target} does not lead to docs/glossary.md")
                found.append((target, anchor))
    return found


def chapter_links(entry: str) -> list[Path]:
    return [(GLOSSARY.parent / target).resolve() for target in _LINK.findall(entry) if target.endswith(".ipynb")]


def test_every_heading_has_a_plain_anchor():
    anchors()
    for line in GLOSSARY.read_text().splitlines():
        match = _HEADING.match(line)
        if match:
            assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 -]*", match.group(2)), (
                f"glossary heading {match.group(2)!r}: keep headings to letters, digits, spaces and hyphens, "
                "so that its anchor is predictable")


def test_every_entry_has_both_languages_a_definition_and_a_chapter():
    entries = glossary_entries()
    assert len(entries) >= 60, f"the glossary has only {len(entries)} terms"
    for anchor, text in entries.items():
        fields, _, definition = text.strip().partition("\n\n")
        for label in ("**RU**", "**VI**", "**Taught in**"):
            assert label in fields, f"glossary #{anchor}: no {label} field"
        assert definition.strip(), f"glossary #{anchor}: no definition"
        assert chapter_links(fields), f"glossary #{anchor}: 'Taught in' links no chapter notebook"


def test_every_chapter_link_in_the_glossary_resolves_to_a_file():
    for anchor, text in glossary_entries().items():
        for path in chapter_links(text):
            assert path.exists(), (
                f"glossary #{anchor} links {path.relative_to(ROOT)}, which does not exist")


PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p != GLOSSARY)


@pytest.mark.parametrize("path", NOTEBOOKS + PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_glossary_link_resolves_to_an_anchor(path):
    texts = markdown_of(path) if path.suffix == ".ipynb" else [path.read_text()]
    known = anchors()
    for target, anchor in glossary_links(path, texts):
        assert not anchor or anchor in known, (
            f"{path.relative_to(ROOT)} links {target}, but the glossary has no heading with the anchor #{anchor}")


def test_every_entry_is_linked_from_a_chapter():
    linked = {anchor for chapter in CHAPTERS for _, anchor in glossary_links(chapter, markdown_of(chapter))}
    for anchor, text in glossary_entries().items():
        assert anchor in linked, f"glossary #{anchor} is linked from no chapter notebook (notebooks/NN_*.ipynb)"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_links_the_glossary(chapter):
    assert glossary_links(chapter, markdown_of(chapter)), f"{chapter.name} links no term to the glossary"


def test_seed_quotes_are_verbatim():
    """Every «…» in the glossary is a seed's own words. The seeds live beside the repository in the
    course's workspace (``../shared/seeds``) or where COURSEKIT_SEEDS points; not in a plain clone."""
    seeds = Path(os.environ.get("COURSEKIT_SEEDS", ROOT.parent / "shared" / "seeds"))
    texts = [p.read_text() for p in sorted(seeds.glob("*.txt"))]
    if not texts:
        pytest.skip(f"no seed texts in {seeds}")
    quotes = _SEED_QUOTE.findall(GLOSSARY.read_text())
    assert len(quotes) >= 20
    missing = [q for q in quotes if not any(q in text for text in texts)]
    assert not missing, f"quoted as seed terms but in no seed text: {missing}"
