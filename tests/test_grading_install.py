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
"""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
    env = dict(os.environ, MPLBACKEND="agg", PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("PYTHONPATH", None)
    notebook = tmp_path / "04_pipeline_schedule.ipynb"  # graded outside the repository: the installed package runs
    shutil.copy(ROOT / "solutions" / "04_pipeline_schedule.ipynb", notebook)
    done = subprocess.run([str(venv / "bin" / "coursekit"), "grade", str(notebook)], capture_output=True, text=True,
                          timeout=900, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "04_pipeline_schedule: 10 / 10 points" in done.stdout, done.stdout
    assert "IPKernelApp" not in done.stdout + done.stderr, done.stdout + done.stderr  # not for a learner's eyes
    where = _run([str(venv / "bin" / "python"), "-c", "import coursekit; print(coursekit.__file__)"], cwd=tmp_path,
                 env=env).stdout
    assert str(venv) in where, f"graded with {where}, not the installed package"
