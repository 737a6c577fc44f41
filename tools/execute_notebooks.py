"""Execute course notebooks in place with their default parameters, for committing.

    python tools/execute_notebooks.py notebooks/01_gradient_sync.ipynb   # one
    python tools/execute_notebooks.py                                     # all

A learner must never lose work, so a notebook whose file differs from the
last git commit is only overwritten with --force (a course author who just
edited it on purpose); so is one whose state git cannot tell (not in a git
checkout, git missing). The run goes to a temporary file in the notebook's
own folder first; the original is replaced only when execution succeeded, by
an atomic rename on the same filesystem. README's figures are images out of
executed notebooks (tools/export_figures.py): after a run that re-executed one of
their notebooks, they are exported again, so README never shows an old run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("notebooks", "exercises", "solutions")


def all_notebooks() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).glob("*.ipynb"))]


def edited_since_commit(path: Path) -> bool | None:
    """True if git shows uncommitted edits (or the file was never committed), False if it is clean,
    None if git cannot tell (not a git checkout, git missing or failing): then nothing is overwritten."""
    try:
        result = subprocess.run(["git", "status", "--porcelain", "--", path.name], cwd=path.parent,
                                capture_output=True, text=True)
    except OSError:
        return None
    if result.returncode != 0:
        return None
    return bool(result.stdout.strip())


def execute(path: Path, timeout: int = 600, cwd: Path | None = None) -> None:
    from coursekit.run_notebook import execute_notebook

    # In the notebook's own folder, so the final rename never crosses filesystems (EXDEV) and is atomic.
    handle, temporary = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".ipynb", dir=path.parent)
    os.close(handle)
    try:
        execute_notebook(path, temporary, kernel_name="python3", cwd=str(cwd or path.parent),
                         execution_timeout=timeout, progress_bar=False)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--force", action="store_true", help="overwrite notebooks with uncommitted edits")
    options = parser.parse_args(argv)
    paths = [p.resolve() for p in options.paths] or all_notebooks()
    refused, executed = 0, []
    for path in paths:
        edited = edited_since_commit(path)
        if edited is not False and not options.force:
            why = "it has uncommitted edits" if edited else "git cannot tell whether it has uncommitted edits"
            print(f"skip {path}: {why} (use --force to overwrite it)")
            refused += 1
            continue
        print(f"executing {path} ...", flush=True)
        execute(path)
        executed.append(path)
    export_readme_figures(executed)
    return 1 if refused else 0


def export_readme_figures(executed: list[Path]) -> None:
    """Export README's figures again when a notebook they come from was just executed."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import export_figures

    sources = {(ROOT / figure.notebook).resolve() for figure in export_figures.FIGURES}
    if sources & {path.resolve() for path in executed}:
        for written in export_figures.export(ROOT):
            print(f"exported {written.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
