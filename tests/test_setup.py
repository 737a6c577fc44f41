"""The set-up files agree with each other, and the README gives the two commands first."""

import re
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _normalise(spec: str) -> str:
    return re.sub(r"\s+", "", spec).lower()


def test_environment_yml_names_the_same_dependencies_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_normalise(s) for s in project["dependencies"] + project["optional-dependencies"]["test"]}
    lines = (ROOT / "environment.yml").read_text().splitlines()
    pip_section = lines[lines.index("  - pip:") + 1:]
    listed = {_normalise(l.strip()[2:]) for l in pip_section if l.strip().startswith("- ")}
    listed.discard("-e.")
    assert listed == wanted, f"only in environment.yml: {listed - wanted}; only in pyproject.toml: {wanted - listed}"
    assert any(l.strip() == "- -e ." for l in pip_section), "environment.yml must install this package"
    assert "  - conda-forge" in lines


def test_readme_starts_with_the_two_commands():
    head = (ROOT / "README.md").read_text().splitlines()[:8]
    assert any(l.startswith("make lab") for l in head) and any(l.startswith("make test") for l in head)


def test_ci_runs_exactly_make_test():
    commands = [l for l in (ROOT / ".ci" / "run").read_text().splitlines() if l and not l.startswith("#")]
    assert commands[-1] == "make test"


def test_torch_is_pinned_for_install_but_a_range_for_the_package():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^TORCH\s+\?=\s+torch==2\.13\.0$", makefile, re.M)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_spec = [d for d in project["dependencies"] if d.startswith("torch")][0]
    assert "==" not in torch_spec and "<" in torch_spec
