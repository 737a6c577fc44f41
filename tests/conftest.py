import signal

import matplotlib
import pytest

# Figures drawn by the library in this process stay off screen. (Not MPLBACKEND:
# the kernels papermill starts inherit the environment, and would lose inline figures.)
matplotlib.use("agg")


@pytest.fixture
def ctrl_c_as_in_a_terminal():
    """Ctrl-C raises KeyboardInterrupt in this test, as in a terminal or a notebook, whatever started pytest.

    A non-interactive shell starts background jobs (``make test &``, ``nohup``) with SIGINT *ignored*, and
    every process inherits that: a test that sends itself SIGINT would then see nothing happen. Tests that
    send SIGINT use this fixture; the previous disposition is restored after the test.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# Notebooks whose papermill run is a work unit of its own (see below); every other test stays with its file.
SPREAD = {"test_notebooks.py"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """How ``make test``'s workers share the suite (``--dist loadgroup``): a file's tests stay on one worker, in
    order -- module fixtures are built once, a notebook's nbval cells run in one kernel, the browser suite shares
    one JupyterLab -- except the papermill runs of tests/test_notebooks.py: each notebook is a unit of its own,
    so the nineteen runs (~7 minutes in all) spread over the workers instead of queueing on one.
    (Runs before xdist's own hook, which reads these marks.)"""
    for item in items:
        name = item.path.name
        callspec = getattr(item, "callspec", None)
        if name in SPREAD and callspec is not None:
            group = f"{name}:{callspec.id}"
        else:
            group = str(item.path)
        item.add_marker(pytest.mark.xdist_group(group))
