"""Every notebook (chapters, exercises, solutions) executed with papermill, and committed executed.

CI runs each with its ``parameters`` cell (small sizes); a notebook may also
carry ``metadata.coursekit.ci_parameters`` to shrink it further for CI.
The same run checks the committed outputs: every cell tagged ``nbval-check-output`` must print what the
committed notebook shows, compared as nbval compares (its sanitizers, ``tests/nbval_sanitize.cfg``; figures and
widget ids left out), under another CPU kernel dispatch than ``make notebooks`` used (:data:`OTHER_DISPATCH`).
One run does both: a second run of every chapter by nbval cost make test ~150 s of two cores' time for outputs
this run prints anyway. So ``ci_parameters`` shrinks only what no checked cell prints.
The tests are four files (``test_notebooks.py`` chapters 00-05, ``test_notebooks_later.py`` 06-10,
``test_notebooks_exercises.py``, ``test_notebooks_solutions.py``), so that
``make test``'s workers (``--dist loadfile``: a file stays on one worker) run
them side by side; in one file the nineteen runs queued on one worker.
Check a single notebook with:  .venv/bin/python -m pytest tests/test_notebooks.py -k 01_gradient
"""

import json
import os
import platform
import re
from contextlib import contextmanager
from difflib import unified_diff
from pathlib import Path

from nbval.plugin import coalesce_streams, get_sanitize_patterns, transform_streams_for_comparison

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("notebooks", "exercises", "solutions")
# AVX2 for PyTorch's own kernels and for oneDNN's (../shared/pitfalls.md's "another CPU"; the root conftest.py's
# nbval kernels use the same): an output that depends on the CPU's kernels then fails on the machine that made it.
OTHER_DISPATCH = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
SANITIZE = get_sanitize_patterns((ROOT / "tests" / "nbval_sanitize.cfg").read_text())
# what nbval leaves out of a comparison (nbval.plugin.IPyNbFile.skip_compare, without --nbdime)
NOT_COMPARED = {"metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg"}
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


@contextmanager
def other_dispatch():
    """The kernels started inside run PyTorch's AVX2 kernels (x86 only: the names mean nothing to an ARM build); a
    dispatch set outside wins, as in the root conftest.py."""
    saved = dict(os.environ)
    if platform.machine().lower() in ("x86_64", "amd64"):
        os.environ.update({**OTHER_DISPATCH, **{k: v for k, v in saved.items() if k in OTHER_DISPATCH}})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _sanitized(value):
    text = "".join(value) if isinstance(value, list) else value
    if not isinstance(text, str):
        return value
    for pattern, replacement in SANITIZE:
        text = re.sub(pattern, replacement, text)
    return text


def compared(outputs: list[dict]) -> dict[str, list]:
    """A cell's outputs as nbval compares them: streams joined, each output's keys and MIME types apart from
    :data:`NOT_COMPARED`, every string sanitized."""
    import nbformat

    def joined(value):  # a notebook on disk keeps multi-line strings as lists of lines
        return "".join(value) if isinstance(value, list) else value

    flat: dict[str, list] = {}
    outputs = [{**o, **({"text": joined(o["text"])} if "text" in o else {}),
                **({"data": {k: joined(v) for k, v in o["data"].items()}} if "data" in o else {})} for o in outputs]
    nodes = transform_streams_for_comparison(coalesce_streams([nbformat.from_dict(o) for o in outputs]))
    for output in nodes:
        for key, value in output.items():
            if key == "data":
                for mime, data in value.items():
                    if mime not in NOT_COMPARED:
                        flat.setdefault(mime, []).append(_sanitized(data))
            elif key not in NOT_COMPARED:
                flat.setdefault(key, []).append(_sanitized(value))
    return flat


def _as_text(flat: dict[str, list]) -> list[str]:
    return [line for key in sorted(flat) for value in flat[key] for line in f"[{key}]\n{value}".splitlines()]


def checked_cells_differ(committed: dict, executed: dict) -> list[str]:
    """Each cell tagged ``nbval-check-output`` whose outputs in ``executed`` (papermill's run, its injected
    parameters cell aside) differ from ``committed``'s: its index and a diff, committed first."""
    ran = [c for c in executed["cells"] if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    assert len(ran) == len(committed["cells"]), "papermill's run has other cells than the committed notebook"
    problems = []
    for index, (before, after) in enumerate(zip(committed["cells"], ran)):
        if "nbval-check-output" not in before.get("metadata", {}).get("tags", []):
            continue
        want, got = compared(before.get("outputs", [])), compared(after.get("outputs", []))
        if want != got:
            diff = unified_diff(_as_text(want), _as_text(got), "committed", "this run", lineterm="", n=1)
            problems.append(f"cell {index} (`{''.join(before['source']).splitlines()[0][:60]}`):\n  "
                            + "\n  ".join(list(diff)[2:14]))
    return problems


def executes(path: Path, tmp_path: Path) -> None:
    """Papermill runs ``path`` at CI parameters, under :data:`OTHER_DISPATCH`, without an error; the cells tagged
    ``nbval-check-output`` print the committed outputs, and so do an exercise's or solution's grading cells."""
    from coursekit.run_notebook import execute_notebook

    notebook = json.loads(path.read_text())
    tags = [cell.get("metadata", {}).get("tags", []) for cell in notebook["cells"]]
    assert any("parameters" in t for t in tags), f"{path.name} needs a cell tagged 'parameters'"
    parameters = notebook.get("metadata", {}).get("coursekit", {}).get("ci_parameters", {})
    with other_dispatch():
        execute_notebook(path, tmp_path / path.name, parameters=parameters, kernel_name="python3",
                         cwd=str(path.parent), execution_timeout=300, progress_bar=False,
                         start_timeout=300)  # a kernel on a machine loaded ~10 on 2 cores took over the default 60 s
    executed = json.loads((tmp_path / path.name).read_text())
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    differ = checked_cells_differ(notebook, executed)
    assert not differ, (f"{path.name}: a cell tagged nbval-check-output printed other than the committed notebook "
                        f"(at CI parameters {parameters}, AVX2 kernels). If the change is meant, re-execute it "
                        f"(tools/execute_notebooks.py); if the cell prints a parameter that ci_parameters shrinks, "
                        f"shrink another; if it depends on the CPU, print it rounded or leave it unchecked.\n"
                        + "\n".join(differ))
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
