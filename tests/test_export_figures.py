"""tools/export_figures.py: a README figure is found by its marker line and image number, or the script says why not;
``--check`` names every committed PNG that is edited, missing or exported by no figure."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import export_figures  # noqa: E402


def test_check_names_an_edited_a_missing_and_an_unknown_png(tmp_path):
    figures = tmp_path / "figures"
    export_figures.export(ROOT, figures)
    assert export_figures.differences(ROOT, figures) == []
    first, second = export_figures.FIGURES[:2]
    (figures / first.name).write_bytes((figures / first.name).read_bytes() + b"\0")
    (figures / second.name).unlink()
    (figures / "old.png").write_bytes(b"")
    assert export_figures.differences(ROOT, figures) == [
        f"{figures / first.name}: differs from the figure its notebook holds now",
        f"{figures / second.name}: missing",
        f"{figures / 'old.png'}: no notebook figure exports it (not in FIGURES)"]


def notebook_with(*cells: tuple[str, int]) -> dict:
    """A parsed notebook of code cells, each ``(source, number of PNG outputs)``; PNG i holds the byte i."""
    return {"cells": [{"cell_type": "code", "source": source,
                       "outputs": [{"output_type": "display_data",
                                    "data": {"image/png": base64.b64encode(bytes([i])).decode()}}
                                   for i in range(images)]} for source, images in cells]}


def test_a_figure_is_found_by_its_marker_line_and_image_number():
    figure = export_figures.Figure("x.png", "notebooks/x.ipynb", "draw(4)", image=1)
    assert export_figures.find_figure(notebook_with(("a = 1\ndraw(4)", 2), ("draw(40)", 3)), figure) == b"\x01"
    with pytest.raises(export_figures.FigureNotFound, match="in 0 code cells"):
        export_figures.find_figure(notebook_with(("draw(40)", 2)), figure)
    with pytest.raises(export_figures.FigureNotFound, match="in 2 code cells"):
        export_figures.find_figure(notebook_with(("draw(4)", 2), ("  draw(4)", 2)), figure)
    with pytest.raises(export_figures.FigureNotFound, match="holds 1 image"):
        export_figures.find_figure(notebook_with(("draw(4)", 1)), figure)


def test_a_figure_not_found_exits_2_and_says_which(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(export_figures, "FIGURES", (export_figures.Figure("x.png", "notebooks/00_welcome.ipynb",
                                                                          "no_such_call()"),))
    assert export_figures.main(["--check"]) == 2
    assert "notebooks/00_welcome.ipynb: marker 'no_such_call()' is in 0 code cells" in capsys.readouterr().err
