"""Execute course notebooks in place with their default parameters, for committing.

    python tools/execute_notebooks.py notebooks/01_gradient_sync.ipynb   # one
    python tools/execute_notebooks.py                                     # all

A learner must never lose work, so a notebook whose file differs from the
last git commit is only overwritten with --force (a course author who just
edited it on purpose). The run goes to a temporary file first; the original
is replaced only when execution succeeded.
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


def edited_since_commit(path: Path) -> bool:
    result = subprocess.run(["git", "status", "--porcelain", "--", str(path)], cwd=ROOT,
                            capture_output=True, text=True)
    return bool(result.stdout.strip())


def execute(path: Path, timeout: int = 600, cwd: Path | None = None) -> None:
    import papermill

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / path.name
        papermill.execute_notebook(str(path), str(out), kernel_name="python3", cwd=str(cwd or path.parent),
                                   execution_timeout=timeout, progress_bar=False)
        out.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--force", action="store_true", help="overwrite notebooks with uncommitted edits")
    options = parser.parse_args(argv)
    paths = [p.resolve() for p in options.paths] or all_notebooks()
    for path in paths:
        if edited_since_commit(path) and not options.force:
            print(f"skip {path.relative_to(ROOT)}: it has uncommitted edits (use --force to overwrite them)")
            continue
        print(f"executing {path.relative_to(ROOT)} ...", flush=True)
        execute(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
