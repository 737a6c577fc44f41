"""The committed outputs are checked by the papermill run itself (tests/notebook_support.py): each cell tagged
``nbval-check-output`` must print what the committed notebook shows, compared as nbval compares, under AVX2 kernels.

Planted bugs, seen failing:
- ``checked_cells_differ`` returning ``[]``: test_a_changed_output_fails_naming_the_cell and
  test_a_checked_cell_that_prints_otherwise_fails_the_run fail;
- the sanitizer patterns not applied (``_sanitized`` returning its input): test_what_nbval_ignores_is_ignored fails
  on "12.3 ms";
- the ``with other_dispatch()`` around papermill removed: test_the_run_uses_avx2_kernels fails ("AVX512" printed);
- chapter 05's ci_parameters shrinking STEPS again (2 against 3): test_notebooks.py's 05 fails naming cells 16 and
  20 ("degree 1: 3 SGD steps" against "2 SGD steps").
"""

import json
import zlib
import platform

import pytest
import torch
from notebook_support import checked_cells_differ, executes


def cell(source, outputs, checked=True, tags=()):
    tags = list(tags) + (["nbval-check-output"] if checked else [])
    return {"id": f"c{zlib.crc32(source.encode())}", "cell_type": "code", "source": source, "metadata": {"tags": tags}, "outputs": outputs,
            "execution_count": 1}


def stream(text, name="stdout"):
    return {"output_type": "stream", "name": name, "text": text}


def notebook(*cells):
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_a_changed_output_fails_naming_the_cell():
    committed = notebook(cell("x = 1", [], checked=False), cell("print(loss)", [stream("loss 0.500\n")]))
    run = notebook(cell("x = 1", []), cell("print(loss)", [stream("loss 0.625\n")]))
    problems = checked_cells_differ(committed, run)
    assert len(problems) == 1 and problems[0].startswith("cell 1 (`print(loss)`)"), problems
    assert "-loss 0.500" in problems[0] and "+loss 0.625" in problems[0], problems


def test_what_nbval_ignores_is_ignored():
    """Timings and addresses (tests/nbval_sanitize.cfg), figures, execution counts, a stream split in two, and
    cells not tagged: none of them is compared."""
    committed = notebook(
        cell("t", [stream("step 12.3 ms at 0x7f00aa\n")]),
        cell("fig", [{"output_type": "display_data", "metadata": {},
                      "data": {"image/png": "AAAA", "text/plain": "<Figure size 640x480 with 1 Axes>"}}]),
        cell("split", [stream("a\nb\n")]),
        cell("free", [stream("anything\n")], checked=False))
    run = notebook(
        cell("t", [stream("step 14.07 ms at 0x55bb01\n")]),
        cell("fig", [{"output_type": "display_data", "metadata": {},
                      "data": {"image/png": "BBBB", "text/plain": "<Figure size 640x480 with 1 Axes>"}}]),
        cell("split", [stream("a\n"), stream("b\n")]),
        cell("free", [stream("something else\n")], checked=False))
    assert checked_cells_differ(committed, run) == []


def test_papermills_injected_cell_is_not_a_cell_of_the_notebook():
    committed = notebook(cell("N = 4", [], checked=False, tags=["parameters"]), cell("print(2)", [stream("2\n")]))
    run = notebook(cell("N = 4", [], checked=False, tags=["parameters"]),
                   cell("N = 2", [], checked=False, tags=["injected-parameters"]), cell("print(2)", [stream("2\n")]))
    assert checked_cells_differ(committed, run) == []
    run["cells"][2]["outputs"] = [stream("3\n")]
    assert checked_cells_differ(committed, run), "the cell after the injected one was compared with another"


def write_notebook(path, printed_source, committed_text):
    path.parent.mkdir()
    path.write_text(json.dumps(notebook(
        cell("N = 1", [], checked=False, tags=["parameters"]),
        cell(printed_source, [stream(committed_text)]))))


def test_a_checked_cell_that_prints_otherwise_fails_the_run(tmp_path):
    path = tmp_path / "committed" / "demo.ipynb"
    write_notebook(path, "print(N + 1)", "3\n")
    with pytest.raises(AssertionError, match=r"(?s)demo.ipynb: a cell tagged nbval-check-output.*-3.*\+2"):
        executes(path, tmp_path)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the dispatch names are x86's")
def test_the_run_uses_avx2_kernels(tmp_path, monkeypatch):
    """The kernel papermill starts runs PyTorch's AVX2 kernels, as nbval's do (the root conftest.py), so an output
    that depends on the CPU's kernels fails on the machine that made it."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip(f"this CPU's PyTorch dispatch is {torch.backends.cpu.get_cpu_capability()}: no AVX2 to choose")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    path = tmp_path / "committed" / "dispatch.ipynb"
    write_notebook(path, "import torch\nprint(torch.backends.cpu.get_cpu_capability())", "AVX2\n")
    executes(path, tmp_path)
