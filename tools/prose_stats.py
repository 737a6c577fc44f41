"""How long a page reads: words of prose, long sentences and parentheses, in README or a chapter notebook.

    python tools/prose_stats.py README.md notebooks/*.ipynb

Prose is what a reader reads as text: fenced code, tables, images, headings and HTML comments are left out, and
a link counts by its text, not its address. In a notebook only the markdown cells count, split into the main
text and the collapsed notes (``<details>`` blocks, read only by whoever opens them). For each page it prints
the words of the main text, of the notes, the sentences over 40 words (and their share) and the parentheses
in the main text: the measures the course's style guide sets limits on (README: at most 1,200 words of prose;
a chapter: 2,500 words of main text, under 5% of sentences over 40 words, at most 40 parentheses, notes at
most half the main text).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

LONG_SENTENCE = 40  # words


@dataclass
class Stats:
    main_words: int
    note_words: int
    sentences: int
    long_sentences: int
    parentheses: int

    @property
    def long_share(self) -> float:
        return self.long_sentences / self.sentences if self.sentences else 0.0


def prose(markdown: str) -> str:
    """The text a reader reads: no code, tables, images, headings or comments; links as their text."""
    text = re.sub(r"^```.*?^```[^\n]*$", "", markdown, flags=re.M | re.S)  # fenced code
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    lines = [line for line in text.splitlines()
             if not line.lstrip().startswith(("|", "#", "![")) and not re.fullmatch(r"\s*</?(details|summary)>\s*", line)]
    text = "\n".join(lines)
    text = re.sub(r"</?summary>|</?details>", " ", text)
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", text)               # inline images
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)            # links: their text
    return text


def split_notes(markdown: str) -> tuple[str, str]:
    """``(main text, collapsed notes)``: the notes are the ``<details>`` blocks."""
    notes = re.findall(r"<details>.*?</details>", markdown, flags=re.S)
    return re.sub(r"<details>.*?</details>", "", markdown, flags=re.S), "\n".join(notes)


def sentences(text: str) -> list[str]:
    """Sentences of prose: split after ``.``, ``!``, ``?`` or ``:`` before a capital, and at blank lines and bullets."""
    blocks = re.split(r"\n\s*\n|\n\s*[*-] |\n\s*\d+\. ", text)
    out = []
    for block in blocks:
        out += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`*\"'(])", " ".join(block.split())) if s.strip()]
    return out


def words(text: str) -> int:
    """Words: tokens with a letter or a digit (a bullet's ``*`` or a lone dash is not one)."""
    return sum(1 for token in text.split() if re.search(r"\w", token))


def measure(markdown: str) -> Stats:
    main, notes = split_notes(markdown)
    main_prose = prose(main)
    said = sentences(main_prose)
    return Stats(words(main_prose), words(prose(notes)), len(said),
                 sum(1 for s in said if words(s) > LONG_SENTENCE), main_prose.count("("))


def markdown_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return path.read_text(encoding="utf-8")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path)
    options = parser.parse_args(argv)
    print("| page | main words | note words | sentences > 40 words | parentheses |\n|---|---|---|---|---|")
    for path in options.paths:
        s = measure(markdown_of(path))
        print(f"| {path.as_posix()} | {s.main_words:,} | {s.note_words:,} | {s.long_sentences} of {s.sentences} "
              f"({s.long_share:.0%}) | {s.parentheses} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
