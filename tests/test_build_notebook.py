"""Notebook sources (tools/notebook_src) and the committed notebooks stay in sync."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from build_notebook import parse, select  # noqa: E402

SOURCES = sorted((ROOT / "tools" / "notebook_src").glob("*.py"))


def _cells(notebook) -> list:
    return [(c["cell_type"], "".join(c["source"]), c["metadata"].get("tags") or []) for c in notebook["cells"]
            if "injected-parameters" not in (c["metadata"].get("tags") or [])]


def _targets(source: Path) -> list[tuple[Path, bool]]:
    name = source.stem
    found = [(ROOT / folder / f"{name}.ipynb", folder == "exercises") for folder in ("notebooks", "exercises", "solutions")]
    return [(path, exercise) for path, exercise in found if path.exists()]


def test_select_keeps_one_side_of_each_block():
    source = "a\n# BEGIN SOLUTION\nanswer = 42\n# EXERCISE: answer = ...\n# END SOLUTION\nb"
    assert select(source, exercise=False) == "a\nanswer = 42\nb"
    assert select(source, exercise=True) == "a\nanswer = ...\nb"
    with pytest.raises(ValueError, match="never closed"):
        select("# BEGIN SOLUTION\nx", exercise=False)


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_committed_notebooks_match_their_source(source):
    targets = _targets(source)
    assert targets, f"{source.name} builds no committed notebook"
    for path, exercise in targets:
        built = parse(select(source.read_text(), exercise))
        assert _cells(built) == _cells(json.loads(path.read_text())), (
            f"{path.relative_to(ROOT)} differs from {source.relative_to(ROOT)}: rebuild it with "
            f"tools/build_notebook.py{' --exercise' if exercise else ''}")
