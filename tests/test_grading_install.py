"""`coursekit grade` works as a learner installs the course: the package without its test extra, in a fresh venv.

Planted bug (seen, issue 9): papermill only in the `test` extra -> the solution scores 0/12 with "the notebook
stopped with an error before the end: No module named 'papermill'". Seen again after the change below, and
again (0/10, the same sentence) after the notebook graded became exercise 04's solution: its grading launches real
ranks too (equals_one_process trains on them), in half the time of exercise 01's (107 s -> 50 s for this test).

The fresh venv holds the package (built and installed from a copy of its sources, so nothing is built inside
the working tree) and exactly what its `dependencies` need: their closure, read from pyproject.toml and each
dependency's own metadata, is lent from the course venv through a .pth file instead of being unpacked again
(that took 96 s, most of it torch). Anything only the `test` extra brings is absent. That pip *can* install
those dependencies is what `make test`'s own install shows.

It grades with README's command as written (``make grade NB=...``), from a checkout whose ``.venv`` is that venv,
with no ``coursekit`` on PATH (issue 58). Planted, seen failing: README's command back to ``coursekit grade ...``
-> StopIteration (no `make grade` span); the Makefile's target calling ``coursekit`` rather than
``$(VENV)/bin/coursekit`` -> "coursekit: not found" (make exit 2, 127 from the shell).
"""

import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from readme_support import code_spans, text

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"  # the Makefile's pin (tests/test_setup.py checks it there)


def _lend_dependencies(venv: Path) -> set[str]:
    """Make the closure of the package's runtime dependencies (this interpreter's copies) importable in ``venv``."""
    import tomllib

    from packaging.requirements import Requirement

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lent = venv / "lent"
    lent.mkdir()
    seen, todo = set(), [Requirement(r).name for r in declared]
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen or name in ("setuptools", "pip"):  # the venv has its own
            continue
        seen.add(name)
        dist = importlib.metadata.distribution(name)
        for requirement in map(Requirement, dist.requires or []):
            if not requirement.marker or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
        for top in {f.parts[0] for f in dist.files or []}:
            if top not in ("..", "__pycache__") and not top.endswith(".pth") and not (lent / top).exists():
                (lent / top).symlink_to(Path(dist.locate_file(top)))
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "lent.pth").write_text(str(lent) + "\n")
    return seen


def _run(command, **options):
    done = subprocess.run(command, capture_output=True, text=True, **options)
    assert done.returncode == 0, f"{' '.join(map(str, command))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_grade_works_after_installing_the_package_without_extras(tmp_path):
    command = next(span for span in code_spans(text(ROOT / "README.md")) if span.startswith("make grade NB="))
    source = tmp_path / "src"
    shutil.copytree(ROOT / "coursekit", source / "coursekit", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    venv = tmp_path / "venv"
    _run([shutil.which("python3") or sys.executable, "-m", "venv", str(venv)], timeout=300)
    lent = _lend_dependencies(venv)
    assert "torch" in lent and not {"pytest", "nbval", "playwright"} & lent, f"lent: {sorted(lent)}"
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    constraints = tmp_path / "torch-pin.txt"
    constraints.write_text(TORCH + "\n")
    # pip checks the lent dependencies against the package's requirements (and torch against the pin).
    _run(pip + ["-c", str(constraints), str(source)], timeout=900)
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert (site / "coursekit").is_dir(), "the package was not installed into the venv"
    # README's command as written, `make grade NB=...`, in a checkout whose `make install` made .venv (here the
    # fresh venv, its install marked done), with nothing of it on PATH: a learner's shell that never activated it
    # (issue 58: README's `coursekit grade ...` said "coursekit: not on PATH" there).
    clone = tmp_path / "clone"
    (clone / "exercises").mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, clone / name)
    (clone / ".venv").symlink_to(venv)
    (venv / ".installed").touch()  # what `make install` leaves: pyproject.toml is older, so make installs nothing
    # the notebook graded: exercise 04's solution (full marks, its stretch's bonus too, 50 s) in README's command, not 01's
    notebook = "exercises/04_pipeline_schedule.ipynb"
    shutil.copy(ROOT / "solutions" / "04_pipeline_schedule.ipynb", clone / notebook)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not (Path(p) / "coursekit").exists())
    env = dict(os.environ, MPLBACKEND="agg", PATH=path)
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    words = shlex.split(command)
    words = [f"NB={notebook}" if w.startswith("NB=") else w for w in words]
    done = subprocess.run(words, capture_output=True, text=True, timeout=900, cwd=clone, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "04_pipeline_schedule: 14 / 10 points\nbonus 4/4\n" in done.stdout, done.stdout  # the stretch's bonus too
    assert "IPKernelApp" not in done.stdout + done.stderr, done.stdout + done.stderr  # not for a learner's eyes
    where = _run([str(venv / "bin" / "python"), "-c", "import coursekit; print(coursekit.__file__)"], cwd=tmp_path,
                 env=env).stdout
    assert str(venv) in where, f"graded with {where}, not the installed package"
