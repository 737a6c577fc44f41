import signal

import matplotlib
import pytest
import torch

# Figures drawn by the library in this process stay off screen. (Not MPLBACKEND:
# the kernels papermill starts inherit the environment, and would lose inline figures.)
matplotlib.use("agg")

# One thread in each test process, as every rank has. make test runs three workers on two cores: a worker's
# second intra-op thread then waits for a core another worker holds, and a matmul's caller spins until it comes
# back (the copy-task test took 83-90 s under make test and 8 s alone; with one thread its work is the same).
torch.set_num_threads(1)


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



@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the test item (``item.report_call`` ...), for fixtures that keep evidence of a failure."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report
