"""Every notebook (chapters, exercises, solutions) executed with papermill, and committed executed.

CI runs each with its ``parameters`` cell (small sizes); a notebook may also
carry ``metadata.coursekit.ci_parameters`` to shrink it further for CI.
The tests are four files (``test_notebooks.py`` chapters 00-05, ``test_notebooks_later.py`` 06-10,
``test_notebooks_exercises.py``, ``test_notebooks_solutions.py``), so that
``make test``'s workers (``--dist loadfile``: a file stays on one worker) run
them side by side; in one file the nineteen runs queued on one worker.
Check a single notebook with:  .venv/bin/python -m pytest tests/test_notebooks.py -k 01_gradient
"""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("notebooks", "exercises", "solutions")
NOTEBOOKS = [p for folder in FOLDERS for p in sorted((ROOT / folder).glob("*.ipynb"))]


def notebooks(folder: str) -> list[Path]:
    return [p for p in NOTEBOOKS if p.parent.name == folder]


def notebook_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"
GRADING_CELL = re.compile(r"^\s*(report = )?(grading\.grade|(grading\.)?check_\w+)\(", re.M)


def score_tables(notebook: dict) -> list[str]:
    """The printed output of each grading cell (``grading.grade(...)``, ``check_<exercise>(...)``): its score table.

    Grading is deterministic (the same attempt, the same score and feedback), so a run must print what the
    committed notebook shows: a change that lowers the solution's score, or rewords the exercise's "not done",
    fails here even though papermill ran the notebook without an error.
    """
    tables = []
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code" and GRADING_CELL.search("".join(cell["source"])):
            tables.append("".join("".join(o.get("text", "")) for o in cell.get("outputs", [])
                                  if o.get("output_type") == "stream" and o.get("name") == "stdout"))
    return tables


def executes(path: Path, tmp_path: Path) -> None:
    """Papermill runs ``path`` at CI parameters without an error; an exercise's or solution's score tables are
    the committed ones."""
    from coursekit.run_notebook import execute_notebook

    notebook = json.loads(path.read_text())
    tags = [cell.get("metadata", {}).get("tags", []) for cell in notebook["cells"]]
    assert any("parameters" in t for t in tags), f"{path.name} needs a cell tagged 'parameters'"
    parameters = notebook.get("metadata", {}).get("coursekit", {}).get("ci_parameters", {})
    execute_notebook(path, tmp_path / path.name, parameters=parameters, kernel_name="python3",
                     cwd=str(path.parent), execution_timeout=300, progress_bar=False,
                     start_timeout=300)  # a kernel on a machine loaded ~10 on 2 cores took over the default 60 s
    executed = json.loads((tmp_path / path.name).read_text())
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    if path.parent.name in ("exercises", "solutions"):
        committed, now = score_tables(notebook), score_tables(executed)
        assert committed and all(committed), f"{path.name}: no grading cell with a score table found"
        for before, after in zip(committed, now, strict=True):
            assert after == before, (f"{path.name}: a grading cell printed\n{after}\nbut the committed notebook "
                                     f"shows\n{before}\n(re-execute it with tools/execute_notebooks.py if the "
                                     f"change is meant)")


def is_committed_executed(path: Path) -> None:
    notebook = json.loads(path.read_text())
    code = [c for c in notebook["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    assert any(c.get("outputs") for c in code), f"{path.name} is committed without outputs: run tools/execute_notebooks.py"
    if path.parent.name == "notebooks":
        images = [o for c in code for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
        assert images, f"{path.name} has no figure in its outputs (is `%matplotlib inline` missing?)"
    if path.parent.name != "exercises":
        errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{path.name} has a stored error output"
