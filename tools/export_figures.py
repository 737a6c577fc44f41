"""Export README's figures from the executed notebooks' own outputs into ``docs/figures/``.

    python tools/export_figures.py           # (re)write docs/figures/*.png from the committed notebooks
    python tools/export_figures.py --check   # exit 1 if a committed PNG is not what its notebook holds now

README shows three figures. They are not drawn again here: each is the PNG a committed, executed
notebook already holds, copied byte for byte, so README can never show a figure that no notebook
draws, nor an old one after the notebook was re-executed (``--check``, run by ``tests/test_readme.py``,
fails until this script is run again).

A figure is found by a *marker*: a line of code that appears in exactly one code cell of its notebook,
and the position of the image among that cell's outputs. Cell ids cannot name a cell: they are made
anew each time ``tools/build_notebook.py`` builds a notebook. The marker is the cell's own source, which
changes only when an author changes what the cell draws. When a marker matches no cell or several, or
the cell holds too few images, the script says which and exits 2: it never guesses.

Exit status: 0 all figures equal (or written), 1 a committed PNG differs or is missing, 2 a figure was
not found in its notebook.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES_DIR = Path("docs") / "figures"


@dataclass(frozen=True)
class Figure:
    """One README figure: the file it becomes, and where it is found."""

    name: str        # file name in docs/figures/
    notebook: str    # the executed notebook, relative to the repository root
    marker: str      # a line of code found in exactly one code cell of that notebook
    image: int = 0   # which of that cell's image outputs, counted from 0


FIGURES = (
    # Chapter 00: the four strategies side by side, drawn from the plan of who holds what (P6).
    Figure("strategies.png", "notebooks/00_welcome.ipynb", "draw_strategies(n_gpus=4);"),
    # Chapter 04: 1F1B on a unit-time clock above the same schedule measured on 2 real ranks. The cell draws
    # one figure per entry of `configs`: gpipe, 1f1b, interleaved, zb_h1 (chapter 04, section 2).
    Figure("pipeline_1f1b.png", "notebooks/04_pipeline_parallelism.ipynb",
           "fig = draw_plan_and_measured(plan(make_schedule(name, RUN_RANKS, TIMELINE_M, v)), spans,", image=1),
    # Chapter 01: the network model's all-reduce times up to 1,024 GPUs, and at 1,024 GPUs by message size.
    Figure("allreduce_1024_gpus.png", "notebooks/01_gradient_sync.ipynb",
           "_ = draw_explorer(4 << 20, 1024, network(400, 10, 8))"),
)


class FigureNotFound(LookupError):
    """A figure's marker or image is not where :data:`FIGURES` says."""


def images_of(cell: dict) -> list[bytes]:
    """The PNGs among a code cell's outputs, decoded, in output order."""
    found = []
    for output in cell.get("outputs", []):
        data = output.get("data", {}).get("image/png")
        if data is not None:
            found.append(base64.b64decode("".join(data) if isinstance(data, list) else data))
    return found


def find_figure(notebook: dict, figure: Figure) -> bytes:
    """The PNG ``figure`` names in ``notebook`` (a parsed ``.ipynb``); :class:`FigureNotFound` says what is wrong."""
    cells = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"
             and any(line.strip() == figure.marker.strip() for line in "".join(cell["source"]).splitlines())]
    where = f"{figure.notebook}: marker {figure.marker!r}"
    if len(cells) != 1:
        raise FigureNotFound(f"{where} is in {len(cells)} code cells, not exactly one: "
                             f"change the marker in tools/export_figures.py for {figure.name}")
    images = images_of(cells[0])
    if figure.image >= len(images):
        raise FigureNotFound(f"{where}: its cell holds {len(images)} image(s), {figure.name} is image "
                             f"{figure.image} (is the notebook executed? tools/execute_notebooks.py)")
    return images[figure.image]


def expected(root: Path = ROOT) -> dict[str, bytes]:
    """Every README figure's bytes as the notebooks under ``root`` hold them now, by file name."""
    return {f.name: find_figure(json.loads((root / f.notebook).read_text()), f) for f in FIGURES}


def differences(root: Path = ROOT, figures_dir: Path | None = None) -> list[str]:
    """One sentence per committed PNG that is missing, differs from its notebook's, or is exported by no figure."""
    figures_dir = figures_dir if figures_dir is not None else root / FIGURES_DIR
    problems = []
    for name, png in expected(root).items():
        path = figures_dir / name
        if not path.exists():
            problems.append(f"{path}: missing")
        elif path.read_bytes() != png:
            problems.append(f"{path}: differs from the figure its notebook holds now")
    known = {f.name for f in FIGURES}
    problems += [f"{path}: no notebook figure exports it (not in FIGURES)"
                 for path in sorted(figures_dir.glob("*.png")) if path.name not in known]
    return problems


def export(root: Path = ROOT, figures_dir: Path | None = None) -> list[Path]:
    """Write every figure into ``figures_dir`` (default ``docs/figures/``); return the paths written."""
    figures_dir = figures_dir if figures_dir is not None else root / FIGURES_DIR
    figures_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, png in expected(root).items():
        (figures_dir / name).write_bytes(png)
        written.append(figures_dir / name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing; exit 1 on a difference")
    options = parser.parse_args(argv)
    try:
        if options.check:
            problems = differences()
            for problem in problems:
                print(problem, file=sys.stderr)
            if problems:
                print("README's figures are not the notebooks' figures: run  python tools/export_figures.py",
                      file=sys.stderr)
                return 1
            print(f"{len(FIGURES)} figures in {FIGURES_DIR}/ equal the notebooks' outputs")
            return 0
        for path in export():
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    except FigureNotFound as error:
        print(f"figure not found: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
