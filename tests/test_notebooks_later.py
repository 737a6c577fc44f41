"""The chapters 06-10 (notebooks/) executed with papermill at CI parameters, and committed executed: the other half
of tests/test_notebooks.py, in a file of its own so that make test's workers run the two halves side by side."""

import pytest
from notebook_support import executes, is_committed_executed, notebook_id, notebooks

NOTEBOOKS = notebooks("notebooks")[6:]


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=notebook_id)
def test_notebook_executes(path, tmp_path):
    executes(path, tmp_path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=notebook_id)
def test_notebook_is_committed_executed(path):
    is_committed_executed(path)
