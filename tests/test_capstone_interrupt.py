"""Ctrl-C stops ``coursekit train`` at once, with one line of ours: under torchrun and on its own.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group: the torchrun agent and every rank (or
``coursekit train`` and the ranks it launched). The tests send it the same way, once rank 0 has printed a step.

Before (measured beside the test suite, 2 ranks): under torchrun each rank printed a KeyboardInterrupt traceback
(65-165 lines in all), and a rank blocked in C++ -- waiting for its peer in ``init_process_group`` -- never ran
Python's handler, so torchrun waited its 30 s and killed it (31.9 s to exit). On its own, ``coursekit train``
ended with the launcher's KeyboardInterrupt traceback.

Planted, seen failing:
* ``_leave_on_signal`` not called -> "a rank printed a traceback: [rank0]: Traceback (most recent call last): ..."
* the ``except KeyboardInterrupt`` around ``launch`` removed -> "exit -2 ... Traceback (most recent call last)".
What torchrun's agent prints of itself (its warnings and its SignalException traceback) is torch's, not ours:
these tests read only the ranks' lines (``[rankN]:`` and ours).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from test_capstone import TORCHRUN

TRAIN = ["-m", "coursekit.capstone", "--dp", "2", "--steps", "100000", "--batch", "8"]  # runs until stopped
STOPPED = "coursekit train: stopped by SIGINT"


def _interrupt(args: list[str]) -> tuple[int, float, str]:
    """Start ``args``, wait for rank 0's first step, Ctrl-C the whole group; (exit status, seconds to exit, stderr)."""
    job = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal has it
    try:
        deadline = time.monotonic() + 120
        line = ""
        while "step" not in line and time.monotonic() < deadline and job.poll() is None:
            line = job.stdout.readline()
        assert "step" in line, f"training never printed a step: {job.stderr.read()[-2000:] if job.poll() else ''}"
        os.killpg(job.pid, signal.SIGINT)
        sent = time.monotonic()
        try:
            _, err = job.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            return -999, time.monotonic() - sent, "still running 30 s after SIGINT"
        return job.returncode, time.monotonic() - sent, err
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait()


def _ours(err: str) -> list[str]:
    """The ranks' lines and ours: torchrun prefixes a rank's stderr with ``[rankN]:``; the agent's own lines
    (its ``W1207 ...`` warnings, its traceback, its banner) are torch's."""
    return [line for line in err.splitlines() if line.startswith(("[rank", "coursekit"))]


def test_ctrl_c_under_torchrun_one_line_and_out_within_5_s():
    rc, seconds, err = _interrupt(TORCHRUN + ["--standalone", "--nproc-per-node", "2", *TRAIN])
    assert rc != -999, err
    ours = _ours(err)
    assert not any("Traceback" in line for line in ours), f"a rank printed a traceback: {' | '.join(ours)[:1500]}"
    assert ours == [STOPPED], f"expected rank 0's one line, got {ours}"
    assert seconds < 5, f"torchrun took {seconds:.1f} s to exit after SIGINT:\n{err[-2000:]}"


def test_ctrl_c_on_its_own_one_line_exit_130():
    rc, seconds, err = _interrupt([sys.executable, *TRAIN])
    assert (rc, err.strip()) == (130, STOPPED), f"exit {rc}:\n{err[-3000:]}"
    assert not re.search(r'File ".*coursekit/', err)
    assert seconds < 5, f"took {seconds:.1f} s to exit after SIGINT"
