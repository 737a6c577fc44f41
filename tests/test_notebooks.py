"""The chapters 00-05 (notebooks/) executed with papermill at CI parameters, and committed executed
(tests/notebook_support.py); 06-10 are tests/test_notebooks_later.py: one file of eleven queued them on one worker
(1,191 s of a 2,094 s make test at load 15), the longest chain of the run."""

import pytest
from notebook_support import executes, is_committed_executed, notebook_id, notebooks

NOTEBOOKS = notebooks("notebooks")[:6]


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS][:1] == ["00_welcome.ipynb"] and NOTEBOOKS[-1].name.startswith("05_")
    assert notebooks("exercises") and len(notebooks("solutions")) == len(notebooks("exercises"))


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=notebook_id)
def test_notebook_executes(path, tmp_path):
    executes(path, tmp_path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=notebook_id)
def test_notebook_is_committed_executed(path):
    is_committed_executed(path)
