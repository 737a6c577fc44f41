"""Build a course notebook from its percent-format source, then execute it in place.

    python tools/build_notebook.py tools/notebook_src/01_gradient_sync.py notebooks/01_gradient_sync.ipynb

The source is a plain Python file (easy to diff and review):

    # %% [markdown]
    # # A title
    # Some text.

    # %% tags=["parameters"]
    WORLD_SIZE = 4

    # %% tags=["nbval-check-output"]
    # %matplotlib inline
    print(answer)

Magics are written commented (``# %matplotlib inline``) and uncommented in the notebook.

A first line ``# ci_parameters: {"N": 1}`` stores smaller values for CI in the
notebook's metadata.

An exercise and its solution come from ONE source. Inside a block

    # BEGIN SOLUTION
    segments = tensor.tensor_split(G)          (the solution's lines)
    # EXERCISE:     raise NotImplementedError("write the reduce-scatter")
    # END SOLUTION

the solution keeps the plain lines and drops the ``# EXERCISE: `` ones;
``--exercise`` keeps only the ``# EXERCISE: `` lines, with that prefix removed. ``--no-execute`` only writes the notebook. Execution
goes to a temporary file first; the target is replaced only on success.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import nbformat

_CELL = re.compile(r"^# %%(?P<kind> \[markdown\])?(?:\s+tags=(?P<tags>\[.*\]))?\s*$")


def select(source: str, exercise: bool) -> str:
    """Keep the solution's or the exercise's side of every BEGIN/END SOLUTION block."""
    kept, inside = [], False
    for number, line in enumerate(source.splitlines(), 1):
        marker = line.strip()
        if marker == "# BEGIN SOLUTION":
            if inside:
                raise ValueError(f"line {number}: BEGIN SOLUTION inside another block")
            inside = True
        elif marker == "# END SOLUTION":
            if not inside:
                raise ValueError(f"line {number}: END SOLUTION without BEGIN SOLUTION")
            inside = False
        elif not inside:
            kept.append(line)
        elif line.startswith("# EXERCISE: "):
            if exercise:
                kept.append(line[len("# EXERCISE: "):])
        elif not exercise:
            kept.append(line)
    if inside:
        raise ValueError("a BEGIN SOLUTION block is never closed")
    return "\n".join(kept)


def parse(source: str) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    notebook.metadata["language_info"] = {"name": "python"}
    lines = source.splitlines()
    if lines and lines[0].startswith("# ci_parameters:"):
        notebook.metadata["coursekit"] = {"ci_parameters": json.loads(lines.pop(0).split(":", 1)[1])}
    cells: list[tuple[str, list[str], list[str]]] = []
    for line in lines:
        match = _CELL.match(line)
        if match:
            kind = "markdown" if match.group("kind") else "code"
            cells.append((kind, json.loads(match.group("tags")) if match.group("tags") else [], []))
        elif cells:
            cells[-1][2].append(line)
    for kind, tags, body in cells:
        while body and not body[-1].strip():
            body.pop()
        while body and not body[0].strip():
            body.pop(0)
        if kind == "markdown":
            text = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in body)
            cell = nbformat.v4.new_markdown_cell(text)
        else:
            # Magics are commented in the source (so it stays valid Python): "# %matplotlib inline".
            body = [l[2:] if re.match(r"^# %%?\w", l) else l for l in body]
            cell = nbformat.v4.new_code_cell("\n".join(body))
        if tags:
            cell.metadata["tags"] = tags
        notebook.cells.append(cell)
    return notebook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--no-execute", action="store_true")
    parser.add_argument("--exercise", action="store_true", help="build the exercise side of SOLUTION blocks")
    options = parser.parse_args(argv)
    notebook = parse(select(options.source.read_text(), options.exercise))
    if options.no_execute:
        nbformat.write(notebook, str(options.target))
        return 0
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    from execute_notebooks import execute

    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / options.target.name
        nbformat.write(notebook, str(staged))
        execute(staged, cwd=options.target.resolve().parent)
        options.target.write_text(staged.read_text())
    print(f"wrote {options.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
