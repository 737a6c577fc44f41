"""`coursekit grade` works as a learner installs the course: the package without its test extra, in a fresh venv.

Planted bug (seen, issue 9): papermill only in the `test` extra -> the solution scores 0/12 with "the notebook
stopped with an error before the end: No module named 'papermill'". The package is installed from a copy
of its sources (so nothing is built inside the working tree), torch pinned as `make lab` pins it.

Torch is lent, not reinstalled: unpacking its 750 MB again took most of this test's 96 s. The fresh venv
sees the course venv's torch and torch's own dependencies (nothing else) through a .pth file, as if the
learner had installed torch first; pip then installs every other dependency from the package's metadata.
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


def _lend_torch(venv: Path) -> None:
    """Make this interpreter's torch and its requirements (closure) importable in ``venv``, and only them."""
    from packaging.requirements import Requirement

    lent = venv / "lent-torch"
    lent.mkdir()
    seen, todo = set(), ["torch"]
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
            source = Path(dist.locate_file(top))
            if top not in ("..", "__pycache__") and not top.endswith(".pth") and not (lent / top).exists():
                (lent / top).symlink_to(source)
    assert (lent / "torch").exists() and seen >= {"torch", "sympy"}, sorted(seen)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "lent_torch.pth").write_text(str(lent) + "\n")


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
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _lend_torch(venv)
    version = _run([str(venv / "bin" / "python"), "-m", "pip", "show", "torch"]).stdout
    assert "Version: 2.13.0" in version, version  # pip counts the lent torch as installed: TORCH is met
    constraints = tmp_path / "torch-pin.txt"
    constraints.write_text(TORCH + "\n")
    _run(pip + ["-c", str(constraints), str(source)], timeout=900)
    env = dict(os.environ, MPLBACKEND="agg", PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("PYTHONPATH", None)
    notebook = tmp_path / "01_ring_allreduce.ipynb"  # graded outside the repository: the installed package runs
    shutil.copy(ROOT / "solutions" / "01_ring_allreduce.ipynb", notebook)
    done = subprocess.run([str(venv / "bin" / "coursekit"), "grade", str(notebook)], capture_output=True, text=True,
                          timeout=900, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "01_ring_allreduce: 12 / 12 points" in done.stdout, done.stdout
    where = _run([str(venv / "bin" / "python"), "-c", "import coursekit; print(coursekit.__file__)"], cwd=tmp_path,
                 env=env).stdout
    assert str(venv) in where, f"graded with {where}, not the installed package"
