"""The chapters (notebooks/) executed with papermill at CI parameters, and committed executed (tests/notebook_support.py)."""

import pytest
from notebook_support import executes, is_committed_executed, notebook_id, notebooks

NOTEBOOKS = notebooks("notebooks")


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS][:1] == ["00_welcome.ipynb"]
    assert notebooks("exercises") and len(notebooks("solutions")) == len(notebooks("exercises"))


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=notebook_id)
def test_notebook_executes(path, tmp_path):
    executes(path, tmp_path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=notebook_id)
def test_notebook_is_committed_executed(path):
    is_committed_executed(path)
