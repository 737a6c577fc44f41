import pytest
import matplotlib

# Figures drawn by the library in this process stay off screen. (Not MPLBACKEND:
# the kernels papermill starts inherit the environment, and would lose inline figures.)
matplotlib.use("agg")


# Test files whose tests are independent and long: pytest-xdist may spread them over its workers.
SPREAD = {"test_notebooks.py", "test_grading_submissions.py"}


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist's ``--dist loadgroup`` (the Makefile's), keep each test file on one worker, so its
    module fixtures are built once (a notebook's nbval cells run in order in one kernel; the browser suite shares
    one JupyterLab and one Chromium); only the files in SPREAD are shared out test by test."""
    for item in items:
        if item.path.name not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(f"{item.path.parent.name}/{item.path.name}"))
