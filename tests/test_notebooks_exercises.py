"""The exercises (exercises/) executed with papermill at CI parameters, and committed executed (tests/notebook_support.py)."""

import pytest
from notebook_support import executes, is_committed_executed, notebook_id, notebooks

NOTEBOOKS = notebooks("exercises")


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=notebook_id)
def test_notebook_executes(path, tmp_path):
    executes(path, tmp_path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=notebook_id)
def test_notebook_is_committed_executed(path):
    is_committed_executed(path)
